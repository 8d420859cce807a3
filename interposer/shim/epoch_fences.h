// EpochFences: the device-wide fence of one pool (one per Slot), the pool::FenceTracker that
// tells the pool when a freed block's work is done.
//
// Fence scheme (cudaFree is a device-wide fence; docs/design.md): a pooled free is stamped with its
// slot's current epoch. By default epochs complete by the stream-aware event fences
// (stream_fence.h: events on the streams that had work, polled); what follows is the rule they
// fall back to, and the only one with VRAMSCOPE_FENCE_EVENTS=0. Epoch e is complete once a
// cuCtxSynchronize of the slot's context that *began after* the free returned successfully: that
// call waited for every stream of the context, including streams the shim never saw (per-thread
// default streams, non-blocking streams, other libraries' streams). The synchronisation is
// amortised: a pooled free synchronises only after fence_batch_frees frees or fence_batch_bytes
// pending bytes since the last one (where the driver's own free would have synchronised every
// time); the application's own cuCtxSynchronize completes epochs for free; the pool's Wait (memory
// pressure) forces one. The amortised synchronisation is skipped while a stream capture is live
// (capture.h) and after exit began: fences then stay pending and the pool grows instead of reusing.
// Only the pool's Wait (memory pressure, or a fence it cannot keep) synchronises during a capture,
// in relaxed capture mode, because it must not return before the fence completes.
//
//
// Thread safety: every member may be called from any thread (atomics; Sync calls the driver
// with no lock of ours held). Errors: Sync returns false when it could not synchronise (the
// fence then stays pending); nothing throws.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda.h>

#include "vramscope/pool/pool.h"

namespace vramscope::interposer {

class EpochFences final : public pool::FenceTracker {
 public:
  // `settling`: frees of this context may be settled (ordered reuse is on).
  void Configure(CUcontext ctx, int device, bool settling) {
    ctx_ = ctx;
    device_ = device;
    settled_fence_.store(settling ? kUnended : 0, std::memory_order_release);
  }
  void MarkDead() { dead_.store(true, std::memory_order_release); }

  // The token for a free happening now.
  std::uint64_t Current() const { return epoch_.load(std::memory_order_seq_cst); }
  // Synchronises the context (unless exit began, or a capture is live and `forced` is false);
  // true if every fence issued before the call is now complete.
  bool Sync(bool forced = false);
  // The application synchronises the context itself: BeginUserSync before the driver call,
  // EndUserSync with its result.
  std::uint64_t BeginUserSync() { return epoch_.fetch_add(1, std::memory_order_seq_cst); }
  void EndUserSync(std::uint64_t epoch, CUresult result);
  // Event fences (stream_fence.h): the epoch a round's fence completes (every free stamped with
  // it has returned), and its completion once the round's events completed.
  std::uint64_t NextFenceEpoch() { return epoch_.fetch_add(1, std::memory_order_seq_cst); }
  void CompleteFromEvents(std::uint64_t epoch) { Complete(epoch); }

  bool IsComplete(std::uint64_t fence) override {
    return completed_.load(std::memory_order_acquire) >= fence;
  }

  // Ordered reuse settled frees at once (ordered.h): safe for reuse, since the next owner's
  // work follows the old work on the legacy stream, but not for giving the memory back to the
  // driver, which would unmap it under kernels still running. EndSettling (when ordered reuse
  // ends) takes the fence that covers every settled free; BeforeReturningMemory synchronises
  // until it completed.
  void EndSettling() {
    if (settled_fence_.load(std::memory_order_acquire) != kUnended) return;
    std::uint64_t expected = kUnended;
    const std::uint64_t fence = epoch_.fetch_add(1, std::memory_order_seq_cst);
    (void)settled_fence_.compare_exchange_strong(expected, fence, std::memory_order_acq_rel);
  }
  // Fences handed over to GPU-side waits (stream_fence.h) completed for reuse, not for giving
  // the memory back either: a synchronisation covers them first (DriverUpstream's vmm unmaps
  // wait for the owed rounds instead, OwedToCover).
  void BeforeReturningMemory() {
    WaitSettled();
    for (int i = 0; i < 4 && gpu_owed_.load(std::memory_order_seq_cst) != 0; ++i) {
      const std::uint64_t owed = gpu_owed_.exchange(0, std::memory_order_seq_cst);
      if (!Sync(/*forced=*/true)) {
        gpu_owed_.fetch_add(owed, std::memory_order_seq_cst);
        return;
      }
    }
  }
  // Synchronises until ordered reuse's settled frees completed (the first half of
  // BeforeReturningMemory).
  void WaitSettled() {
    const std::uint64_t fence = settled_fence_.load(std::memory_order_acquire);
    if (fence != 0 && !IsComplete(fence)) (void)Sync(/*forced=*/true);
  }
  // A fence of this pool was completed by handing it over to GPU-side waits.
  void NoteGpuOwed() { gpu_owed_.fetch_add(1, std::memory_order_seq_cst); }

