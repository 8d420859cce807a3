#include "vramscope/collector/batch_check.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/unknown_field_set.h>

#include <cstring>
#include <string>
#include <vector>

#include "vramscope/utf8.h"

namespace vramscope::collector {
namespace {

using ::google::protobuf::Descriptor;
using ::google::protobuf::FieldDescriptor;
using ::google::protobuf::Message;
using ::google::protobuf::Reflection;
using ::google::protobuf::UnknownField;
using ::google::protobuf::UnknownFieldSet;

// Deeper than the schema nests (EventBatch > Event > ProcessStartEvent > DeviceInfo).
constexpr int kMaxDepth = 16;

// `value` as it may appear in a message: escaped, cut to a readable length.
std::string Quoted(absl::string_view value) {
  std::string text = ToValidUtf8(std::string_view(value.data(), value.size()));
  if (text.size() > 80) {
    text.resize(ValidUtf8Prefix(std::string_view(text.data(), 77)));
    text += "...";
  }
  return absl::StrCat("\"", text, "\"");
}

std::string NotUtf8(const FieldDescriptor* field, const std::string& path,
                    absl::string_view value) {
  return absl::StrFormat("string field %s (%s) is not valid UTF-8: %s", field->full_name(), path,
                         Quoted(value));
}

std::string Indexed(const std::string& path, const FieldDescriptor* field, int index) {
  std::string out = path.empty() ? field->name() : absl::StrCat(path, ".", field->name());
  if (field->is_repeated()) absl::StrAppend(&out, "[", index, "]");
  return out;
}

// The first string field below `message` that is not UTF-8, by reflection; "" when none.
std::string FindBadString(const Message& message, const std::string& path, int depth) {
  if (depth > kMaxDepth) return "";
  const Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  std::string scratch;
  for (const FieldDescriptor* field : fields) {
    const int count = field->is_repeated() ? reflection->FieldSize(message, field) : 1;
    for (int i = 0; i < count; ++i) {
      if (field->type() == FieldDescriptor::TYPE_STRING) {
        const std::string& value =
            field->is_repeated()
                ? reflection->GetRepeatedStringReference(message, field, i, &scratch)
                : reflection->GetStringReference(message, field, &scratch);
        if (!IsValidUtf8(value)) return NotUtf8(field, Indexed(path, field, i), value);
      } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        const Message& child = field->is_repeated()
                                   ? reflection->GetRepeatedMessage(message, field, i)
                                   : reflection->GetMessage(message, field);
        std::string found = FindBadString(child, Indexed(path, field, i), depth + 1);
        if (!found.empty()) return found;
      }
    }
  }
  return "";
}

// The same over raw wire fields read against `descriptor`, for bytes protobuf refused to parse.
// Fields of a wire type the schema does not expect are skipped, as the parser keeps them as
// unknown fields. Sets *malformed when a nested message is not wire format at all.
std::string FindBadWireField(const UnknownFieldSet& fields, const Descriptor* descriptor,
                             const std::string& path, int depth, bool* malformed) {
  if (depth > kMaxDepth) return "";
  std::vector<int> seen(static_cast<size_t>(descriptor->field_count()), 0);
  for (int i = 0; i < fields.field_count(); ++i) {
    const UnknownField& raw = fields.field(i);
    const FieldDescriptor* field = descriptor->FindFieldByNumber(raw.number());
    if (field == nullptr || raw.type() != UnknownField::TYPE_LENGTH_DELIMITED) continue;
    const int index = seen[static_cast<size_t>(field->index())]++;
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      if (!IsValidUtf8(raw.length_delimited())) {
        return NotUtf8(field, Indexed(path, field, index), raw.length_delimited());
      }
    } else if (field->type() == FieldDescriptor::TYPE_MESSAGE) {
      UnknownFieldSet nested;
      if (!nested.ParseFromString(raw.length_delimited())) {
        *malformed = true;
        return absl::StrFormat("%s is not a %s", Indexed(path, field, index),
                               field->message_type()->full_name());
      }
      std::string found = FindBadWireField(nested, field->message_type(),
                                           Indexed(path, field, index), depth + 1, malformed);
      if (!found.empty()) return found;
    }
  }
  return "";
}

IngestMessage Malformed(absl::string_view wire, absl::string_view detail) {
  IngestMessage message;
  message.kind = IngestMessage::Kind::kMalformed;
  message.reason = absl::StrFormat(
      "malformed message on Ingest: %d bytes that are not a vramscope.v1.EventBatch%s; is the "
      "client a vramscope-agent of the same protocol version?",
      wire.size(), detail.empty() ? "" : absl::StrCat(" (", detail, ")"));
  return message;
}

