// What the collector accepts on its Ingest stream: one place that decides, for the service and for
// fuzzers, whether a message is a batch to store, a batch to refuse (answered per batch with
// IngestAck.rejected, the stream goes on), or bytes that are not an EventBatch at all (the stream
// ends with INVALID_ARGUMENT).
//
// A batch is refused when its process key cannot be filed (pid 0, a host that is not UTF-8 or is
// longer than kMaxHostBytes), when it has sequence 0 but events or counters (sequence 0 is only
// for probes), or when a string field anywhere in it is not UTF-8 (proto3 requires it; such
// bytes would also make the stored log unreadable at recovery).
//
// Thread safety: pure functions. Error convention: absl::Status INVALID_ARGUMENT with a message
// naming the field (and the event's index) for a refused batch; CheckIngestMessage reports in
// its result instead.
#ifndef VRAMSCOPE_COLLECTOR_BATCH_CHECK_H_
#define VRAMSCOPE_COLLECTOR_BATCH_CHECK_H_

#include <absl/status/status.h>
#include <absl/strings/string_view.h>
#include <google/protobuf/arena.h>

#include <cstdint>
#include <string>
#include <vector>

#include "stats/stats_engine.h"
#include "vramscope/v1/events.pb.h"

namespace vramscope::collector {

// Longer than any host name (HOST_NAME_MAX is 64 on Linux, DNS names are at most 253 bytes).
inline constexpr std::size_t kMaxHostBytes = 255;

// The process key: pid != 0, host valid UTF-8 of at most kMaxHostBytes bytes.
absl::Status ValidateProcessKey(const v1::ProcessKey& key);

// The key and the sequence rule (cheap: no walk over the events).
absl::Status ValidateBatchHeader(const v1::EventBatch& batch);

// Every check on a parsed batch: the key, the sequence rule, and UTF-8 in every string field
// (walked by reflection; a batch parsed from the wire has passed that check already, see
// CheckIngestMessage, so the service does not pay for it twice).
absl::Status ValidateBatch(const v1::EventBatch& batch);

struct IngestMessage {
  enum class Kind {
    kBatch,      // store `batch`
    kRejected,   // refuse the batch `process`/`sequence` for `reason`
    kMalformed,  // not an EventBatch: end the stream with `reason`
  };
  Kind kind = Kind::kMalformed;
  // kBatch: the parsed batch (on the arena passed in, or owned by the caller's arena).
  v1::EventBatch* batch = nullptr;
  // kBatch, when decoded with an IngestScratch: every event of the batch in order, allocations
  // and frees decoded in place; `batch->events()` then holds only the other events (which
  // `decoded` points at). nullptr: `batch->events()` is every event.
  const std::vector<BatchEvent>* decoded = nullptr;
  // kRejected: the batch's process key as far as the bytes tell (a host that is not UTF-8 is
  // escaped, vramscope/utf8.h), whether that key may be filed (ValidateProcessKey passed), its
  // sequence and number of events.
  v1::ProcessKey process;
  bool key_usable = false;
  uint64_t sequence = 0;
  uint64_t events = 0;
  // kRejected, kMalformed: why (valid UTF-8).
  std::string reason;
};

// Parses `wire` (one Ingest message) onto `arena` and decides what it is. When protobuf refuses
// to parse it, the bytes are read again field by field against the EventBatch schema to find
// the offending field (a string that is not UTF-8, a field of the wrong wire type) and the key
// and sequence of the batch; if even that fails it is kMalformed.
IngestMessage CheckIngestMessage(absl::string_view wire, google::protobuf::Arena* arena);

// What CheckIngestMessage reuses from one message to the next of a stream.
struct IngestScratch {
  std::vector<BatchEvent> events;
  std::string rest;
};

// The same verdict, cheaper for a batch to store: allocation and free events are decoded from
// the wire straight into `scratch->events` (no message per event), the rest of the batch is
// parsed by protobuf. Any event the decoder does not take exactly as protobuf would (an unknown
// or repeated payload field, a wire type or varint out of the ordinary), and any batch that is
// not to be stored, is decided by CheckIngestMessage(wire, arena) instead, so the result is
// always that of protobuf's parse.
IngestMessage CheckIngestMessage(absl::string_view wire, google::protobuf::Arena* arena,
                                 IngestScratch* scratch);

}  // namespace vramscope::collector

#endif  // VRAMSCOPE_COLLECTOR_BATCH_CHECK_H_
