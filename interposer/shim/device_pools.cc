#include "device_pools.h"

#include <string.h>
#include <time.h>

#include <algorithm>
#include <new>

#include "capture.h"
#include "config.h"
#include "counters.h"
#include "driver.h"
#include "fence_worker.h"
#include "ipc.h"
#include "log.h"
#include "ordered.h"
#include "ring_events.h"
#include "state.h"

namespace vramscope::interposer {
namespace {

constinit std::atomic<Slot*> g_slots[kMaxSlots] = {};
constinit std::atomic<int> g_slot_count{0};
constinit pthread_mutex_t g_slots_mu = PTHREAD_MUTEX_INITIALIZER;
// Bumped whenever a slot dies or the table is forgotten; invalidates the per-thread cache.
constinit std::atomic<std::uint64_t> g_generation{1};

struct SlotCache {
  CUcontext ctx = nullptr;
  Slot* slot = nullptr;
  std::uint64_t generation = 0;
};
__attribute__((tls_model("initial-exec"))) constinit thread_local SlotCache t_cache{};
__attribute__((tls_model("initial-exec"))) constinit thread_local CUresult t_upstream_error =
    CUDA_SUCCESS;

// Policy names live as long as the pools that were given a string_view of them.
struct PolicyName {
  char text[32] = {};
};
constinit PolicyName g_policy_names[kMaxSlots] = {};

DeviceCounters& DevCounters(int device) { return DeviceCountersFor(device); }

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

// Called with g_slots_mu held and `ctx` current on this thread.
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
  int vmm_supported = 0;
  if (real.cuDeviceGetAttribute != nullptr) {
    (void)real.cuDeviceGetAttribute(
        &vmm_supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device);
  }
  const bool vmm_calls = real.cuMemAddressReserve != nullptr && real.cuMemCreate != nullptr &&
                         real.cuMemMap != nullptr && real.cuMemSetAccess != nullptr &&
                         real.cuMemUnmap != nullptr && real.cuMemRelease != nullptr &&
                         real.cuMemAddressFree != nullptr &&
                         real.cuMemGetAllocationGranularity != nullptr;
  char* policy = g_policy_names[index].text;
  if (config.policy[0] != '\0') {
    memcpy(policy, config.policy, sizeof(g_policy_names[index].text) - 1);
  } else {
    strcpy(policy, vmm_supported && vmm_calls && config.use_vmm ? "vmm" : "segments");
  }
  bool use_vmm = vmm_supported && vmm_calls && config.use_vmm && strcmp(policy, "segments") != 0;
  std::size_t granularity = 0;
  if (use_vmm) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    if (real.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
            CUDA_SUCCESS ||
        granularity == 0) {
      use_vmm = false;
      strcpy(policy, "segments");
    }
  }
  // VMM memory is reachable only from devices granted access, whereas cuMemAlloc memory is
  // reachable from any peer once the application enables peer access: grant every device that
  // can access this one, so pooled memory behaves like cuMemAlloc memory.
  CUmemAccessDesc access[kMaxDevices] = {};
  int access_count = 0;
  access[access_count].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access[access_count].location.id = device;
  access[access_count++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  int device_count = 0;
  if (use_vmm && real.cuDeviceGetCount != nullptr && real.cuDeviceCanAccessPeer != nullptr &&
      real.cuDeviceGetCount(&device_count) == CUDA_SUCCESS) {
    for (int peer = 0; peer < device_count && access_count < kMaxDevices; ++peer) {
      int can = 0;
      if (peer == device || real.cuDeviceCanAccessPeer(&can, peer, device) != CUDA_SUCCESS ||
          !can) {
        continue;
      }
      access[access_count].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access[access_count].location.id = peer;
      access[access_count++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
  }
  slot->upstream.Configure(ctx, device, use_vmm, granularity, access, access_count);
  if (use_vmm) slot->upstream.SetShareableType(IpcShareableType(device));
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

Slot* ScanFor(CUcontext ctx) {
  const int count = g_slot_count.load(std::memory_order_acquire);
  for (int i = 0; i < count; ++i) {
    Slot* slot = g_slots[i].load(std::memory_order_acquire);
    if (slot != nullptr && slot->ctx == ctx && !slot->dead.load(std::memory_order_acquire)) {
      return slot;
    }
  }
  return nullptr;
}

void MarkDead(Slot* slot, bool context_alive) {
  slot->dead.store(true, std::memory_order_release);
  slot->upstream.Abandon(context_alive);
  slot->fences.MarkDead();
  // Its streams went with it (a stream handle may come back for another context).
  ForgetContextStreams(slot->ctx);
}

// The pending bytes at which an allocation of `bytes` synchronises (when that is cheap) rather
// than grow: enough that one synchronisation frees many blocks of this size (256), so its few
// microseconds cost the hot path a few nanoseconds per pair, but at most 256 MiB, and never less
// than the request itself. So while one size is allocated and freed in a loop the pool holds at
// most 256 MiB (at least 4 MiB) more than without the amortisation, as cache that a pressure
// synchronisation turns back into free memory; blocks over 1 MiB get fewer blocks per
// synchronisation, which their size amortises instead. At half of it the helper thread is asked
// to synchronise in the background, so in a steady loop the allocating thread never waits.
std::uint64_t ReuseSyncThreshold(std::uint64_t bytes) {
  constexpr std::uint64_t kBlocksPerSync = 256;
  constexpr std::uint64_t kFloor = std::uint64_t{4} << 20;
  constexpr std::uint64_t kCap = std::uint64_t{256} << 20;
  return std::max(bytes, std::min(std::max(kBlocksPerSync * bytes, kFloor), kCap));
}

// Amortised fence after a pooled free (pool mode). One batch of frees or pending bytes asks the
// helper thread for a synchronisation; if the helper lags so far behind that kInlineBatches
// batches are pending, the freeing thread synchronises itself (what the driver's free always
// does), which bounds the memory held for pending frees.
__attribute__((noinline)) void MaybeSyncDue(Slot* slot, std::uint64_t frees,
                                            std::uint64_t pending) {
  const Config& config = Cfg();
  const std::uint64_t batch_bytes = slot->fences.batch_bytes;
  constexpr std::uint64_t kInlineBatches = 4;
  if (frees >= kInlineBatches * config.fence_batch_frees ||
      pending >= kInlineBatches * batch_bytes ||
      (!config.fence_async && (frees >= config.fence_batch_frees || pending >= batch_bytes))) {
    (void)slot->fences.Sync();
  } else if (frees >= config.fence_batch_frees || pending >= batch_bytes) {
    if (!RequestBackgroundSync(slot)) (void)slot->fences.Sync();
  }
}

// Event fences (stream_fence.h): a round is asked for after this many bytes or frees since the
// last one. A round costs the helper thread one cuEventRecord per stream that had work, and the
// freeing thread one store (a futex wake when the helper sleeps), so rounds are frequent: a
// freed block waits about the GPU's lag behind the CPU, not for a batch to fill.
constexpr std::uint64_t kRoundBytes = std::uint64_t{8} << 20;
constexpr std::uint64_t kRoundFrees = 64;

bool EventMode() { return Cfg().mode == Mode::kPool && EventFencesOn(); }

__attribute__((noinline)) void AskForRound(Slot* slot) {
  // Nothing queued on any stream since the last round: no event to record, no reason to wake
  // the helper.
  if (CompleteIfIdle(slot)) return;
  if (!Cfg().fence_async) {
    // No helper thread: the freeing thread records the round (non-blocking) and polls.
    if (!IssueEventRound()) (void)slot->fences.Sync();
    PollSlotEventFences(slot);
    return;
  }
  if (slot->sync_requested.load(std::memory_order_relaxed)) return;
  if (!RequestBackgroundSync(slot) && !IssueEventRound()) (void)slot->fences.Sync();
}

// The free path's check: below one batch (the common case) nothing is due.
__attribute__((always_inline)) inline void MaybeSync(Slot* slot, std::uint64_t frees) {
  const std::uint64_t pending = slot->pool->PendingBytesRelaxed();
  if (EventMode()) {
    const EventFenceRing& ring = slot->event_fences;
    if (ring.bytes_since_round.load(std::memory_order_relaxed) >= kRoundBytes ||
        ring.frees_since_round.load(std::memory_order_relaxed) >= kRoundFrees) {
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

}  // namespace

// --- DriverUpstream ------------------------------------------------------------------------

void DriverUpstream::Configure(CUcontext ctx, int device, bool vmm, std::size_t granularity,
                               const CUmemAccessDesc* access, int access_count) {
  ctx_ = ctx;
  device_ = device;
  vmm_ = vmm;
  granularity_ = granularity;
  access_count_ = std::min(access_count, kMaxDevices);
  for (int i = 0; i < access_count_; ++i) access_[i] = access[i];
}

void DriverUpstream::Reserved(std::uintptr_t address, std::size_t bytes) {
  DevCounters(device_).reserved_bytes.Add(bytes);
  if (RingWriter* ring = Ring()) {
    (void)ring->RecordPoolReserve(static_cast<std::uint32_t>(device_), address, bytes);
    state_due_.store(true, std::memory_order_relaxed);
  }
}

void DriverUpstream::Released(std::uintptr_t address, std::size_t bytes) {
  DevCounters(device_).reserved_bytes.Sub(bytes);
  if (RingWriter* ring = Ring()) {
    (void)ring->RecordPoolRelease(static_cast<std::uint32_t>(device_), address, bytes);
    state_due_.store(true, std::memory_order_relaxed);
  }
}

bool DriverUpstream::Usable() const { return !dead_.load(std::memory_order_acquire) && !Exiting(); }

pool::UpstreamStatus DriverUpstream::FromDriver(CUresult result) {
  t_upstream_error = result;
  switch (result) {
    case CUDA_SUCCESS:
      return pool::UpstreamStatus::kOk;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return pool::UpstreamStatus::kOutOfMemory;
    case CUDA_ERROR_INVALID_VALUE:
      return pool::UpstreamStatus::kInvalidArgument;
    case CUDA_ERROR_NOT_SUPPORTED:
      return pool::UpstreamStatus::kNotSupported;
    default:
      return pool::UpstreamStatus::kError;
  }
}

bool DriverUpstream::OwnsAddress(std::uintptr_t address) const {
  pthread_mutex_lock(&mu_);
  bool owns = false;
  auto it = held_.upper_bound(address);
  if (it != held_.begin()) {
    --it;
    owns = address < it->first + it->second;
  }
  pthread_mutex_unlock(&mu_);
  return owns;
}

void DriverUpstream::Abandon(bool context_alive) {
  if (dead_.exchange(true, std::memory_order_acq_rel)) return;
  std::map<std::uintptr_t, std::size_t> mapped;
  std::map<std::uintptr_t, std::size_t> held;
  pthread_mutex_lock(&mu_);
  mapped.swap(mapped_);
  held.swap(held_);
  pthread_mutex_unlock(&mu_);
  for (const auto& [address, size] : (vmm_ ? mapped : held)) Released(address, size);
  if (!vmm_ || Exiting()) return;
  const RealDriver& real = Real();
  if (context_alive) {
    DriverCallScope scope(ctx_);
    if (scope.ok()) (void)real.cuCtxSynchronize();
  }
  DriverCallScope scope(nullptr);
  for (const auto& [address, size] : mapped) (void)real.cuMemUnmap(address, size);
  for (const auto& [address, size] : held) (void)real.cuMemAddressFree(address, size);
}

pool::UpstreamStatus DriverUpstream::Allocate(std::size_t bytes, std::uintptr_t* address) {
  if (!Usable()) return FromDriver(CUDA_ERROR_CONTEXT_IS_DESTROYED);
  DriverCallScope scope(ctx_);
  if (!scope.ok()) return FromDriver(CUDA_ERROR_INVALID_CONTEXT);
  CUdeviceptr pointer = 0;
  const CUresult result = Real().cuMemAlloc_v2(&pointer, bytes);
  DevCounters(device_).driver_alloc_calls.Add(1);
  if (result != CUDA_SUCCESS) return FromDriver(result);
  pthread_mutex_lock(&mu_);
  held_[pointer] = bytes;
  pthread_mutex_unlock(&mu_);
  Reserved(pointer, bytes);
  *address = pointer;
  return pool::UpstreamStatus::kOk;
}

pool::UpstreamStatus DriverUpstream::Free(std::uintptr_t address, std::size_t bytes) {
  pthread_mutex_lock(&mu_);
  auto it = held_.find(address);
  const bool known = it != held_.end();
  if (known) {
    bytes = it->second;
    held_.erase(it);
  }
  pthread_mutex_unlock(&mu_);
  if (!known) return FromDriver(CUDA_ERROR_INVALID_VALUE);
  Released(address, bytes);
  // A dead context took the memory with it; after exit began the driver may be gone.
  if (!Usable()) return pool::UpstreamStatus::kOk;
  if (fences_ != nullptr) fences_->BeforeReturningMemory();
  DriverCallScope scope(ctx_);
  const CUresult result = Real().cuMemFree_v2(address);
  DevCounters(device_).driver_free_calls.Add(1);
  if (result == CUDA_SUCCESS || result == CUDA_ERROR_DEINITIALIZED) {
    return pool::UpstreamStatus::kOk;
  }
  return FromDriver(result);
}

pool::UpstreamStatus DriverUpstream::ReserveRange(std::size_t bytes, std::uintptr_t* address) {
  if (!vmm_) return pool::UpstreamStatus::kNotSupported;
  if (!Usable()) return FromDriver(CUDA_ERROR_CONTEXT_IS_DESTROYED);
  DriverCallScope scope(ctx_);
  if (!scope.ok()) return FromDriver(CUDA_ERROR_INVALID_CONTEXT);
  CUdeviceptr pointer = 0;
  const CUresult result = Real().cuMemAddressReserve(&pointer, bytes, granularity_, 0, 0);
  if (result != CUDA_SUCCESS) return FromDriver(result);
  pthread_mutex_lock(&mu_);
  held_[pointer] = bytes;
  pthread_mutex_unlock(&mu_);
  *address = pointer;
  return pool::UpstreamStatus::kOk;
}

pool::UpstreamStatus DriverUpstream::ReleaseRange(std::uintptr_t address, std::size_t bytes) {
  if (!vmm_) return pool::UpstreamStatus::kNotSupported;
  pthread_mutex_lock(&mu_);
  auto it = held_.find(address);
  const bool known = it != held_.end();
  if (known) {
    bytes = it->second;
    held_.erase(it);
  }
  pthread_mutex_unlock(&mu_);
  if (!known) return FromDriver(CUDA_ERROR_INVALID_VALUE);
  if (!Usable()) return pool::UpstreamStatus::kOk;
  DriverCallScope scope(ctx_);
  const CUresult result = Real().cuMemAddressFree(address, bytes);
  if (result == CUDA_SUCCESS || result == CUDA_ERROR_DEINITIALIZED) {
    return pool::UpstreamStatus::kOk;
  }
  return FromDriver(result);
}

pool::UpstreamStatus DriverUpstream::Map(std::uintptr_t address, std::size_t bytes) {
  if (!vmm_) return pool::UpstreamStatus::kNotSupported;
  if (!Usable()) return FromDriver(CUDA_ERROR_CONTEXT_IS_DESTROYED);
  const RealDriver& real = Real();
  DriverCallScope scope(ctx_);
  if (!scope.ok()) return FromDriver(CUDA_ERROR_INVALID_CONTEXT);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_;
  prop.requestedHandleTypes = shareable_type();  // exportable for IPC (ipc.h)
  CUmemGenericAllocationHandle handle = 0;
  DevCounters(device_).driver_alloc_calls.Add(1);
  CUresult result = real.cuMemCreate(&handle, bytes, &prop, 0);
  if (result != CUDA_SUCCESS && result != CUDA_ERROR_OUT_OF_MEMORY &&
      prop.requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE) {
    // The device reported shareable memory but does not make it: plain memory from now on, and
    // IPC of pooled memory falls back to the old rule (ipc.h).
    VRAMSCOPE_LOG_ONCE(kWarn,
                       "device %d: cuMemCreate of shareable memory failed (%d); the pool's memory "
                       "is not shareable by IPC (VRAMSCOPE_MODE=passthrough shares it)",
                       device_, static_cast<int>(result));
    SetShareableType(CU_MEM_HANDLE_TYPE_NONE);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    result = real.cuMemCreate(&handle, bytes, &prop, 0);
  }
  if (result != CUDA_SUCCESS) return FromDriver(result);
  result = real.cuMemMap(address, bytes, 0, handle, 0);
  if (result != CUDA_SUCCESS) {
    (void)real.cuMemRelease(handle);
    return FromDriver(result);
  }
  result = real.cuMemSetAccess(address, bytes, access_, static_cast<std::size_t>(access_count_));
  if (result != CUDA_SUCCESS && access_count_ > 1) {
    // A peer refused: fall back to the owning device alone, like cuMemAlloc without peers.
    access_count_ = 1;
    result = real.cuMemSetAccess(address, bytes, access_, 1);
  }
  // The mapping keeps the physical memory alive; releasing the handle now means cuMemUnmap
  // alone gives the memory back.
  (void)real.cuMemRelease(handle);
  if (result != CUDA_SUCCESS) {
    (void)real.cuMemUnmap(address, bytes);
    return FromDriver(result);
  }
  pthread_mutex_lock(&mu_);
  mapped_[address] = bytes;
  pthread_mutex_unlock(&mu_);
  Reserved(address, bytes);
  return pool::UpstreamStatus::kOk;
}

pool::UpstreamStatus DriverUpstream::Unmap(std::uintptr_t address, std::size_t bytes) {
  if (!vmm_) return pool::UpstreamStatus::kNotSupported;
  // Unmap every mapping Map made inside [address, address + bytes): the pool may give back
  // several adjacent mappings at once, and the driver unmaps whole mappings only.
  std::pair<std::uintptr_t, std::size_t> ranges[64];
  int count = 0;
  bool more = true;
  pool::UpstreamStatus status = pool::UpstreamStatus::kOk;
  while (more) {
    count = 0;
    pthread_mutex_lock(&mu_);
    auto it = mapped_.lower_bound(address);
    while (it != mapped_.end() && it->first + it->second <= address + bytes && count < 64) {
      ranges[count++] = *it;
      it = mapped_.erase(it);
    }
    more = count == 64;
    pthread_mutex_unlock(&mu_);
    if (count != 0 && fences_ != nullptr && Usable()) fences_->BeforeReturningMemory();
    for (int i = 0; i < count; ++i) {
      Released(ranges[i].first, ranges[i].second);
      if (!Usable()) continue;
      DriverCallScope scope(ctx_);
      const CUresult result = Real().cuMemUnmap(ranges[i].first, ranges[i].second);
      DevCounters(device_).driver_free_calls.Add(1);
      if (result != CUDA_SUCCESS && result != CUDA_ERROR_DEINITIALIZED) {
        status = FromDriver(result);
      }
    }
  }
  return status;
}

// --- EpochFences -----------------------------------------------------------------------------

void EpochFences::Complete(std::uint64_t epoch) {
  std::uint64_t done = completed_.load(std::memory_order_relaxed);
  while (epoch > done &&
         !completed_.compare_exchange_weak(done, epoch, std::memory_order_acq_rel)) {
  }
  frees_since_sync.store(0, std::memory_order_relaxed);
  bytes_since_sync.store(0, std::memory_order_relaxed);
}

bool EpochFences::Sync(bool forced) {
  if (dead_.load(std::memory_order_acquire) || Exiting()) return false;
  if (AnyCaptureLive()) {
    if (!forced) {
      DevCounters(device_).syncs_skipped_capture.Add(1);
      return false;
    }
    DevCounters(device_).syncs_during_capture.Add(1);
  }
  // Frees stamped with `epoch` returned before this increment; the synchronisation below
  // starts after it, so it covers all the work they could have queued.
  const std::uint64_t epoch = epoch_.fetch_add(1, std::memory_order_seq_cst);
  DriverCallScope scope(ctx_);
  if (!scope.ok()) return false;
  timespec start{};
  clock_gettime(CLOCK_MONOTONIC, &start);
  const CUresult result = Real().cuCtxSynchronize();
  timespec end{};
  clock_gettime(CLOCK_MONOTONIC, &end);
  const std::int64_t took =
      (end.tv_sec - start.tv_sec) * 1000000000LL + (end.tv_nsec - start.tv_nsec);
  const std::uint64_t sample = took > 0 ? static_cast<std::uint64_t>(took) : 0;
  const std::uint64_t average = sync_ns_.load(std::memory_order_relaxed);
  sync_ns_.store((7 * average + sample) / 8, std::memory_order_relaxed);
  DevCounters(device_).fence_syncs.Add(1);
  if (result != CUDA_SUCCESS) {
    VRAMSCOPE_LOG(kDebug, "device %d: cuCtxSynchronize for the free fence failed (%d)", device_,
                  static_cast<int>(result));
    return false;
  }
  Complete(epoch);
  return true;
}

void EpochFences::EndUserSync(std::uint64_t epoch, CUresult result) {
  if (result != CUDA_SUCCESS) return;
  Complete(epoch);
  DevCounters(device_).user_syncs.Add(1);
}

void EpochFences::Wait(std::uint64_t fence) {
  if (IsComplete(fence) || Exiting()) return;
  if (!Sync(/*forced=*/true) && !IsComplete(fence)) {
    VRAMSCOPE_LOG_ONCE(kWarn, "device %d: cannot wait for a free's fence (cuCtxSynchronize failed)",
                       device_);
  }
}

// --- Slot table ------------------------------------------------------------------------------

namespace {

// The calling thread's last slot, if it is `ctx`'s and still valid: the allocation hot path.
__attribute__((always_inline)) inline Slot* CachedSlotFor(CUcontext ctx) {
  const std::uint64_t generation = g_generation.load(std::memory_order_acquire);
  if (t_cache.ctx == ctx && t_cache.generation == generation) return t_cache.slot;
  return nullptr;
}

__attribute__((noinline)) Slot* SlotForCurrentContextSlow(CUcontext ctx) {
  const std::uint64_t generation = g_generation.load(std::memory_order_acquire);
  Slot* slot = ScanFor(ctx);
  if (slot == nullptr) {
    NoteOrderedContext(ctx);  // a second context ends ordered reuse (before taking the lock)
    pthread_mutex_lock(&g_slots_mu);
    slot = ScanFor(ctx);
    const int count = g_slot_count.load(std::memory_order_relaxed);
    if (slot == nullptr && count < kMaxSlots) {
      slot = CreateSlot(ctx, count);
      if (slot != nullptr) {
        g_slots[count].store(slot, std::memory_order_release);
        g_slot_count.store(count + 1, std::memory_order_release);
        // Ordered reuse may have ended between CreateSlot and the publication above, where the
        // end's EndSettling could not see this slot (idempotent).
        if (!OrderedOn()) slot->fences.EndSettling();
      }
    } else if (slot == nullptr) {
      VRAMSCOPE_LOG_ONCE(kWarn, "more than %d contexts: new contexts are not pooled", kMaxSlots);
    }
    pthread_mutex_unlock(&g_slots_mu);
  }
  if (slot != nullptr) t_cache = {ctx, slot, generation};
  return slot;
}

__attribute__((always_inline)) inline Slot* SlotFor(CUcontext ctx) {
  Slot* slot = CachedSlotFor(ctx);
  return slot != nullptr ? slot : SlotForCurrentContextSlow(ctx);
}

}  // namespace

Slot* SlotForCurrentContext(CUcontext ctx) { return SlotFor(ctx); }

Slot* ExistingSlot(CUcontext ctx) {
  Slot* slot = CachedSlotFor(ctx);
  return slot != nullptr ? slot : ScanFor(ctx);
}

int LiveSlots(Slot** out, int capacity) {
  const int count = g_slot_count.load(std::memory_order_acquire);
  int written = 0;
  for (int i = 0; i < count && written < capacity; ++i) {
    Slot* slot = g_slots[i].load(std::memory_order_acquire);
    if (slot != nullptr && slot->pool != nullptr && !slot->dead.load(std::memory_order_acquire)) {
      out[written++] = slot;
    }
  }
  return written;
}

Slot* FindPooledBlock(std::uintptr_t address, pool::BlockInfo* info) {
  Slot* slots[kMaxSlots];
  const int count = LiveSlots(slots, kMaxSlots);
  for (int i = 0; i < count; ++i) {
    if (slots[i]->pool->Lookup(address, info) == pool::PoolStatus::kOk) return slots[i];
  }
  return nullptr;
}

Slot* FindOwner(std::uintptr_t address) {
  Slot* slots[kMaxSlots];
  const int count = LiveSlots(slots, kMaxSlots);
  for (int i = 0; i < count; ++i) {
    if (slots[i]->upstream.OwnsAddress(address)) return slots[i];
  }
  return nullptr;
}

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
    MaybeSync(slot, frees);
  }
  MaybeRecordPoolState(slot, /*after_free=*/true);
  return ShimStatus::kOk;
}

}  // namespace

ShimStatus FreePooled(std::uintptr_t address, bool strict) {
  // An exported block that importers hold open stays allocated until they closed it (ipc.h).
  if (IpcExportsLive()) [[unlikely]] {
    if (const int deferred = IpcDeferFree(address); deferred != 0) {
      return deferred > 0 ? ShimStatus::kOk : ShimStatus::kInvalidValue;
    }
  }
  // Route by address, not by the current device: the calling thread may have another device
  // current, or no context at all. The thread's last slot is the likely owner: try it first.
  const std::uint64_t generation = g_generation.load(std::memory_order_acquire);
  Slot* cached = t_cache.generation == generation ? t_cache.slot : nullptr;
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

namespace {

enum class ReuseSync { kNone, kInline };

// Reuse rather than grow: when plenty of freed memory waits for its fence (ReuseSyncDue) and
// synchronisations have been cheap lately (the program keeps the GPU's queue short, e.g. it
// copies results back every iteration), synchronise now: a few microseconds, amortised over
// many blocks, instead of growing. A program that runs far ahead of the GPU (expensive
// synchronisations) grows instead of stalling. Lock-free checks only: this is the hot path.
// Asks the helper thread for a synchronisation where that is due; kInline: the caller should
// take a cached block or else synchronise itself before growing.
ReuseSync ReuseSyncPolicy(Slot* slot, std::size_t bytes) {
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

bool LagWaitDue(Slot* slot, std::size_t bytes) {
  const std::uint64_t fraction = Cfg().fence_lag_fraction;
  if (fraction == 0) return false;
  const std::uint64_t pending = slot->pool->PendingBytesRelaxed();
  if (pending < bytes || pending < kLagFloor) return false;
  const std::uint64_t reserved = DevCounters(slot->device).reserved_bytes.current.load();
  return pending >= reserved / fraction && !AnyCaptureLive();
}

// Event mode, much freed memory still waiting: wait for the oldest fences (issuing a round
// first when none is queued) until a held block serves the request. False: grow instead.
bool EventLagWait(Slot* slot, std::size_t bytes, std::uintptr_t* address, pool::BlockSizes* sizes) {
  for (int i = 0; i < kMaxLagWaits && LagWaitDue(slot, bytes); ++i) {
    if (!WaitOldestEventFence(slot) && !IssueEventRound()) return false;
    if (slot->pool->AllocateCached(bytes, address, sizes) == pool::PoolStatus::kOk) return true;
  }
  return false;
}

}  // namespace

ShimStatus AllocatePooled(CUcontext ctx, std::size_t bytes, std::uintptr_t* address,
                          CUresult* driver_error) {
  Slot* slot = SlotFor(ctx);
  if (slot == nullptr || slot->pool == nullptr) return ShimStatus::kNotOurs;
  t_upstream_error = CUDA_SUCCESS;
  pool::BlockSizes sizes;
  if (EventMode() && LagWaitDue(slot, bytes)) {
    if (slot->pool->AllocateCached(bytes, address, &sizes) == pool::PoolStatus::kOk ||
        EventLagWait(slot, bytes, address, &sizes)) {
      RingPooledAlloc(slot, *address, sizes.requested, sizes.allocated);
      return ShimStatus::kOk;
    }
  } else if (ReuseSyncPolicy(slot, bytes) == ReuseSync::kInline) {
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
  *driver_error = t_upstream_error != CUDA_SUCCESS ? t_upstream_error : CUDA_ERROR_UNKNOWN;
  return ShimStatus::kDriverError;
}

ShimStatus AllocateCachedPooled(CUcontext ctx, std::size_t bytes, std::uintptr_t* address) {
  Slot* slot = SlotFor(ctx);
  if (slot == nullptr || slot->pool == nullptr) return ShimStatus::kNotOurs;
  pool::BlockSizes sizes;
  // The same reuse policy as AllocatePooled; where it would synchronise inline, a miss here
  // leaves that to it.
  (void)ReuseSyncPolicy(slot, bytes);
  if (slot->pool->AllocateCached(bytes, address, &sizes) != pool::PoolStatus::kOk) {
    return ShimStatus::kUnavailable;
  }
  RingPooledAlloc(slot, *address, sizes.requested, sizes.allocated);
  return ShimStatus::kOk;
}

CUresult LastUpstreamError() { return t_upstream_error; }

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
  pthread_mutex_lock(&g_slots_mu);
  const int count = g_slot_count.load(std::memory_order_relaxed);
  for (int i = 0; i < count; ++i) {
    Slot* slot = g_slots[i].load(std::memory_order_relaxed);
    if (slot != nullptr && slot->ctx == ctx && !slot->dead.load(std::memory_order_relaxed)) {
      MarkDead(slot, /*context_alive=*/false);
      VRAMSCOPE_LOG(kInfo, "context %p destroyed: its pool is dropped", static_cast<void*>(ctx));
    }
  }
  g_generation.fetch_add(1, std::memory_order_acq_rel);
  pthread_mutex_unlock(&g_slots_mu);
}

void DropPrimaryContext(int device, bool context_alive) {
  pthread_mutex_lock(&g_slots_mu);
  const int count = g_slot_count.load(std::memory_order_relaxed);
  for (int i = 0; i < count; ++i) {
    Slot* slot = g_slots[i].load(std::memory_order_relaxed);
    if (slot != nullptr && slot->primary && slot->device == device &&
        !slot->dead.load(std::memory_order_relaxed)) {
      MarkDead(slot, context_alive);
      VRAMSCOPE_LOG(kInfo, "device %d: primary context reset, its pool is dropped", device);
    }
  }
  g_generation.fetch_add(1, std::memory_order_acq_rel);
  pthread_mutex_unlock(&g_slots_mu);
}

void LockSlotsForFork() { pthread_mutex_lock(&g_slots_mu); }
void UnlockSlotsAfterFork() { pthread_mutex_unlock(&g_slots_mu); }

void ForgetSlotsInChild() {
  // The child must not touch the parent's pools (their locks may be held by threads that do
  // not exist here, their memory belongs to the parent's context): leak them.
  const int count = g_slot_count.load(std::memory_order_relaxed);
  for (int i = 0; i < count; ++i) g_slots[i].store(nullptr, std::memory_order_relaxed);
  g_slot_count.store(0, std::memory_order_release);
  g_generation.fetch_add(1, std::memory_order_acq_rel);
  t_cache = {};
}

const char* RefreshPoolFigures() {
  const char* policy = nullptr;
  for (int device = 0; device < kMaxDevices; ++device) {
    DeviceCounters& counters = DeviceCountersFor(device);
    std::uint64_t values[9] = {};
    const int count = g_slot_count.load(std::memory_order_acquire);
    for (int i = 0; i < count; ++i) {
      Slot* slot = g_slots[i].load(std::memory_order_acquire);
      if (slot == nullptr || slot->pool == nullptr || slot->device != device) continue;
      if (policy == nullptr) policy = g_policy_names[i].text;
      const pool::PoolStats stats = slot->pool->Stats();
      const bool live = !slot->dead.load(std::memory_order_acquire);
      if (live) {
        values[0] += stats.current_requested_bytes;
        values[2] += stats.current_allocated_bytes;
        values[4] += stats.free_bytes;
        values[5] += stats.pending_bytes;
      }
      values[1] = std::max<std::uint64_t>(values[1], stats.peak_requested_bytes);
      values[3] = std::max<std::uint64_t>(values[3], stats.peak_allocated_bytes);
      values[6] += stats.alloc_count;
      values[7] += stats.free_count;
      values[8] += stats.oom_count;
    }
    counters.current_requested_bytes.value.store(values[0], std::memory_order_relaxed);
    counters.peak_requested_bytes.value.store(values[1], std::memory_order_relaxed);
    counters.current_allocated_bytes.value.store(values[2], std::memory_order_relaxed);
    counters.peak_allocated_bytes.value.store(values[3], std::memory_order_relaxed);
    counters.idle_bytes.value.store(values[4], std::memory_order_relaxed);
    counters.pending_bytes.value.store(values[5], std::memory_order_relaxed);
    counters.allocs.value.store(values[6], std::memory_order_relaxed);
    counters.frees.value.store(values[7], std::memory_order_relaxed);
    counters.oom.value.store(values[8], std::memory_order_relaxed);
  }
  return policy;
}

}  // namespace vramscope::interposer
