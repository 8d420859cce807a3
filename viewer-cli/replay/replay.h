// Replays a loaded trace (trace_loader.h) through a pool over a VirtualUpstream: address
// bookkeeping only, no GPU. By default every free is reusable at once (fence token 0): the
// replay measures layout and host cost. A fence model (ReplayOptions) instead makes each free
// wait as the shim's fence would with the GPU running `gpu_lag_us` behind the trace's host times:
//  - kEvents (the shim's event fences with host waits, VRAMSCOPE_FENCE_GPU_WAIT=0,
//    interposer/shim/stream_fence.h): a free is reusable once
//    the GPU passed it, at max(free time + lag, its free_completed time); an allocation the pool
//    cannot serve from what it holds, while more than max(16 MiB, reserved / lag_fraction) waits
//    for fences, waits for the oldest fence instead of growing (the host then runs later: every
//    later event is shifted by the wait, counted in host_wait_us);
//  - kGpuWait (event fences with GPU-side waits, the shim's default rule): as kEvents, but where
//  the pool
//    would grow while more than max(16 MiB, reserved / handover_fraction) waits for fences, or
//    where the lag bound would wait on the host, every free so far is handed over instead (the
//    shim's round for the newest frees and all queued fences as one): complete for reuse at once,
//    the ordering left to waits on the GPU, which had that work queued anyway; the host never
//    waits (handovers counts them);
//  - kDeviceSync (VRAMSCOPE_FENCE_EVENTS=0: the amortised device synchronisation, its batch rule
//    alone): after batch_frees frees or batch_bytes bytes since the last one, a synchronisation
//    starts (one at a time) and completes every earlier free `lag` later.
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

enum class FenceModel { kNone, kEvents, kGpuWait, kDeviceSync };

struct ReplayOptions {
  FenceModel fence = FenceModel::kNone;
  std::uint64_t gpu_lag_us = 0;
  std::uint64_t lag_fraction = 16;        // kEvents, kGpuWait; 0: never wait
  std::uint64_t handover_fraction = 256;  // kGpuWait; 0: hand over only past the lag bound
  std::uint64_t batch_frees = 1024;       // kDeviceSync
  std::uint64_t batch_bytes = std::uint64_t{2253} << 20;  // kDeviceSync: 1/64 of an H200
  // The upstream unmaps whole pieces of this many bytes, as the shim's driver upstream does
  // (VRAMSCOPE_VMM_PIECE); the map granularity (2 MiB) unmaps any granules, 0 whole Maps only.
  std::size_t map_piece_bytes = vramscope::pool::kDefaultMapPieceBytes;
};

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
  // Physical handles the upstream mapped (one cuMemCreate + cuMemMap each in the shim).
  std::uint64_t upstream_mapped_pieces = 0;
  std::uint64_t failed_allocs = 0;  // allocations the pool refused (their frees are skipped)
  double ns_per_event = 0;          // fastest timed run: pool time / replayed events
  int timed_runs = 0;
  // Fence models (measured run only; timed runs replay with every free reusable at once).
  ReplayOptions options;
  std::uint64_t host_wait_us = 0;  // kEvents: total time allocations waited for fences
  std::uint64_t lag_waits = 0;     // kEvents: fences waited for
  std::uint64_t fence_syncs = 0;   // kDeviceSync: synchronisations started
  std::uint64_t handovers = 0;     // kGpuWait: fences handed over to GPU-side waits
};

// Called with the phase ("replay", "timing") and the fraction done, 0..1.
using ReplayProgress = std::function<void(std::string_view phase, double fraction)>;

// "none", "events", "gpuwait", "devsync".
std::string_view FenceModelName(FenceModel model);

absl::StatusOr<ReplayResult> ReplayTrace(const LoadedTrace& trace, std::string_view policy,
                                         const ReplayProgress& progress = nullptr,
                                         const ReplayOptions& options = {});

}  // namespace vramscope::cli