  // The owed rounds of GPU-side waits (stream_fence.h) this pool handed over, by generation:
  // stream_fence.cc sets both under its owed lock, the newest before the round's epochs complete.
  // A block free in the pool was freed before the newest round read after it, so memory may go
  // back to the driver without a synchronisation once every round up to that one is retired (its
  // events completed): DriverUpstream::Unmap defers the unmap until then.
  static constexpr std::uint64_t kNoneOwed = ~std::uint64_t{0};
  void SetOwed(std::uint64_t newest, std::uint64_t floor) {
    owed_newest_.store(newest, std::memory_order_seq_cst);
    owed_floor_.store(floor, std::memory_order_seq_cst);
  }
  std::uint64_t owed_newest() const { return owed_newest_.load(std::memory_order_seq_cst); }
  // The oldest round still owed (kNoneOwed: none).
  std::uint64_t owed_floor() const { return owed_floor_.load(std::memory_order_seq_cst); }
  // The newest round to wait for before memory free now goes back; 0 when none is still owed.
  std::uint64_t OwedToCover() const {
    const std::uint64_t newest = owed_newest();  // first: see the comment above SetOwed
    return owed_floor() <= newest ? newest : 0;
  }
  bool CompletesInOrder() const override { return true; }
  bool NeedsRetire() const override { return false; }
  // Synchronises even while a capture is live (in relaxed mode: the pool relies on Wait to
  // complete the fence, and reusing a block early would be silent corruption). Returns with
  // the fence pending only if the synchronisation fails or exit began.
  void Wait(std::uint64_t fence) override;

  // The recent cost of a synchronisation (moving average) is below what growing the pool costs.
  bool SyncIsCheap() const { return sync_ns_.load(std::memory_order_relaxed) < kCheapSyncNs; }

  // A pooled free of `bytes`; returns the frees since the last synchronisation. Both counts
  // are approximate under concurrency (plain loads and stores: a lost increment only delays a
  // heuristic by one free), never a locked read-modify-write on the free path.
  std::uint64_t NoteFree(std::uint64_t bytes) {
    bytes_since_sync.store(bytes_since_sync.load(std::memory_order_relaxed) + bytes,
                           std::memory_order_relaxed);
    const std::uint64_t frees = frees_since_sync.load(std::memory_order_relaxed) + 1;
    frees_since_sync.store(frees, std::memory_order_relaxed);
    return frees;
  }

  std::atomic<std::uint64_t> frees_since_sync{0};
  std::atomic<std::uint64_t> bytes_since_sync{0};       // pooled bytes freed since the last one
  std::uint64_t batch_bytes = std::uint64_t{64} << 20;  // see Config::fence_batch_bytes

 private:
  void Complete(std::uint64_t epoch);

  CUcontext ctx_ = nullptr;
  int device_ = 0;
  std::atomic<bool> dead_{false};
  std::atomic<std::uint64_t> epoch_{1};      // stamped on frees happening now
  std::atomic<std::uint64_t> completed_{0};  // every epoch <= this is complete
  // 0: no settled free; kUnended: settled frees, ordered reuse still on; else their fence.
  static constexpr std::uint64_t kUnended = ~std::uint64_t{0};
  std::atomic<std::uint64_t> settled_fence_{0};
  std::atomic<std::uint64_t> gpu_owed_{0};  // handovers since the last BeforeReturningMemory
  std::atomic<std::uint64_t> owed_newest_{0};
  std::atomic<std::uint64_t> owed_floor_{kNoneOwed};
  // About one VMM map (cuMemCreate + cuMemMap + cuMemSetAccess) or one cuMemAlloc.
  static constexpr std::uint64_t kCheapSyncNs = 50000;
  std::atomic<std::uint64_t> sync_ns_{0};  // moving average of Sync's cuCtxSynchronize
};

}  // namespace vramscope::interposer