// Wire format reading for the decoder below. Every function returns false where the bytes are
// anything but the plain case; the caller then leaves the decision to protobuf.
inline __attribute__((always_inline)) bool ReadVarint(const char*& p, const char* end,
                                                      std::uint64_t* value) {
  // Tags and most small fields are one byte.
  if (p != end && static_cast<signed char>(*p) >= 0) {
    *value = static_cast<unsigned char>(*p++);
    return true;
  }
  std::uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (p == end) return false;
    const auto byte = static_cast<unsigned char>(*p++);
    // A tenth byte above 1 would carry bits past 64: protobuf's call, not ours.
    if (shift == 63 && byte > 1) return false;
    v |= std::uint64_t{byte & 0x7Fu} << shift;
    if (byte < 0x80) {
      *value = v;
      return true;
    }
  }
  return false;
}

// The bytes of a length-delimited field, p at its length.
inline __attribute__((always_inline)) bool ReadBytes(const char*& p, const char* end,
                                                     const char** data, std::size_t* size) {
  std::uint64_t length = 0;
  if (!ReadVarint(p, end, &length) || length > static_cast<std::uint64_t>(end - p)) return false;
  *data = p;
  *size = static_cast<std::size_t>(length);
  p += length;
  return true;
}

// An AllocEvent (`alloc`) or FreeEvent's fields into `out`: only varint fields of the schema, a
// later occurrence winning as in protobuf; the enum and uint32 fields cut as protobuf's
// generated parser cuts them.
bool DecodeMemoryPayload(const char* p, const char* end, bool alloc, MemoryEvent* out) {
  while (p < end) {
    std::uint64_t tag = 0;
    std::uint64_t value = 0;
    if (!ReadVarint(p, end, &tag) || (tag & 7) != 0 || !ReadVarint(p, end, &value)) return false;
    switch (tag >> 3) {
      case 1:
        out->address = value;
        break;
      case 2:
        out->requested_bytes = value;
        break;
      case 3:
        out->allocated_bytes = value;
        break;
      case 4:
        out->kind = static_cast<v1::AllocationKind>(value);
        break;
      case 5:  // stream: not a figure
        break;
      case 6:
        if (!alloc) return false;
        out->nvtx_range = static_cast<std::uint32_t>(value);
        break;
      case 7:
        if (!alloc) return false;
        out->site = value;
        break;
      default:
        return false;
    }
  }
  return true;
}

// The field of one-byte tag `tag` (wire type 0), if it is next at p: its value into *value and
// true. Sets *bad when the tag is there but its value is not a varint that ends in time.
inline __attribute__((always_inline)) bool NextVarintField(const char*& p, const char* end,
                                                           char tag, std::uint64_t* value,
                                                           bool* bad) {
  if (p == end || *p != tag) return false;
  ++p;
  if (!ReadVarint(p, end, value)) *bad = true;
  return !*bad;
}

// The usual layout, fields in number order as protobuf writes them, without a dispatch per
// field; false (out partly filled) for anything else.
bool DecodeMemoryEventInOrder(const char* p, const char* end, MemoryEvent* out) {
  std::uint64_t value = 0;
  bool bad = false;
  if (NextVarintField(p, end, 0x08, &value, &bad)) out->time_ns = value;
  if (NextVarintField(p, end, 0x10, &value, &bad)) out->device = static_cast<std::uint32_t>(value);
  if (NextVarintField(p, end, 0x18, &value, &bad)) {
    out->thread_id = static_cast<std::uint32_t>(value);
  }
  if (bad || p == end || (*p != 0x52 && *p != 0x5A)) return false;  // 10 or 11, length-delimited
  out->alloc = *p++ == 0x52;
  const char* data = nullptr;
  std::size_t size = 0;
  if (!ReadBytes(p, end, &data, &size) || p != end) return false;
  const char* q = data;
  const char* const stop = data + size;
  if (NextVarintField(q, stop, 0x08, &value, &bad)) out->address = value;
  if (NextVarintField(q, stop, 0x10, &value, &bad)) out->requested_bytes = value;
  if (NextVarintField(q, stop, 0x18, &value, &bad)) out->allocated_bytes = value;
  if (NextVarintField(q, stop, 0x20, &value, &bad)) {
    out->kind = static_cast<v1::AllocationKind>(value);
  }
  NextVarintField(q, stop, 0x28, &value, &bad);  // stream: not a figure
  if (out->alloc) {
    if (NextVarintField(q, stop, 0x30, &value, &bad)) {
      out->nvtx_range = static_cast<std::uint32_t>(value);
    }
    if (NextVarintField(q, stop, 0x38, &value, &bad)) out->site = value;
  }
  return !bad && q == stop;
}

