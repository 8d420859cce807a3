// One Pool per primary context, created lazily on the first cuMemAlloc_v2 made under it, with
// the driver behind it (DriverUpstream) and the device-wide fence (EpochFences).
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
// Slots are never deleted: a context reset or destroy marks its slot dead (the memory went with
// the context) and leaks the Pool object, so a racing thread can never touch freed metadata and
// the dead upstream never calls the driver again.
//
// Thread safety: everything here may be called from any thread.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>

#include <cuda.h>

#include "counters.h"
#include "status.h"
#include "stream_fence.h"
#include "vramscope/pool/pool.h"
#include "vramscope/pool/upstream.h"

namespace vramscope::interposer {

// The pool's memory source: cuMemAlloc_v2/cuMemFree_v2 segments, or with VMM
// cuMemAddressReserve + cuMemCreate/cuMemMap/cuMemSetAccess (the physical handle is released
// right after mapping, so cuMemUnmap alone returns the memory). Every call runs in a
// DriverCallScope on the slot's context. Remembers what it holds so the shim can tell its
// memory from the application's (OwnsAddress).
class DriverUpstream final : public pool::Upstream {
 public:
  void Configure(CUcontext ctx, int device, bool vmm, std::size_t granularity,
                 const CUmemAccessDesc* access, int access_count);
  // The context is being torn down: never call the driver for this memory again. cuMemAlloc
  // segments belong to the context and go with it. VMM memory belongs to the device and
  // outlives the context, so its mappings and ranges are given back here (errors ignored),
  // after waiting for the context's queued work when it is still alive (`context_alive`: a
  // reset about to happen), so no kernel still running touches an unmapped page.
  void Abandon(bool context_alive);
  bool vmm() const { return vmm_; }
  // True once after the upstream took memory from the driver or gave some back: the shim then
  // writes a POOL_STATE record (outside the pool's lock, which is held around these calls).
  bool TakeStateDue() {
    return state_due_.load(std::memory_order_relaxed) &&
           state_due_.exchange(false, std::memory_order_relaxed);
  }
  // True if `address` lies in a segment or reserved range this upstream holds.
  bool OwnsAddress(std::uintptr_t address) const;
  // The slot's fences: memory goes back to the driver only once no settled free's work runs.
  void SetFences(class EpochFences* fences) { fences_ = fences; }

  // IPC (ipc.h): the handle type new physical memory is created with (set before the first
  // Map), and the mappings that tile [address, address + bytes), in address order, into `out`
  // (defined in ipc_export.cc). Returns how many, or -1 if they do not tile it or exceed
  // `capacity`.
  // A device that reports the type but refuses to create such memory turns it off for good.
  void SetShareableType(CUmemAllocationHandleType type) {
    shareable_.store(type, std::memory_order_relaxed);
  }
  CUmemAllocationHandleType shareable_type() const {
    return shareable_.load(std::memory_order_relaxed);
  }
  int MappingsCovering(std::uintptr_t address, std::size_t bytes,
                       std::pair<std::uintptr_t, std::size_t>* out, int capacity) const;

  pool::UpstreamStatus Allocate(std::size_t bytes, std::uintptr_t* address) override;
  pool::UpstreamStatus Free(std::uintptr_t address, std::size_t bytes) override;
  std::size_t MapGranularity() const override { return vmm_ ? granularity_ : 0; }
  pool::UpstreamStatus ReserveRange(std::size_t bytes, std::uintptr_t* address) override;
  pool::UpstreamStatus ReleaseRange(std::uintptr_t address, std::size_t bytes) override;
  pool::UpstreamStatus Map(std::uintptr_t address, std::size_t bytes) override;
  pool::UpstreamStatus Unmap(std::uintptr_t address, std::size_t bytes) override;

 private:
  bool Usable() const;
  pool::UpstreamStatus FromDriver(CUresult result);
  // Ring records and counters for memory taken from / given back to the driver.
  void Reserved(std::uintptr_t address, std::size_t bytes);
  void Released(std::uintptr_t address, std::size_t bytes);

