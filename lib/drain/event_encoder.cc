// Ring record -> Event wire bytes. Mirrors ring_decoder.cc field by field (the same checks, the
// same truncations to the proto's types); event_encoder_test compares the two for every kind.
// Proto3 leaves zero scalars out and writes fields in number order; a set oneof message is
// written even when empty. Following that makes the bytes equal to protobuf's own.
#include "drain/event_encoder.h"

#include <absl/strings/str_format.h>
#include <google/protobuf/io/coded_stream.h>
#include <string.h>

#include "vramscope/utf8.h"

namespace vramscope::agent {
namespace {

using google::protobuf::io::CodedOutputStream;

constexpr std::uint32_t kVarint = 0;
constexpr std::uint32_t kLengthDelimited = 2;
constexpr std::uint32_t Tag(std::uint32_t field, std::uint32_t wire_type) {
  return (field << 3) | wire_type;
}

// EventBatch and Event field numbers (events.proto).
constexpr std::uint32_t kBatchProcess = 1;
constexpr std::uint32_t kBatchSequence = 2;
constexpr std::uint32_t kBatchEvents = 3;
constexpr std::uint32_t kBatchCounters = 4;
constexpr std::uint32_t kEventTime = 1;
constexpr std::uint32_t kEventDevice = 2;
constexpr std::uint32_t kEventThread = 3;
constexpr std::uint32_t kEventAlloc = 10;
constexpr std::uint32_t kEventFree = 11;
constexpr std::uint32_t kEventPoolReserve = 12;
constexpr std::uint32_t kEventPoolRelease = 13;
constexpr std::uint32_t kEventNvtxPush = 14;
constexpr std::uint32_t kEventNvtxPop = 15;
constexpr std::uint32_t kEventOom = 16;
constexpr std::uint32_t kEventPoolState = 17;
constexpr std::uint32_t kEventCupti = 18;
constexpr std::uint32_t kEventProcessExit = 20;

// The largest fixed-size sub-message: 8 fields of a 1-byte tag and a 10-byte varint.
constexpr std::size_t kMaxFixedPayload = 8 * 11;
// Batch tag and length, event tag fields, payload tag and length.
constexpr std::size_t kMaxPrefix = 1 + 5 + 3 * 11 + 2 + 5;

// Writes into a buffer the caller sized.
class Writer {
 public:
  explicit Writer(std::uint8_t* at) : start_(at), at_(at) {}
  std::size_t size() const { return static_cast<std::size_t>(at_ - start_); }
  std::uint8_t* at() const { return at_; }
  void Varint(std::uint64_t value) { at_ = CodedOutputStream::WriteVarint64ToArray(value, at_); }
  void Raw(const void* data, std::size_t size) {
    memcpy(at_, data, size);
    at_ += size;
  }
  // Scalars: left out when zero, as proto3 does. Signed 32-bit values (enums, int32) are
  // sign-extended to 64 bits on the wire.
  void U64(std::uint32_t field, std::uint64_t value) {
    if (value == 0) return;
    Varint(Tag(field, kVarint));
    Varint(value);
  }
  void I32(std::uint32_t field, std::int32_t value) {
    U64(field, static_cast<std::uint64_t>(static_cast<std::int64_t>(value)));
  }
  void Bool(std::uint32_t field, bool value) { U64(field, value ? 1 : 0); }