// One Event's bytes that hold an allocation or a free and nothing else protobuf would keep.
bool DecodeMemoryEvent(const char* p, const char* end, MemoryEvent* out) {
  if (DecodeMemoryEventInOrder(p, end, out)) return true;
  *out = MemoryEvent{};
  bool payload = false;
  while (p < end) {
    std::uint64_t tag = 0;
    if (!ReadVarint(p, end, &tag)) return false;
    const std::uint64_t field = tag >> 3;
    if (field == 10 || field == 11) {
      // A second payload merges or switches the oneof: protobuf's call.
      const char* data = nullptr;
      std::size_t size = 0;
      if (payload || (tag & 7) != 2 || !ReadBytes(p, end, &data, &size)) return false;
      payload = true;
      out->alloc = field == 10;
      if (!DecodeMemoryPayload(data, data + size, out->alloc, out)) return false;
      continue;
    }
    std::uint64_t value = 0;
    if ((tag & 7) != 0 || !ReadVarint(p, end, &value)) return false;
    switch (field) {
      case 1:
        out->time_ns = value;
        break;
      case 2:
        out->device = static_cast<std::uint32_t>(value);
        break;
      case 3:
        out->thread_id = static_cast<std::uint32_t>(value);
        break;
      default:
        return false;
    }
  }
  return payload;
}

// Stands for an event protobuf parses, until the parsed one's address is known.
const v1::Event* ParsedLater() { return &v1::Event::default_instance(); }

// Splits `wire` into the allocation and free events (decoded into scratch->events) and the rest
// (scratch->rest: every other field, events included, byte for byte, which protobuf then parses
// onto `arena` as it would the whole: merging a message's fields is the same whether they come
// in one buffer or are taken apart in order). nullptr where anything is out of the ordinary.
v1::EventBatch* DecodeBatch(absl::string_view wire, google::protobuf::Arena* arena,
                            IngestScratch* scratch) {
  // Kept for the next message up to what an agent's usual batches need (4,096 events); one
  // outsized message does not hold its memory for the rest of the stream.
  constexpr std::size_t kKeptEvents = 16384;
  constexpr std::size_t kKeptRestBytes = std::size_t{1} << 20;
  if (scratch->events.capacity() > kKeptEvents) std::vector<BatchEvent>().swap(scratch->events);
  if (scratch->rest.capacity() > kKeptRestBytes) std::string().swap(scratch->rest);
  scratch->events.clear();
  scratch->rest.clear();
  const char* p = wire.data();
  const char* const end = p + wire.size();
  int parsed_later = 0;
  while (p < end) {
    const char* const field_start = p;
    std::uint64_t tag = 0;
    if (!ReadVarint(p, end, &tag) || tag > UINT32_MAX) return nullptr;
    const char* data = nullptr;
    std::size_t size = 0;
    std::uint64_t value = 0;
    switch (tag & 7) {
      case 0:
        if (!ReadVarint(p, end, &value)) return nullptr;
        break;
      case 1:
      case 5: {
        const std::size_t fixed = (tag & 7) == 1 ? 8 : 4;
        if (static_cast<std::size_t>(end - p) < fixed) return nullptr;
        p += fixed;
        break;
      }
      case 2:
        if (!ReadBytes(p, end, &data, &size)) return nullptr;
        break;
      default:  // groups, and wire types that do not exist
        return nullptr;
    }
    if (tag == ((3 << 3) | 2)) {  // EventBatch.events
      BatchEvent& event = scratch->events.emplace_back();
      if (DecodeMemoryEvent(data, data + size, &event.memory)) continue;
      event.other = ParsedLater();
      ++parsed_later;
    }
    scratch->rest.append(field_start, static_cast<std::size_t>(p - field_start));
  }
  v1::EventBatch* batch = google::protobuf::Arena::CreateMessage<v1::EventBatch>(arena);
  if (!batch->ParseFromArray(scratch->rest.data(), static_cast<int>(scratch->rest.size())) ||
      batch->events_size() != parsed_later) {
    return nullptr;
  }
  int next = 0;
  for (BatchEvent& event : scratch->events) {
    if (event.other != nullptr) event.other = &batch->events(next++);
  }
  return batch;
}

}  // namespace

absl::Status ValidateProcessKey(const v1::ProcessKey& key) {
  if (key.pid() == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("process key %s/0/%d names pid 0, which no traced process has",
                        Quoted(key.host()), key.start_time_ns()));
  }
  if (!IsValidUtf8(key.host())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "process key host %s (pid %d) is not valid UTF-8", Quoted(key.host()), key.pid()));
  }
  if (key.host().size() > kMaxHostBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("process key host of %d bytes (pid %d) is longer than %d bytes: %s",
                        key.host().size(), key.pid(), kMaxHostBytes, Quoted(key.host())));
  }
  return absl::OkStatus();
}

