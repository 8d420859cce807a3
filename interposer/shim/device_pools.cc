#include "device_pools.h"

#include <string.h>

#include <algorithm>
#include <new>

#include "capture.h"
#include "config.h"
#include "counters.h"
#include "driver.h"
#include "ipc.h"
#include "log.h"
#include "ordered.h"
#include "pool_records.h"
#include "reuse_policy.h"
#include "ring_events.h"
#include "state.h"
#include "stream_fence.h"

namespace vramscope::interposer {
namespace {

bool IsPrimary(CUcontext ctx, int device) {
  const RealDriver& real = Real();
  if (real.cuDevicePrimaryCtxGetState == nullptr || real.cuDevicePrimaryCtxRetain == nullptr ||
      real.cuDevicePrimaryCtxRelease_v2 == nullptr) {
    return false;
  }
  unsigned int flags = 0;
  int active = 0;
  if (real.cuDevicePrimaryCtxGetState(device, &flags, &active) != CUDA_SUCCESS || !active) {
    return false;
  }
  // Active, so retaining creates nothing; the release restores the application's count.
  CUcontext primary = nullptr;
  if (real.cuDevicePrimaryCtxRetain(&primary, device) != CUDA_SUCCESS) return false;
  (void)real.cuDevicePrimaryCtxRelease_v2(device);
  return primary == ctx;
}

// Called with the table lock (LockSlotTable) held and `ctx` current on this thread.
Slot* CreateSlot(CUcontext ctx, int index) {
  const RealDriver& real = Real();
  const Config& config = Cfg();
  Slot* slot = new (std::nothrow) Slot();
  if (slot == nullptr) return nullptr;
  slot->ctx = ctx;
  DriverCallScope scope(nullptr);  // relaxed capture mode for the queries below
  CUdevice device = 0;
  if (real.cuCtxGetDevice == nullptr || real.cuCtxGetDevice(&device) != CUDA_SUCCESS) {
    return slot;  // not pooled
  }
  slot->device = device;
  NoteRingDevice(device);
  slot->primary = IsPrimary(ctx, device);
  if (!slot->primary || config.mode == Mode::kPassthrough) {
    if (!slot->primary) {
      VRAMSCOPE_LOG(kInfo, "context %p on device %d is not a primary context: not pooled",
                    static_cast<void*>(ctx), device);
    }
    return slot;
  }
  char* policy = PolicyNameBuffer(index);
  const std::size_t granularity =
      ConfigureDriverUpstream(&slot->upstream, ctx, device, config, policy);
  const bool use_vmm = slot->upstream.vmm();
  slot->fences.Configure(ctx, device, OrderedOn());
  slot->upstream.SetFences(&slot->fences);
  slot->fences.batch_bytes = config.fence_batch_bytes;
  if (slot->fences.batch_bytes == 0) {
    std::size_t total = 0;
    if (real.cuDeviceTotalMem_v2 == nullptr ||
        real.cuDeviceTotalMem_v2(&total, device) != CUDA_SUCCESS) {
      total = 0;
    }
    // Memory freed while the GPU still has work queued cannot be reused until that work is
    // done: the pool holds about (free rate x queue depth) beyond what the program uses. 1/64
    // of the device (2.2 GB on an H200) per batch keeps synchronisations rare for training
    // steps that churn gigabytes; the inline fallback (MaybeSync) caps it at 1/16.
    slot->fences.batch_bytes = std::max<std::uint64_t>(std::uint64_t{64} << 20, total / 64);
  }
  pool::PoolOptions options;
  options.policy = policy;
  options.capacity_bytes = config.capacity_bytes;
  options.quick_reuse = config.quick_reuse;
  options.cap_counts_pending = config.cap_counts_pending;
  slot->pool = pool::MakePool(&slot->upstream, &slot->fences, options);
  if (slot->pool == nullptr) {
    VRAMSCOPE_LOG_ONCE(
        kWarn, "pool policy \"%s\" is unknown (known: %.*s); device memory is not pooled", policy,
        static_cast<int>(pool::PolicyNames().size()), pool::PolicyNames().data());
    return slot;
  }
  VRAMSCOPE_LOG(kInfo, "device %d: pool \"%s\" over %s (granularity %zu)", device, policy,
                use_vmm ? "cuMemCreate/cuMemMap" : "cuMemAlloc segments", granularity);
  return slot;
}

void MarkDead(Slot* slot, bool context_alive) {
  slot->dead.store(true, std::memory_order_release);
  slot->upstream.Abandon(context_alive);
  slot->fences.MarkDead();
  // Its streams went with it (a stream handle may come back for another context).
  ForgetContextStreams(slot->ctx);
}

}  // namespace

// --- Slot creation ---------------------------------------------------------------------------

namespace {

__attribute__((noinline)) Slot* SlotForCurrentContextSlow(CUcontext ctx) {
  const std::uint64_t generation = slots_internal::g_generation.load(std::memory_order_acquire);
  Slot* slot = ScanFor(ctx);
  if (slot == nullptr) {
    NoteOrderedContext(ctx);  // a second context ends ordered reuse (before taking the lock)
    LockSlotTable();
    slot = ScanFor(ctx);
    const int count = SlotCount();
    if (slot == nullptr && count < kMaxSlots) {
      slot = CreateSlot(ctx, count);
      if (slot != nullptr) {
        PublishSlot(count, slot);
        // Ordered reuse may have ended between CreateSlot and the publication above, where the
        // end's EndSettling could not see this slot (idempotent).
        if (!OrderedOn()) slot->fences.EndSettling();
      }
    } else if (slot == nullptr) {
      VRAMSCOPE_LOG_ONCE(kWarn, "more than %d contexts: new contexts are not pooled", kMaxSlots);
    }
    UnlockSlotTable();
  }
  if (slot != nullptr) slots_internal::t_cache = {ctx, slot, generation};
  return slot;
}

__attribute__((always_inline)) inline Slot* SlotFor(CUcontext ctx) {
  Slot* slot = CachedSlotFor(ctx);
  return slot != nullptr ? slot : SlotForCurrentContextSlow(ctx);
}

}  // namespace

Slot* SlotForCurrentContext(CUcontext ctx) { return SlotFor(ctx); }

namespace {

// A POOL_STATE record every this many pooled frees of a slot, and after every reserve/release.
constexpr std::uint32_t kRingStateEveryFrees = 256;

void MaybeRecordPoolState(Slot* slot, bool after_free) {
  if (Ring() == nullptr) return;
  bool due = slot->upstream.TakeStateDue();
  if (after_free) {
    // Approximate under concurrency (a plain load and store), which a periodic record allows.
    const std::uint32_t frees = slot->ring_frees.load(std::memory_order_relaxed) + 1;
    slot->ring_frees.store(frees, std::memory_order_relaxed);
    if (frees >= kRingStateEveryFrees) due = true;
  }
  if (!due) return;
  slot->ring_frees.store(0, std::memory_order_relaxed);
  RingPoolState(slot);
}

// Frees `address` in the slot's pool, with a FREE record of the sizes the pool reports; on
// success `*frees` is the slot's count of frees since its last synchronisation (0 under ordered
// reuse, where the block is reusable at once and waits for no fence).
__attribute__((always_inline)) inline pool::PoolStatus FreeInSlot(Slot* slot,
                                                                  std::uintptr_t address,
                                                                  std::uint64_t* frees) {
  pool::BlockSizes sizes;
  const bool settled = OrderedOn();
  const pool::PoolStatus status = slot->pool->FreeSized(
      address, settled ? pool::kSettledFence : slot->fences.Current(), &sizes);
  if (status == pool::PoolStatus::kOk) {
    *frees = settled ? 0 : slot->fences.NoteFree(sizes.allocated);
    if (!settled) {
      // Plain loads and stores, as NoteFree: a trigger, not an account.
      EventFenceRing& ring = slot->event_fences;
      ring.bytes_since_round.store(
          ring.bytes_since_round.load(std::memory_order_relaxed) + sizes.allocated,
          std::memory_order_relaxed);
      ring.frees_since_round.store(ring.frees_since_round.load(std::memory_order_relaxed) + 1,
                                   std::memory_order_relaxed);
    }
    RingPooledFree(slot, address, sizes.requested, sizes.allocated);
  }
  return status;
}

// After a successful pooled free: the mode's fence rule.
__attribute__((always_inline)) inline ShimStatus AfterFree(Slot* slot, bool strict,
                                                           std::uint64_t frees) {
  if (strict) {
    // The driver's free waits for the device; strict mode keeps that wait.
    (void)slot->fences.Sync();
  } else if (!Exiting()) {
    reuse::MaybeSync(slot, frees);
  }
  MaybeRecordPoolState(slot, /*after_free=*/true);
  return ShimStatus::kOk;
}

}  // namespace

ShimStatus FreePooled(std::uintptr_t address, bool strict) {
  // An exported block that importers hold open stays allocated until they closed it (ipc.h).
  if (IpcExportsLive()) [[unlikely]] {
    if (const int deferred = IpcDeferFree(address, FreePooled); deferred != 0) {
      return deferred > 0 ? ShimStatus::kOk : ShimStatus::kInvalidValue;
    }
  }
  // Route by address, not by the current device: the calling thread may have another device
  // current, or no context at all. The thread's last slot is the likely owner: try it first.
  const std::uint64_t generation = slots_internal::g_generation.load(std::memory_order_acquire);
  Slot* cached =
      slots_internal::t_cache.generation == generation ? slots_internal::t_cache.slot : nullptr;
  std::uint64_t frees = 0;
  if (cached != nullptr && cached->pool != nullptr) {
    const pool::PoolStatus status = FreeInSlot(cached, address, &frees);
    if (status == pool::PoolStatus::kOk) return AfterFree(cached, strict, frees);
    if (status != pool::PoolStatus::kInvalidAddress) return ShimStatus::kDriverError;
  }
  Slot* slots[kMaxSlots];
  const int count = LiveSlots(slots, kMaxSlots);
  for (int i = 0; i < count; ++i) {
    Slot* slot = slots[i];
    if (slot == cached) continue;
    const pool::PoolStatus status = FreeInSlot(slot, address, &frees);
    if (status == pool::PoolStatus::kInvalidAddress) continue;
    if (status != pool::PoolStatus::kOk) return ShimStatus::kDriverError;
    return AfterFree(slot, strict, frees);
  }
  // Not a live block. Inside the pool's memory (a double free, an interior pointer, a cached
  // block) it must not reach the driver, which would free a whole segment of the pool.
  if (FindOwner(address) != nullptr) return ShimStatus::kInvalidValue;
  return ShimStatus::kNotOurs;
}

ShimStatus AllocatePooled(CUcontext ctx, std::size_t bytes, std::uintptr_t* address,
                          CUresult* driver_error) {
  Slot* slot = SlotFor(ctx);
  if (slot == nullptr || slot->pool == nullptr) return ShimStatus::kNotOurs;
  ClearUpstreamError();
  pool::BlockSizes sizes;
  if (reuse::EventMode() && (reuse::LagWaitDue(slot, bytes) || reuse::HandoverDue(slot))) {
    if (slot->pool->AllocateCached(bytes, address, &sizes) == pool::PoolStatus::kOk ||
        reuse::EventLagWait(slot, bytes, address, &sizes)) {
      RingPooledAlloc(slot, *address, sizes.requested, sizes.allocated);
      return ShimStatus::kOk;
    }
  } else if (reuse::ReuseSyncPolicy(slot, bytes) == reuse::ReuseSync::kInline) {
    if (slot->pool->AllocateCached(bytes, address, &sizes) == pool::PoolStatus::kOk) {
      RingPooledAlloc(slot, *address, sizes.requested, sizes.allocated);
      return ShimStatus::kOk;
    }
    (void)slot->fences.Sync();  // the background synchronisation has not kept up
  }
  switch (slot->pool->AllocateSized(bytes, address, &sizes)) {
    case pool::PoolStatus::kOk:
      RingPooledAlloc(slot, *address, sizes.requested, sizes.allocated);
      MaybeRecordPoolState(slot, /*after_free=*/false);
      return ShimStatus::kOk;
    case pool::PoolStatus::kOutOfMemory:
    case pool::PoolStatus::kInvalidArgument:  // larger than the configured capacity
      RingPooledOom(slot, bytes);
      (void)slot->upstream.TakeStateDue();  // RingPooledOom wrote the state
      return ShimStatus::kOutOfMemory;
    case pool::PoolStatus::kInvalidAddress:
    case pool::PoolStatus::kUpstreamError:
      MaybeRecordPoolState(slot, /*after_free=*/false);
      break;
  }
  const CUresult upstream_error = LastUpstreamError();
  *driver_error = upstream_error != CUDA_SUCCESS ? upstream_error : CUDA_ERROR_UNKNOWN;
  return ShimStatus::kDriverError;
}

ShimStatus AllocateCachedPooled(CUcontext ctx, std::size_t bytes, std::uintptr_t* address) {
  Slot* slot = SlotFor(ctx);
  if (slot == nullptr || slot->pool == nullptr) return ShimStatus::kNotOurs;
  pool::BlockSizes sizes;
  // The same reuse policy as AllocatePooled; where it would synchronise inline, a miss here
  // leaves that to it.
  (void)reuse::ReuseSyncPolicy(slot, bytes);
  if (slot->pool->AllocateCached(bytes, address, &sizes) != pool::PoolStatus::kOk) {
    return ShimStatus::kUnavailable;
  }
  RingPooledAlloc(slot, *address, sizes.requested, sizes.allocated);
  return ShimStatus::kOk;
}

std::uint64_t IdleBytesOnDevice(int device) {
  Slot* slots[kMaxSlots];
  const int count = LiveSlots(slots, kMaxSlots);
  std::uint64_t idle = 0;
  for (int i = 0; i < count; ++i) {
    if (slots[i]->device == device) idle += slots[i]->pool->Stats().free_bytes;
  }
  return idle;
}

bool FlushCaches() {
  Slot* slots[kMaxSlots];
  const int count = LiveSlots(slots, kMaxSlots);
  std::size_t released = 0;
  for (int i = 0; i < count; ++i) {
    // Only after a successful synchronisation are all fences complete, so DrainPending cannot
    // block or hand out a block early.
    if (slots[i]->fences.Sync()) slots[i]->pool->DrainPending();
    released += slots[i]->pool->ReleaseIdle();
    MaybeRecordPoolState(slots[i], /*after_free=*/false);
  }
  return released > 0;
}

void DropContext(CUcontext ctx) {
  LockSlotTable();
  const int count = SlotCount();
  for (int i = 0; i < count; ++i) {
    Slot* slot = slots_internal::g_slots[i].load(std::memory_order_relaxed);
    if (slot != nullptr && slot->ctx == ctx && !slot->dead.load(std::memory_order_relaxed)) {
      MarkDead(slot, /*context_alive=*/false);
      VRAMSCOPE_LOG(kInfo, "context %p destroyed: its pool is dropped", static_cast<void*>(ctx));
    }
  }
  InvalidateSlotCaches();
  UnlockSlotTable();
}

void DropPrimaryContext(int device, bool context_alive) {
  LockSlotTable();
  const int count = SlotCount();
  for (int i = 0; i < count; ++i) {
    Slot* slot = slots_internal::g_slots[i].load(std::memory_order_relaxed);
    if (slot != nullptr && slot->primary && slot->device == device &&
        !slot->dead.load(std::memory_order_relaxed)) {
      MarkDead(slot, context_alive);
      VRAMSCOPE_LOG(kInfo, "device %d: primary context reset, its pool is dropped", device);
    }
  }
  InvalidateSlotCaches();
  UnlockSlotTable();
}

}  // namespace vramscope::interposer