 private:
  std::uint8_t* start_;
  std::uint8_t* at_;
};

absl::Status Invalid(const vramscope_ring_record& record, const char* what) {
  return absl::InvalidArgumentError(
      absl::StrFormat("ring record kind %d: %s", static_cast<int>(record.kind), what));
}

void AppendVarint(std::uint64_t value, std::string* out) {
  std::uint8_t buffer[10];
  const std::uint8_t* end = CodedOutputStream::WriteVarint64ToArray(value, buffer);
  out->append(reinterpret_cast<const char*>(buffer), static_cast<std::size_t>(end - buffer));
}

void AppendField(std::uint32_t field, std::string_view bytes, std::string* out) {
  AppendVarint(Tag(field, kLengthDelimited), out);
  AppendVarint(bytes.size(), out);
  out->append(bytes);
}

void AppendString(std::uint32_t field, std::string_view text, std::string* out) {
  if (text.empty()) return;
  AppendField(field, text, out);
}

// NVTX text is the application's: escaped unless already valid UTF-8 (vramscope/utf8.h).
void AppendText(std::uint32_t field, std::string_view text, std::string* out) {
  if (IsValidUtf8(text)) {
    AppendString(field, text, out);
  } else {
    AppendString(field, ToValidUtf8(text), out);
  }
}

// CuptiMemoryEvent: the count alone for OPERATION_RECORDS_DROPPED, else the record.
absl::Status WriteCupti(const vramscope_ring_record& record, Writer& w, std::uint32_t* field) {
  if (record.sub > v1::CuptiMemoryEvent::OPERATION_RECORDS_DROPPED) {
    return Invalid(record, "CUPTI operation");
  }
  const vramscope_ring_cupti_payload& p = record.payload.cupti;
  *field = kEventCupti;
  w.I32(1, record.sub);
  if (record.sub == v1::CuptiMemoryEvent::OPERATION_RECORDS_DROPPED) {
    w.U64(8, p.bytes);
    return absl::OkStatus();
  }
  w.U64(2, p.address);
  w.U64(3, p.bytes);
  w.U64(4, p.memory_kind);
  w.U64(5, p.pool_address);
  w.U64(6, p.pool_type);
  w.U64(7, p.stream);
  return absl::OkStatus();
}

// The payload sub-message of a fixed-size kind into `w`; its Event field in *field.
absl::Status WriteFixedPayload(const vramscope_ring_record& record, Writer& w,
                               std::uint32_t* field) {
  switch (record.kind) {
    case VRAMSCOPE_RING_KIND_ALLOC: {
      if (record.sub >= VRAMSCOPE_RING_ALLOC_LIMIT) return Invalid(record, "allocation kind");
      const vramscope_ring_alloc_payload& p = record.payload.alloc;
      *field = kEventAlloc;
      w.U64(1, p.address);
      w.U64(2, p.requested_bytes);
      w.U64(3, p.allocated_bytes);
      w.I32(4, record.sub);
      w.U64(5, p.stream);
      w.U64(6, record.aux);
      w.U64(7, p.site);
      return absl::OkStatus();
    }
    case VRAMSCOPE_RING_KIND_FREE: {
      if (record.sub >= VRAMSCOPE_RING_ALLOC_LIMIT) return Invalid(record, "allocation kind");
      const vramscope_ring_free_payload& p = record.payload.free;
      *field = kEventFree;
      w.U64(1, p.address);
      w.U64(2, p.requested_bytes);
      w.U64(3, p.allocated_bytes);
      w.I32(4, record.sub);
      w.U64(5, p.stream);
      return absl::OkStatus();
    }
    case VRAMSCOPE_RING_KIND_POOL_RESERVE:
    case VRAMSCOPE_RING_KIND_POOL_RELEASE:
      *field =
          record.kind == VRAMSCOPE_RING_KIND_POOL_RESERVE ? kEventPoolReserve : kEventPoolRelease;
      w.U64(1, record.payload.pool.address);
      w.U64(2, record.payload.pool.bytes);
      return absl::OkStatus();
    case VRAMSCOPE_RING_KIND_NVTX_POP:
      *field = kEventNvtxPop;
      w.U64(1, record.aux);
      return absl::OkStatus();
    case VRAMSCOPE_RING_KIND_OOM: {
      if (record.sub > v1::OOM_VERDICT_CAPACITY) return Invalid(record, "OOM verdict");
      const vramscope_ring_oom_payload& p = record.payload.oom;
      *field = kEventOom;
      w.U64(1, p.requested_bytes);
      w.U64(2, p.free_bytes);
      w.U64(3, p.largest_free_block_bytes);
      w.I32(4, record.sub);
      return absl::OkStatus();
    }
    case VRAMSCOPE_RING_KIND_POOL_STATE: {
      const vramscope_ring_pool_state_payload& p = record.payload.pool_state;
      *field = kEventPoolState;
      w.U64(1, p.largest_free_block_bytes);
      w.U64(2, p.free_bytes);
      w.U64(3, p.pending_bytes);
      w.U64(4, p.unreleasable_free_bytes);
      w.U64(5, p.reserved_bytes);
      return absl::OkStatus();
    }
    case VRAMSCOPE_RING_KIND_CUPTI_MEMORY:
      return WriteCupti(record, w, field);
    case VRAMSCOPE_RING_KIND_PROCESS_EXIT:
      *field = kEventProcessExit;
      w.I32(1, static_cast<std::int32_t>(record.aux));
      w.Bool(2, (record.flags & 1) != 0);
      return absl::OkStatus();
    case VRAMSCOPE_RING_KIND_TEXT:
      return Invalid(record, "TEXT record without an NVTX push before it");
    case VRAMSCOPE_RING_KIND_SITE:
    case VRAMSCOPE_RING_KIND_MODULE:
      return Invalid(record, "SITE and MODULE records are assembled by the reader (SiteAssembler)");
    default:
      return Invalid(record, "unknown kind");
  }
}

}  // namespace

absl::Status EncodedEvents::AddRecord(const vramscope_ring_record& record,
                                      std::string_view nvtx_text) {
  std::uint8_t fixed[kMaxFixedPayload];
  std::string_view payload;
  std::uint32_t field = 0;
  if (record.kind == VRAMSCOPE_RING_KIND_NVTX_PUSH) {
    const vramscope_ring_nvtx_push_payload& p = record.payload.nvtx_push;
    const std::size_t total = std::size_t{p.name_len} + p.domain_len;
    if (total > VRAMSCOPE_RING_MAX_NVTX_TEXT || total != nvtx_text.size()) {
      return Invalid(record, "NVTX name and domain lengths");
    }
    field = kEventNvtxPush;
    scratch_.clear();
    std::uint8_t head[11];
    Writer range(head);
    range.U64(1, record.aux);
    scratch_.append(reinterpret_cast<const char*>(head), range.size());
    AppendText(2, nvtx_text.substr(0, p.name_len), &scratch_);
    AppendText(3, nvtx_text.substr(p.name_len), &scratch_);
    std::uint8_t tail[22];
    Writer rest(tail);
    rest.U64(4, p.category);
    rest.U64(5, p.parent_range_id);
    scratch_.append(reinterpret_cast<const char*>(tail), rest.size());
    payload = scratch_;
  } else {
    Writer w(fixed);
    if (absl::Status status = WriteFixedPayload(record, w, &field); !status.ok()) return status;
    payload = std::string_view(reinterpret_cast<const char*>(fixed), w.size());
  }
  // The Event: its scalar fields, then the payload as a length-delimited field.
  std::uint8_t head[3 * 11 + 2 + 5];
  Writer event(head);
  event.U64(kEventTime, record.time_ns);
  event.U64(kEventDevice, record.device);
  event.U64(kEventThread, record.tid);
  event.Varint(Tag(field, kLengthDelimited));
  event.Varint(payload.size());
  // As EventBatch.events: tag and length, then the Event.
  std::uint8_t prefix[kMaxPrefix];
  Writer out(prefix);
  out.Varint(Tag(kBatchEvents, kLengthDelimited));
  out.Varint(event.size() + payload.size());
  out.Raw(head, event.size());
  if (events_ == 0) first_time_ns_ = record.time_ns;
  bytes_.append(reinterpret_cast<const char*>(prefix), out.size());
  bytes_.append(payload);
  ++events_;
  return absl::OkStatus();
}

void EncodedEvents::AddEvent(const v1::Event& event) {
  if (events_ == 0) first_time_ns_ = event.time_ns();
  AppendVarint(Tag(kBatchEvents, kLengthDelimited), &bytes_);
  AppendVarint(event.ByteSizeLong(), &bytes_);
  const std::size_t at = bytes_.size();
  bytes_.resize(at + event.GetCachedSize());
  event.SerializeWithCachedSizesToArray(reinterpret_cast<std::uint8_t*>(bytes_.data() + at));
  ++events_;
}

void EncodedEvents::Truncate(const Mark& mark) {
  bytes_.resize(mark.bytes);
  events_ = mark.events;
  first_time_ns_ = mark.first_time_ns;
}

std::string EncodedEvents::TakeBytes() {
  std::string taken = std::move(bytes_);
  bytes_.clear();
  events_ = 0;
  first_time_ns_ = 0;
  return taken;
}

void AppendCountersField(const v1::DeviceCounters& counters, std::string* out) {
  AppendField(kBatchCounters, counters.SerializeAsString(), out);
}

std::string EncodeProcessField(const v1::ProcessKey& key) {
  std::string out;
  AppendField(kBatchProcess, key.SerializeAsString(), &out);
  return out;
}

std::string ComposeEventBatch(std::string_view process_field, std::uint64_t sequence,
                              std::string_view leading_events, std::string_view events,
                              std::string_view counters) {
  std::uint8_t head[11];
  Writer w(head);
  w.U64(kBatchSequence, sequence);
  std::string out;
  out.reserve(process_field.size() + w.size() + leading_events.size() + events.size() +
              counters.size());
  out.append(process_field);
  out.append(reinterpret_cast<const char*>(head), w.size());
  out.append(leading_events);
  out.append(events);
  out.append(counters);
  return out;
}

}  // namespace vramscope::agent
