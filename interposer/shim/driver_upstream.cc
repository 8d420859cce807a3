#include "driver_upstream.h"

#include <string.h>

#include <algorithm>
#include <bit>

#include "capture.h"
#include "driver.h"
#include "epoch_fences.h"
#include "log.h"
#include "ring_events.h"
#include "state.h"

namespace vramscope::interposer {
namespace {

__attribute__((tls_model("initial-exec"))) constinit thread_local CUresult t_upstream_error =
    CUDA_SUCCESS;

// The policy name buffers the slot table hands out (slots.h) hold 32 bytes.
constexpr std::size_t kPolicyBytes = 32;

DeviceCounters& DevCounters(int device) { return DeviceCountersFor(device); }

// The handle type the pools create physical memory with, for IPC of pooled memory (ipc.h): POSIX
// fd where the device supports it and VRAMSCOPE_IPC is not 0, else CU_MEM_HANDLE_TYPE_NONE.
CUmemAllocationHandleType ShareableTypeFor(int device) {
  const RealDriver& real = Real();
  if (!Cfg().ipc || real.cuDeviceGetAttribute == nullptr ||
      real.cuMemExportToShareableHandle == nullptr || real.cuMemRetainAllocationHandle == nullptr) {
    return CU_MEM_HANDLE_TYPE_NONE;
  }
  int supported = 0;
  if (real.cuDeviceGetAttribute(&supported,
                                CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                device) != CUDA_SUCCESS ||
      !supported) {
    return CU_MEM_HANDLE_TYPE_NONE;
  }
  return CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

}  // namespace

CUresult LastUpstreamError() { return t_upstream_error; }
void ClearUpstreamError() { t_upstream_error = CUDA_SUCCESS; }

std::size_t ConfigureDriverUpstream(DriverUpstream* upstream, CUcontext ctx, int device,
                                    const Config& config, char* policy_buffer) {
  const RealDriver& real = Real();
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
  char* policy = policy_buffer;
  if (config.policy[0] != '\0') {
    memcpy(policy, config.policy, kPolicyBytes - 1);
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
  upstream->Configure(ctx, device, use_vmm, granularity, access, access_count,
                      config.vmm_piece_bytes);
  if (use_vmm) upstream->SetShareableType(ShareableTypeFor(device));
  return granularity;
}

void DriverUpstream::Configure(CUcontext ctx, int device, bool vmm, std::size_t granularity,
                               const CUmemAccessDesc* access, int access_count, std::size_t piece) {
  ctx_ = ctx;
  device_ = device;
  vmm_ = vmm;
  granularity_ = granularity;
  // A power-of-two multiple of the granularity, or none.
  piece_ = vmm && granularity != 0 && piece >= granularity && piece % granularity == 0 &&
                   std::has_single_bit(piece)
               ? piece
               : 0;
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
  std::vector<Deferred> deferred;
  pthread_mutex_lock(&deferred_mu_);
  deferred.swap(deferred_);
  deferred_count_.store(0, std::memory_order_release);
  pthread_mutex_unlock(&deferred_mu_);
  for (const auto& [address, size] : (vmm_ ? mapped : held)) Released(address, size);
  for (const Deferred& d : deferred) {
    if (!d.aliased) Released(d.address, d.bytes);  // an aliased one is counted where it went
    mapped[d.address] = d.bytes;
  }
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
  if (HasDeferred() && DeferredOverlaps(address, bytes, 0)) FlushDeferred();
  DriverCallScope scope(ctx_);
  const CUresult result = Real().cuMemAddressFree(address, bytes);
  if (result == CUDA_SUCCESS || result == CUDA_ERROR_DEINITIALIZED) {
    return pool::UpstreamStatus::kOk;
  }
  return FromDriver(result);
}

pool::UpstreamStatus DriverUpstream::Map(std::uintptr_t address, std::size_t bytes) {
  if (!vmm_) return pool::UpstreamStatus::kNotSupported;
  if (HasDeferred()) {
    ReapDeferred(/*all=*/false);
    if (DeferredOverlaps(address, bytes, MapPieceBytes(bytes))) FlushDeferred();
  }
  pool::UpstreamStatus status = MapPieces(address, bytes);
  if (status != pool::UpstreamStatus::kOk && HasDeferred()) {
    // The deferred pieces still hold their memory (or an address the driver found mapped): give
    // them back and try once more.
    FlushDeferred();
    status = MapPieces(address, bytes);
  }
  return status;
}

pool::UpstreamStatus DriverUpstream::MapPieces(std::uintptr_t address, std::size_t bytes) {
  if (!Usable()) return FromDriver(CUDA_ERROR_CONTEXT_IS_DESTROYED);
  const RealDriver& real = Real();
  DriverCallScope scope(ctx_);
  if (!scope.ok()) return FromDriver(CUDA_ERROR_INVALID_CONTEXT);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_;
  prop.requestedHandleTypes = shareable_type();  // exportable for IPC (ipc.h)
  // One physical handle per piece (cut at the multiples of the piece size), mapped in turn; one
  // access grant for the whole range. A deferred piece inside a piece's window is taken back as
  // it is, and the window's rest mapped around it (Map let at most kMaxMapPieces of them in).
  const std::size_t piece = MapPieceBytes(bytes);
  std::pair<std::uintptr_t, std::size_t> pieces[3 * kMaxMapPieces];
  int count = 0;
  bool took_back = false;
  CUresult result = CUDA_SUCCESS;
  for (std::uintptr_t at = address; at < address + bytes && result == CUDA_SUCCESS;) {
    const std::uintptr_t window_end = pool::PieceEnd(at, address + bytes, piece);
    std::uintptr_t stop = at + TakeBackDeferred(at, window_end);
    took_back = took_back || stop != at;
    if (stop == at) {
      stop = NextDeferredStart(at, window_end);
      result =
          MapDeferred(at, stop - at, address, bytes) ? CUDA_SUCCESS : MapOne(&prop, at, stop - at);
    }
    if (result == CUDA_SUCCESS) pieces[count++] = {at, stop - at};
    at = stop;
  }
  if (result == CUDA_SUCCESS) {
    result = real.cuMemSetAccess(address, bytes, access_, static_cast<std::size_t>(access_count_));
    if (result != CUDA_SUCCESS && access_count_ > 1) {
      // A peer refused: fall back to the owning device alone, like cuMemAlloc without peers.
      access_count_ = 1;
      result = real.cuMemSetAccess(address, bytes, access_, 1);
    }
  }
  if (result != CUDA_SUCCESS) {
    // A piece taken back was deferred because work queued before its handover may still use it:
    // it goes back to the driver as a deferred piece would be flushed.
    if (took_back && fences_ != nullptr) fences_->BeforeReturningMemory();
    for (int i = 0; i < count; ++i) (void)real.cuMemUnmap(pieces[i].first, pieces[i].second);
    return FromDriver(result);
  }
  pthread_mutex_lock(&mu_);
  for (int i = 0; i < count; ++i) mapped_[pieces[i].first] = pieces[i].second;
  pthread_mutex_unlock(&mu_);
  Reserved(address, bytes);
  return pool::UpstreamStatus::kOk;
}

CUresult DriverUpstream::MapOne(CUmemAllocationProp* prop, std::uintptr_t address,
                                std::size_t bytes) {
  const RealDriver& real = Real();
  CUmemGenericAllocationHandle handle = 0;
  DevCounters(device_).driver_alloc_calls.Add(1);
  CUresult result = real.cuMemCreate(&handle, bytes, prop, 0);
  if (result != CUDA_SUCCESS && result != CUDA_ERROR_OUT_OF_MEMORY &&
      prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE) {
    // The device reported shareable memory but does not make it: plain memory from now on, and
    // IPC of pooled memory falls back to the old rule (ipc.h).
    VRAMSCOPE_LOG_ONCE(kWarn,
                       "device %d: cuMemCreate of shareable memory failed (%d); the pool's memory "
                       "is not shareable by IPC (VRAMSCOPE_MODE=passthrough shares it)",
                       device_, static_cast<int>(result));
    SetShareableType(CU_MEM_HANDLE_TYPE_NONE);
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    result = real.cuMemCreate(&handle, bytes, prop, 0);
  }
  if (result != CUDA_SUCCESS) return result;
  result = real.cuMemMap(address, bytes, 0, handle, 0);
  // The mapping keeps the physical memory alive; releasing the handle now means cuMemUnmap
  // alone gives the memory back.
  (void)real.cuMemRelease(handle);
  return result;
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
    if (count != 0 && fences_ != nullptr && Usable()) {
      // Blocks handed over to GPU-side waits whose rounds are still owed: unmapped once they are
      // retired, not after a synchronisation. With none owed, only ordered reuse's settled frees
      // can still be in use.
      const std::uint64_t cover = fences_->OwedToCover();
      fences_->WaitSettled();
      if (cover != 0) {
        Defer(ranges, count, cover);
        continue;
      }
    }
    for (int i = 0; i < count; ++i) {
      Released(ranges[i].first, ranges[i].second);
      const CUresult result = UnmapOne(ranges[i].first, ranges[i].second);
      if (result != CUDA_SUCCESS) status = FromDriver(result);
    }
  }
  return status;
}

CUresult DriverUpstream::UnmapOne(std::uintptr_t address, std::size_t bytes) {
  if (!Usable()) return CUDA_SUCCESS;  // a dead context took it; after exit, nothing is called
  DriverCallScope scope(ctx_);
  const CUresult result = Real().cuMemUnmap(address, bytes);
  DevCounters(device_).driver_free_calls.Add(1);
  return result == CUDA_ERROR_DEINITIALIZED ? CUDA_SUCCESS : result;
}

namespace {
constinit std::atomic<void (*)()> g_deferred_waker{nullptr};
}  // namespace

void DriverUpstream::SetDeferredWaker(void (*wake)()) {
  g_deferred_waker.store(wake, std::memory_order_release);
}

void DriverUpstream::Defer(const std::pair<std::uintptr_t, std::size_t>* ranges, int count,
                           std::uint64_t gen) {
  pthread_mutex_lock(&deferred_mu_);
  for (int i = 0; i < count; ++i) {
    deferred_.push_back({ranges[i].first, ranges[i].second, gen, /*aliased=*/false});
  }
  deferred_count_.store(static_cast<int>(deferred_.size()), std::memory_order_seq_cst);
  pthread_mutex_unlock(&deferred_mu_);
  Counters().deferred_unmaps.Add(static_cast<std::uint64_t>(count));
  // The helper may have retired the rounds just before it could see these pieces, or gone to
  // sleep with rounds still owed: wake it to poll until they are retired.
  if (fences_->owed_floor() > gen) ReapDeferred(/*all=*/false);
  if (void (*wake)() = g_deferred_waker.load(std::memory_order_acquire); wake != nullptr) wake();
}

bool DriverUpstream::MapDeferred(std::uintptr_t address, std::size_t bytes,
                                 std::uintptr_t map_start, std::size_t map_bytes) {
  if (!HasDeferred()) return false;
  const RealDriver& real = Real();
  if (real.cuMemRetainAllocationHandle == nullptr) return false;
  bool mapped = false;
  std::uintptr_t from = 0;
  pthread_mutex_lock(&deferred_mu_);
  for (Deferred& d : deferred_) {
    // Never one inside the mapping being made: that one is taken back where it is.
    if (d.aliased || d.bytes != bytes ||
        (d.address < map_start + map_bytes && map_start < d.address + d.bytes)) {
      continue;
    }
    CUmemGenericAllocationHandle handle = 0;
    if (real.cuMemRetainAllocationHandle(&handle, reinterpret_cast<void*>(d.address)) !=
        CUDA_SUCCESS) {
      continue;
    }
    mapped = real.cuMemMap(address, bytes, 0, handle, 0) == CUDA_SUCCESS;
    (void)real.cuMemRelease(handle);
    if (!mapped) break;
    d.aliased = true;
    from = d.address;
    break;
  }
  pthread_mutex_unlock(&deferred_mu_);
  if (!mapped) return false;
  // The memory moves: counted at the new address from here (Map's Reserved), no longer at the
  // old one, whose mapping goes when its rounds are retired.
  Released(from, bytes);
  Counters().deferred_reused.Add(1);
  return true;
}

void DriverUpstream::ReapDeferred(bool all) {
  if (!HasDeferred()) return;
  pthread_mutex_lock(&deferred_mu_);
  const std::uint64_t floor = fences_ != nullptr ? fences_->owed_floor() : EpochFences::kNoneOwed;
  std::size_t kept = 0;
  for (const Deferred& d : deferred_) {
    if (!all && d.gen >= floor) {
      deferred_[kept++] = d;
      continue;
    }
    if (!d.aliased) Released(d.address, d.bytes);
    if (const CUresult result = UnmapOne(d.address, d.bytes); result != CUDA_SUCCESS) {
      VRAMSCOPE_LOG_ONCE(kWarn, "device %d: cuMemUnmap of a deferred piece failed (%d)", device_,
                         static_cast<int>(result));
    }
  }
  deferred_.resize(kept);
  deferred_count_.store(static_cast<int>(kept), std::memory_order_seq_cst);
  pthread_mutex_unlock(&deferred_mu_);
}

bool DriverUpstream::DeferredOverlaps(std::uintptr_t address, std::size_t bytes,
                                      std::size_t piece) const {
  pthread_mutex_lock(&deferred_mu_);
  bool overlaps = false;
  int inside = 0;
  for (const Deferred& d : deferred_) {
    const std::uintptr_t end = d.address + d.bytes;
    if (d.address >= address + bytes || address >= end) continue;
    // One inside the new mapping and inside one of its pieces' windows is taken back as it is
    // (MapPieces); the pool's chunks of the new mapping then hold it whole.
    const bool fits = piece != 0 && !d.aliased && d.address >= address && end <= address + bytes &&
                      d.address / piece == (end - 1) / piece;
    overlaps = overlaps || !fits || ++inside > kMaxMapPieces;
  }
  pthread_mutex_unlock(&deferred_mu_);
  return overlaps;
}

std::size_t DriverUpstream::TakeBackDeferred(std::uintptr_t address, std::uintptr_t limit) {
  if (!HasDeferred()) return 0;
  std::size_t bytes = 0;
  pthread_mutex_lock(&deferred_mu_);
  for (std::size_t i = 0; i < deferred_.size() && bytes == 0; ++i) {
    const Deferred& d = deferred_[i];
    if (d.address != address || d.address + d.bytes > limit || d.aliased) continue;
    bytes = d.bytes;
    deferred_[i] = deferred_.back();
    deferred_.pop_back();
    deferred_count_.store(static_cast<int>(deferred_.size()), std::memory_order_seq_cst);
  }
  pthread_mutex_unlock(&deferred_mu_);
  if (bytes == 0) return 0;
  // Still counted as reserved; Map's Reserved counts the whole mapping again.
  Released(address, bytes);
  Counters().deferred_reused.Add(1);
  return bytes;
}

std::uintptr_t DriverUpstream::NextDeferredStart(std::uintptr_t after, std::uintptr_t limit) const {
  if (!HasDeferred()) return limit;
  pthread_mutex_lock(&deferred_mu_);
  std::uintptr_t next = limit;
  for (const Deferred& d : deferred_) {
    if (d.address > after && d.address < next) next = d.address;
  }
  pthread_mutex_unlock(&deferred_mu_);
  return next;
}

void DriverUpstream::FlushDeferred() {
  Counters().deferred_flushes.Add(1);
  // Synchronises unless one already covered every handover (EpochFences::BeforeReturningMemory).
  if (fences_ != nullptr && Usable()) fences_->BeforeReturningMemory();
  ReapDeferred(/*all=*/true);
}

int DriverUpstream::MappingsCovering(std::uintptr_t address, std::size_t bytes,
                                     std::pair<std::uintptr_t, std::size_t>* out,
                                     int capacity) const {
  pthread_mutex_lock(&mu_);
  int count = 0;
  auto it = mapped_.upper_bound(address);
  if (it != mapped_.begin()) --it;
  std::uintptr_t at = it == mapped_.end() ? 0 : it->first;
  const std::uintptr_t end = address + bytes;
  bool ok = it != mapped_.end() && it->first <= address;
  while (ok && at < end) {
    if (it == mapped_.end() || it->first != at || count == capacity) {
      ok = false;
      break;
    }
    out[count++] = *it;
    at += it->second;
    ++it;
  }
  pthread_mutex_unlock(&mu_);
  return ok ? count : -1;
}

}  // namespace vramscope::interposer