  CUcontext ctx_ = nullptr;
  class EpochFences* fences_ = nullptr;
  int device_ = 0;
  bool vmm_ = false;
  std::size_t granularity_ = 0;
  CUmemAccessDesc access_[kMaxDevices] = {};  // the owning device first, then its peers
  int access_count_ = 0;
  std::atomic<CUmemAllocationHandleType> shareable_{CU_MEM_HANDLE_TYPE_NONE};
  std::atomic<bool> dead_{false};
  std::atomic<bool> state_due_{false};
  mutable pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;
  std::map<std::uintptr_t, std::size_t> held_;    // segments or reserved ranges
  std::map<std::uintptr_t, std::size_t> mapped_;  // VMM mappings
};

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
  void BeforeReturningMemory() {
    const std::uint64_t fence = settled_fence_.load(std::memory_order_acquire);
    if (fence != 0 && !IsComplete(fence)) (void)Sync(/*forced=*/true);
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
  // About one VMM map (cuMemCreate + cuMemMap + cuMemSetAccess) or one cuMemAlloc.
  static constexpr std::uint64_t kCheapSyncNs = 50000;
  std::atomic<std::uint64_t> sync_ns_{0};  // moving average of Sync's cuCtxSynchronize
};

struct Slot {
  CUcontext ctx = nullptr;
  int device = 0;
  bool primary = false;
  std::atomic<bool> dead{false};
  DriverUpstream upstream;
  EpochFences fences;
  std::atomic<bool> sync_requested{false};   // a background synchronisation is queued/running
  std::unique_ptr<pool::Pool> pool;          // null: this context is not pooled (passthrough)
  std::atomic<std::uint32_t> ring_frees{0};  // pooled frees since the last POOL_STATE record
  EventFenceRing event_fences;               // queued event fences (stream_fence.h)
};

// Contexts with a slot, at most (a context beyond them is not pooled).
inline constexpr int kMaxSlots = 64;

// The slot of `ctx` (which is current on this thread), created if needed. Never null after
// init unless the table is full; slot->pool is null when the context is not pooled.
Slot* SlotForCurrentContext(CUcontext ctx);
// Live slots, for routing by address. Returns how many were written.
int LiveSlots(Slot** out, int capacity);
// The slot whose pool holds a live block at `address` (interior pointers included).
Slot* FindPooledBlock(std::uintptr_t address, pool::BlockInfo* info);
// The slot whose upstream holds `address` (live, cached or freed-pending memory).
Slot* FindOwner(std::uintptr_t address);

// Frees a pooled pointer; kNotOurs if no pool holds it. Applies the mode's fence rule.
ShimStatus FreePooled(std::uintptr_t address, bool strict);
// cuMemAlloc_v2 through the pool of the current context. kNotOurs: not pooled, pass through.
ShimStatus AllocatePooled(CUcontext ctx, std::size_t bytes, std::uintptr_t* address,
                          CUresult* driver_error);
// The runtime-level cudaMalloc's fast path: a block the pool of the current context already
// holds (fences polled), or kUnavailable where AllocatePooled would synchronise or grow (the
// caller then goes through the runtime and AllocatePooled, which repeats only the lookup of a
// cached block before it does so; nothing is recorded twice).
ShimStatus AllocateCachedPooled(CUcontext ctx, std::size_t bytes, std::uintptr_t* address);

// Idle bytes (reserved - allocated) of every live pool on `device`.
std::uint64_t IdleBytesOnDevice(int device);
// Gives idle cached memory back to the driver (after a synchronisation if possible); true if
// anything was released. For a retry after a driver OOM.
bool FlushCaches();

// The live slot of `ctx`, or null; never creates one.
Slot* ExistingSlot(CUcontext ctx);
// `context_alive`: called before the driver tears the context down (reset), so the shim may
// still wait for its work; false after a destroy or last release.
void DropContext(CUcontext ctx);
void DropPrimaryContext(int device, bool context_alive);
// The CUresult of the last failed driver call made by an upstream on this thread.
CUresult LastUpstreamError();

void LockSlotsForFork();
void UnlockSlotsAfterFork();
void ForgetSlotsInChild();
// Copies the pools' exact figures into Counters() and returns the policy name in use.
const char* RefreshPoolFigures();

}  // namespace vramscope::interposer
