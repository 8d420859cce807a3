#include "vramscope/collector/batch_check.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/unknown_field_set.h>

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
