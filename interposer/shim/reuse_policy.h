// The reuse heuristics of the pooled allocation and free paths: when a free asks for a fence
// (the amortised synchronisation, or an event-fence round), and when an allocation synchronises
// or waits for a fence rather than grow. The lock-free checks every call makes are inline here;
// what they decide to do runs out of line (reuse_policy.cc).
//
// Thread safety: any thread; the counts they read are approximate under concurrency (plain
// loads and stores, a trigger rather than an account). Nothing here fails: a synchronisation
// that cannot run leaves the fence pending and the pool grows.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "capture.h"
#include "config.h"
#include "counters.h"
#include "fence_worker.h"
#include "slots.h"
#include "state.h"
#include "stream_fence.h"

namespace vramscope::interposer::reuse {

// The pending bytes at which an allocation of `bytes` synchronises (when that is cheap) rather
// than grow: enough that one synchronisation frees many blocks of this size (256), so its few
// microseconds cost the hot path a few nanoseconds per pair, but at most 256 MiB, and never less
// than the request itself. So while one size is allocated and freed in a loop the pool holds at
// most 256 MiB (at least 4 MiB) more than without the amortisation, as cache that a pressure
// synchronisation turns back into free memory; blocks over 1 MiB get fewer blocks per
// synchronisation, which their size amortises instead. At half of it the helper thread is asked
// to synchronise in the background, so in a steady loop the allocating thread never waits.
inline std::uint64_t ReuseSyncThreshold(std::uint64_t bytes) {
  constexpr std::uint64_t kBlocksPerSync = 256;
  constexpr std::uint64_t kFloor = std::uint64_t{4} << 20;
  constexpr std::uint64_t kCap = std::uint64_t{256} << 20;
  return std::max(bytes, std::min(std::max(kBlocksPerSync * bytes, kFloor), kCap));
}

// Amortised fence after a pooled free (pool mode). One batch of frees or pending bytes asks the
// helper thread for a synchronisation; if the helper lags so far behind that kInlineBatches
// batches are pending, the freeing thread synchronises itself (what the driver's free always
// does), which bounds the memory held for pending frees.
void MaybeSyncDue(Slot* slot, std::uint64_t frees, std::uint64_t pending);

// Event fences (stream_fence.h): a round is asked for after this many bytes or frees since the
// last one. A round costs the helper thread one cuEventRecord per stream that had work, and the
// freeing thread one store (a futex wake when the helper sleeps), so rounds are frequent: a
// freed block waits about the GPU's lag behind the CPU, not for a batch to fill.
constexpr std::uint64_t kRoundBytes = std::uint64_t{8} << 20;
constexpr std::uint64_t kRoundFrees = 64;

inline bool EventMode() { return Cfg().mode == Mode::kPool && EventFencesOn(); }

// With GPU-side waits, the free path asks for a round only once VRAMSCOPE_FENCE_ROUND_US passed
// since the last: a handover covers the newest frees with a round of its own, so rounds only need
// to let the older fences complete, and each round's records (and the polls of its events)
// contend with the program's launches in the driver. Host waits want every batch fenced soon.
bool RoundSpacingPassedSlow(const EventFenceRing& ring);
inline bool RoundSpacingPassed(const EventFenceRing& ring) {
  return !Cfg().fence_gpu_wait || RoundSpacingPassedSlow(ring);
}

void AskForRound(Slot* slot);

// The free path's check: below one batch (the common case) nothing is due.
__attribute__((always_inline)) inline void MaybeSync(Slot* slot, std::uint64_t frees) {
  const std::uint64_t pending = slot->pool->PendingBytesRelaxed();
  if (EventMode()) {
    const EventFenceRing& ring = slot->event_fences;
    if ((ring.bytes_since_round.load(std::memory_order_relaxed) >= kRoundBytes ||
         ring.frees_since_round.load(std::memory_order_relaxed) >= kRoundFrees) &&
        RoundSpacingPassed(ring)) {
      AskForRound(slot);
    }
    // Completions stall (a capture live, fences that fall back): four batches pending make the
    // freeing thread synchronise, as without event fences (the counts restart at every
    // completion, so while fences complete this never fires).
    constexpr std::uint64_t kStalledBatches = 4;
    if (frees >= kStalledBatches * Cfg().fence_batch_frees ||
        pending >= kStalledBatches * slot->fences.batch_bytes) {
      (void)slot->fences.Sync();
    }
    return;
  }
  if (frees < Cfg().fence_batch_frees && pending < slot->fences.batch_bytes) return;
  MaybeSyncDue(slot, frees, pending);
}

enum class ReuseSync { kNone, kInline };

// Reuse rather than grow: when plenty of freed memory waits for its fence (ReuseSyncDue) and
// synchronisations have been cheap lately (the program keeps the GPU's queue short, e.g. it
// copies results back every iteration), synchronise now: a few microseconds, amortised over
// many blocks, instead of growing. A program that runs far ahead of the GPU (expensive
// synchronisations) grows instead of stalling. Lock-free checks only: this is the hot path.
// Asks the helper thread for a synchronisation where that is due; kInline: the caller should
// take a cached block or else synchronise itself before growing.
inline ReuseSync ReuseSyncPolicy(Slot* slot, std::size_t bytes) {
  const std::uint64_t pending = slot->pool->PendingBytesRelaxed();
  if (EventMode()) {
    // Event fences complete as the GPU catches up; the allocation waits only when the memory
    // waiting for them exceeds the lag bound (EventLagWait).
    return ReuseSync::kNone;
  }
  const std::uint64_t threshold = ReuseSyncThreshold(bytes);
  // Only when a quarter of the threshold was freed since the last synchronisation: right after
  // one, the pending bytes are mostly complete already and only wait for the bounded poll to
  // reach them, and asking again would synchronise for nothing. And only after as many frees as
  // a quarter holds blocks of this size: a small request between large frees (thrust's reduce
  // after its sort) would otherwise find a quarter of its small threshold freed every time and
  // synchronise once per iteration, where the large blocks' own threshold asks every few dozen.
  // (frees x bytes < quarter: as many frees as a quarter holds blocks, with no division here.)
  const std::uint64_t quarter = threshold / 4;
  std::uint64_t freed_as_blocks = 0;
  const bool few_frees =
      !__builtin_mul_overflow(slot->fences.frees_since_sync.load(std::memory_order_relaxed),
                              static_cast<std::uint64_t>(bytes), &freed_as_blocks) &&
      freed_as_blocks < quarter;
  if (pending < threshold / 2 ||
      slot->fences.bytes_since_sync.load(std::memory_order_relaxed) < quarter || few_frees ||
      Cfg().mode != Mode::kPool || AnyCaptureLive()) {
    return ReuseSync::kNone;
  }
  // VRAMSCOPE_FENCE_EAGER=1: the helper is asked even when synchronisations are slow (it
  // waits, the program does not); only the inline synchronisation needs them cheap.
  const bool cheap = slot->fences.SyncIsCheap();
  if (pending >= threshold && cheap) return ReuseSync::kInline;
  if ((cheap || Cfg().fence_eager) && !slot->sync_requested.load(std::memory_order_relaxed)) {
    (void)RequestBackgroundSync(slot);
  }
  return ReuseSync::kNone;
}

// The lag bound of event fences: when more than this is freed but waiting for its fences (the
// CPU that far ahead of the GPU), an allocation the pool cannot serve from what it holds waits
// for the oldest fence instead of growing. The GPU still has the work queued after that fence,
// so it does not idle; the CPU's lead is bounded by memory instead of by nothing. A fraction of
// what the device's pools hold (VRAMSCOPE_FENCE_LAG_FRACTION, default 1/16), at least 16 MiB.
constexpr std::uint64_t kLagFloor = std::uint64_t{16} << 20;
constexpr int kMaxLagWaits = 8;

// At least `least` bytes and 1/`fraction` of the device's pooled memory wait for fences, and no
// capture is live. `fraction` 0: never.
inline bool PendingOverBound(Slot* slot, std::uint64_t least, std::uint64_t fraction) {
  if (fraction == 0) return false;
  const std::uint64_t pending = slot->pool->PendingBytesRelaxed();
  if (pending < least) return false;
  const std::uint64_t reserved = DeviceCountersFor(slot->device).reserved_bytes.current.load();
  return pending >= reserved / fraction && !AnyCaptureLive();
}

// The lag bound (VRAMSCOPE_FENCE_LAG_FRACTION): the host waits for the oldest fence, once what
// waits could serve the request alone.
inline bool LagWaitDue(Slot* slot, std::size_t bytes) {
  return PendingOverBound(slot, std::max<std::uint64_t>(bytes, kLagFloor),
                          Cfg().fence_lag_fraction);
}

// The handover bound (VRAMSCOPE_FENCE_HANDOVER_FRACTION, GPU-side waits only): the oldest fence
// is handed over rather than the pool grown, also where what waits is smaller than the request
// (with the pool's free memory it may serve it: a handover costs no host wait).
inline bool HandoverDue(Slot* slot) {
  // The setting first: an inline load, so event fences without GPU waits pay no call here.
  return Cfg().fence_gpu_wait && GpuWaitOn() &&
         PendingOverBound(slot, kLagFloor, Cfg().fence_handover_fraction);
}

// Event mode, much freed memory still waiting: hand the oldest fences over to GPU-side waits
// (past the handover bound) or wait for them on the host (past the lag bound), issuing a round
// first when none is queued, until a held block serves the request. False: grow instead.
bool EventLagWait(Slot* slot, std::size_t bytes, std::uintptr_t* address, pool::BlockSizes* sizes);

}  // namespace vramscope::interposer::reuse
