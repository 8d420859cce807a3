// Turns a parsed trace into the compact list of operations a replay runs, checking that it makes
// sense as an allocation stream: every free_requested frees a live allocation of the same size,
// no address is allocated twice while live.
//
// Pairing is resolved here, once: each alloc gets a slot number and its free refers to the slot,
// so the timed replay (replay.h) does no hashing and measures the pool alone.
//
// Thread safety: a TraceLoader is not thread-safe.
// Errors: absl::Status. TraceLoader::Add returns messages without a location (the parser adds
// `FILE:LINE: `); LoadTraceFile/LoadTraceBytes return messages that start with the source name.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "replay/trace_parser.h"

namespace vramscope::cli {

// One replayed operation: 16 bytes, so a trace of 100 million events fits in 1.6 GB.
struct ReplayOp {
  std::uint64_t size;  // alloc: the request size; free: the size of the allocation it frees
  std::uint32_t slot;  // which allocation (numbered in trace order) it allocates or frees
  bool is_free;
  std::uint64_t time_us = 0;  // the event's host time
  // free: the time of its free_completed row (PyTorch's own cache got the block back), 0 if
  // none; a fence model never completes the free earlier.
  std::uint64_t completed_us = 0;
};

struct LoadedTrace {
  std::string name;
  std::vector<ReplayOp> ops;  // allocs and free_requesteds, in trace order
  std::uint64_t alloc_events = 0;
  std::uint64_t free_events = 0;
  std::uint64_t skipped_events = 0;  // free_completed, segment_alloc, segment_free
  std::uint64_t lines = 0;
  // The trace's own figures, independent of any pool.
  std::uint64_t peak_live_bytes = 0;  // largest sum of live alloc sizes
  std::uint64_t live_at_end_bytes = 0;
  std::uint64_t live_at_end_count = 0;  // allocations never freed
};

class TraceLoader {
 public:
  absl::Status Add(const TraceEvent& event, std::uint64_t line);
  // The loaded trace; the loader is empty afterwards.
  LoadedTrace Finish(std::string name, std::uint64_t lines);

 private:
  struct Live {
    std::uint64_t size;
    std::uint64_t line;  // where it was allocated, for error messages
    std::uint32_t slot;
  };
  LoadedTrace trace_;
  std::uint64_t live_bytes_ = 0;
  std::uint32_t next_slot_ = 0;
  absl::flat_hash_map<std::uint64_t, Live> live_;  // trace address -> allocation
  // trace address -> index in ops of its free not yet followed by free_completed
  absl::flat_hash_map<std::uint64_t, std::size_t> freed_;
};

// Called now and then with the fraction of the input read so far, 0..1.
using LoadProgress = std::function<void(double fraction)>;

absl::StatusOr<LoadedTrace> LoadTraceFile(const std::string& path,
                                          const LoadProgress& progress = nullptr);
absl::StatusOr<LoadedTrace> LoadTraceBytes(std::string_view name, std::string_view bytes);

}  // namespace vramscope::cli