absl::Status ValidateBatchHeader(const v1::EventBatch& batch) {
  if (!batch.has_process()) {
    return absl::InvalidArgumentError(
        "batch without a process key: EventBatch.process must name the process");
  }
  absl::Status key = ValidateProcessKey(batch.process());
  if (!key.ok()) return key;
  if (batch.sequence() == 0 && (batch.events_size() > 0 || batch.counters_size() > 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "batch with %d events has sequence 0; sequences start at 1 (0 is for probes only)",
        batch.events_size()));
  }
  return absl::OkStatus();
}

absl::Status ValidateBatch(const v1::EventBatch& batch) {
  absl::Status header = ValidateBatchHeader(batch);
  if (!header.ok()) return header;
  std::string bad = FindBadString(batch, "", 0);
  if (!bad.empty()) return absl::InvalidArgumentError(bad);
  return absl::OkStatus();
}

IngestMessage CheckIngestMessage(absl::string_view wire, google::protobuf::Arena* arena) {
  IngestMessage message;
  v1::EventBatch* batch = google::protobuf::Arena::CreateMessage<v1::EventBatch>(arena);
  if (batch->ParseFromArray(wire.data(), static_cast<int>(wire.size()))) {
    // The parser has checked every string field for UTF-8.
    absl::Status header = ValidateBatchHeader(*batch);
    if (header.ok()) {
      message.kind = IngestMessage::Kind::kBatch;
      message.batch = batch;
      return message;
    }
    message.kind = IngestMessage::Kind::kRejected;
    message.process = batch->process();
    message.key_usable = ValidateProcessKey(batch->process()).ok();
    message.sequence = batch->sequence();
    message.events = static_cast<uint64_t>(batch->events_size());
    message.reason = std::string(header.message());
    return message;
  }

  // Not parseable as an EventBatch: read it as raw fields to tell a batch with a bad field (refused
  // on its own) from bytes that are no batch at all.
  UnknownFieldSet fields;
  if (!fields.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) {
    return Malformed(wire, "");
  }
  bool have_key = false;
  std::string host;
  for (int i = 0; i < fields.field_count(); ++i) {
    const UnknownField& field = fields.field(i);
    if (field.number() == 1 && field.type() == UnknownField::TYPE_LENGTH_DELIMITED) {
      UnknownFieldSet key;
      if (!key.ParseFromString(field.length_delimited())) return Malformed(wire, "process key");
      have_key = true;
      for (int k = 0; k < key.field_count(); ++k) {
        const UnknownField& part = key.field(k);
        if (part.number() == 1 && part.type() == UnknownField::TYPE_LENGTH_DELIMITED) {
          host = part.length_delimited();
        } else if (part.number() == 2 && part.type() == UnknownField::TYPE_VARINT) {
          message.process.set_pid(static_cast<uint32_t>(part.varint()));
        } else if (part.number() == 3 && part.type() == UnknownField::TYPE_VARINT) {
          message.process.set_start_time_ns(part.varint());
        }
      }
    } else if (field.number() == 2 && field.type() == UnknownField::TYPE_VARINT) {
      message.sequence = field.varint();
    } else if (field.number() == 3 && field.type() == UnknownField::TYPE_LENGTH_DELIMITED) {
      ++message.events;
    }
  }
  bool malformed = false;
  std::string bad =
      FindBadWireField(fields, v1::EventBatch::descriptor(), "", /*depth=*/0, &malformed);
  if (malformed || bad.empty() || !have_key) {
    return Malformed(wire, bad);
  }
  message.process.set_host(ToValidUtf8(host));
  message.key_usable = IsValidUtf8(host) && ValidateProcessKey(message.process).ok();
  message.kind = IngestMessage::Kind::kRejected;
  message.reason = std::move(bad);
  return message;
}

}  // namespace vramscope::collector

namespace vramscope::collector {

IngestMessage CheckIngestMessage(absl::string_view wire, google::protobuf::Arena* arena,
                                 IngestScratch* scratch) {
  if (v1::EventBatch* batch = DecodeBatch(wire, arena, scratch); batch != nullptr) {
    // The sequence rule counts every event, decoded or parsed; a batch to refuse gets its
    // reason from the one full check below.
    if (ValidateBatchHeader(*batch).ok() && (batch->sequence() != 0 || scratch->events.empty())) {
      IngestMessage message;
      message.kind = IngestMessage::Kind::kBatch;
      message.batch = batch;
      message.decoded = &scratch->events;
      return message;
    }
  }
  return CheckIngestMessage(wire, arena);
}

}  // namespace vramscope::collector
