// Replays a loaded trace (trace_loader.h) through a pool over a VirtualUpstream: address
// bookkeeping only, no GPU. Every free is reusable at once (fence token 0): a recorded trace
// carries no stream timing, so the replay measures layout and host cost, not fence latency.
//
// Two kinds of run over fresh pools of the same policy, which is deterministic:
//  - one measured run, which reads the pool's statistics and samples fragmentation each time the
//    upstream's physical bytes reach a new high;
//  - timed runs that call nothing but the pool inside the clock, repeated (up to 5, while under a
//    quarter of a second in total) and reported as the fastest, to keep scheduler noise out.
//
// Thread safety: ReplayTrace is reentrant. Errors: absl::Status; kInvalidArgument for an unknown
// policy, kInternal if the pool breaks its contract (e.g. refuses to free a live block).
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "replay/trace_loader.h"
#include "vramscope/pool/pool.h"

namespace vramscope::cli {

struct ReplayResult {
  std::string policy;                // the policy's own name (the default resolved)
  vramscope::pool::PoolStats stats;  // the measured run's pool statistics at the end of the trace
  // 1 - largest free block / free bytes, when reserved bytes first reached their peak; 0 with no
  // free bytes.
  double fragmentation_at_peak = 0;
  std::uint64_t free_bytes_at_peak = 0;
  std::uint64_t largest_free_block_at_peak = 0;
  // The upstream's own high-water mark of physical bytes (Allocate + Map), which the measured run
  // uses to find the moment of peak reserved; equal to stats.peak_reserved_bytes for a pool whose
  // "reserved" means what its upstream holds.
  std::uint64_t upstream_peak_physical_bytes = 0;
  std::uint64_t failed_allocs = 0;  // allocations the pool refused (their frees are skipped)
  double ns_per_event = 0;          // fastest timed run: pool time / replayed events
  int timed_runs = 0;
};

// Called with the phase ("replay", "timing") and the fraction done, 0..1.
using ReplayProgress = std::function<void(std::string_view phase, double fraction)>;

absl::StatusOr<ReplayResult> ReplayTrace(const LoadedTrace& trace, std::string_view policy,
                                         const ReplayProgress& progress = nullptr);

}  // namespace vramscope::cli
