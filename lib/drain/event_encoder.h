// EncodedEvents: the `events` of a vramscope.v1.EventBatch as protobuf wire bytes, written
// straight from ring records (vramscope/ring.h) without building a v1::Event per record.
//
// What it is: a growing byte string holding one length-delimited EventBatch field 3 (`events`)
// per event, in order, so that the bytes of the other fields (process, sequence, counters)
// around it make a serialized EventBatch (ComposeEventBatch). The hot record kinds (allocation,
// free, pool, NVTX, OOM, pool state, CUPTI, exit) are encoded field by field exactly as
// protobuf serializes the v1::Event that DecodeRecord (ring_decoder.h) builds: same fields,
// field-number order, zero values left out, so the bytes equal that message's serialization.
// Rare events (ProcessStart, SiteDefinition, DropEvent, a synthesised ProcessExit) are built as
// messages by the reader and appended with AddEvent.
//
// Thread safety: none (one drain at a time). Error convention: AddRecord returns
// InvalidArgument, appending nothing, for exactly the records DecodeRecord refuses.
#pragma once

#include <absl/status/status.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "vramscope/ring.h"
#include "vramscope/v1/events.pb.h"

namespace vramscope::agent {

class EncodedEvents {
 public:
  // Where the events stood at some moment (Truncate goes back there).
  struct Mark {
    int events = 0;
    std::size_t bytes = 0;
    std::uint64_t first_time_ns = 0;
  };

  // `record` (any kind DecodeRecord takes; `nvtx_text` as for DecodeRecord) as one event.
  absl::Status AddRecord(const vramscope_ring_record& record, std::string_view nvtx_text);
  // `event` serialized as one event.
  void AddEvent(const v1::Event& event);

  int size() const { return events_; }
  const std::string& bytes() const { return bytes_; }
  // The first event's time_ns (0 when there is none).
  std::uint64_t first_time_ns() const { return first_time_ns_; }
  Mark mark() const { return Mark{events_, bytes_.size(), first_time_ns_}; }
  void Truncate(const Mark& mark);
  // Hands the bytes over and starts empty.
  std::string TakeBytes();
  void Clear() { Truncate(Mark{}); }
  void Reserve(std::size_t bytes) { bytes_.reserve(bytes); }

 private:
  void Append(std::uint64_t time_ns, const char* data, std::size_t size);

  std::string bytes_;
  int events_ = 0;
  std::uint64_t first_time_ns_ = 0;
  std::string scratch_;  // an NVTX push's sub-message
};

// Appends the wire bytes of EventBatch field 4 (`counters`) holding `counters`.
void AppendCountersField(const v1::DeviceCounters& counters, std::string* out);

// The wire bytes of EventBatch field 1 (`process`) for `key`.
std::string EncodeProcessField(const v1::ProcessKey& key);

// A serialized EventBatch: `process_field` (EncodeProcessField), `sequence` (left out when 0),
// `leading_events` then `events` (EncodedEvents bytes), `counters` (AppendCountersField). Parses to
// the batch with those fields; byte for byte what protobuf writes for it (no maps involved).
std::string ComposeEventBatch(std::string_view process_field, std::uint64_t sequence,
                              std::string_view leading_events, std::string_view events,
                              std::string_view counters);

}  // namespace vramscope::agent
