// Every other way to take memory from the driver: passed through unchanged and recorded by
// kind (counters.h), so the shim's totals equal what the driver holds for the process. A driver
// OOM on these calls gives the pools' idle memory back and retries once.
//
// Graph memory: cuMemAllocAsync on a capturing stream creates graph-owned memory (allocated
// when the graph launches, owned by the graph); it is passed through and not recorded.
// cuGraphAddMemAllocNode and arrays (cuArrayCreate/cuArray3DCreate) are not hooked yet.
#include "capture.h"
#include "counters.h"
#include "device_pools.h"
#include "hooks.h"
#include "registry.h"

using namespace vramscope::interposer;

namespace vramscope::interposer {
namespace {

bool Recording() { return Active(); }

// Frees `dptr` if a pool holds it (a cudaFreeAsync of cudaMalloc memory, legal and
// stream-ordered: the epoch fence covers the stream). kNotOurs otherwise.
ShimStatus FreeIfPooled(CUdeviceptr dptr) {
  if (dptr == 0 || !(Active() || Exiting())) return ShimStatus::kNotOurs;
  Slot* slot = nullptr;
  if (LiveSlots(&slot, 1) == 0) return ShimStatus::kNotOurs;
  return FreePooled(dptr, Cfg().mode == Mode::kStrict);
}

CUresult FreeAsync(decltype(&::cuMemFreeAsync) real_free, CUdeviceptr dptr, CUstream stream) {
  switch (FreeIfPooled(dptr)) {
    case ShimStatus::kOk:
      return CUDA_SUCCESS;
    case ShimStatus::kInvalidValue:
      return CUDA_ERROR_INVALID_VALUE;
    default:
      break;
  }
  const CUresult result = real_free(dptr, stream);
  if (result == CUDA_SUCCESS && Recording()) {
    (void)RecordFree(RegistryId::kDevicePointers, dptr, nullptr,
                     reinterpret_cast<std::uintptr_t>(stream));
  }
  return result;
}

// Stream-ordered allocations on a capturing stream belong to the graph.
bool GraphOwned(decltype(&::cuStreamIsCapturing) is_capturing, CUstream stream) {
  if (!AnyCaptureLive() || is_capturing == nullptr) return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return is_capturing(stream, &status) == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE;
}

void RecordAsync(CUresult result, CUdeviceptr* dptr, size_t bytes, bool graph, CUstream stream) {
  if (result == CUDA_SUCCESS && dptr != nullptr && Recording() && !graph) {
    AllocOrigin origin;
    origin.stream = reinterpret_cast<std::uintptr_t>(stream);
    RecordAlloc(RegistryId::kDevicePointers, *dptr, bytes, Kind::kAsync, origin);
  }
}

void RecordGauge(Kind kind, std::int64_t bytes) {
  KindCounters& counters = Counters().kind[static_cast<int>(kind)];
  if (bytes >= 0) {
    counters.bytes.Add(static_cast<std::uint64_t>(bytes));
    counters.allocs.Add(1);
  } else {
    counters.bytes.Sub(static_cast<std::uint64_t>(-bytes));
    counters.frees.Add(1);
  }
}

}  // namespace
}  // namespace vramscope::interposer

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch,
                                                     size_t WidthInBytes, size_t Height,
                                                     unsigned int ElementSizeBytes) {
  VRAMSCOPE_PROLOGUE(cuMemAllocPitch_v2);
  const CUresult result = WithOomRetry([&] {
    return real.cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
  });
  if (result == CUDA_SUCCESS && Recording() && dptr != nullptr && pPitch != nullptr) {
    AllocOrigin origin;
    origin.requested = static_cast<std::uint64_t>(WidthInBytes) * Height;
    RecordAlloc(RegistryId::kDevicePointers, *dptr, *pPitch * Height, Kind::kPitch, origin);
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize,
                                                    unsigned int flags) {
  VRAMSCOPE_PROLOGUE(cuMemAllocManaged);
  const CUresult result =
      WithOomRetry([&] { return real.cuMemAllocManaged(dptr, bytesize, flags); });
  if (result == CUDA_SUCCESS && Recording() && dptr != nullptr) {
    RecordAlloc(RegistryId::kDevicePointers, *dptr, bytesize, Kind::kManaged);
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  VRAMSCOPE_PROLOGUE(cuMemHostAlloc);
  const CUresult result = real.cuMemHostAlloc(pp, bytesize, Flags);
  if (result == CUDA_SUCCESS && Recording() && pp != nullptr) {
    RecordAlloc(RegistryId::kHostPointers, reinterpret_cast<std::uintptr_t>(*pp), bytesize,
                Kind::kHost);
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemAllocHost_v2(void** pp, size_t bytesize) {
  VRAMSCOPE_PROLOGUE(cuMemAllocHost_v2);
  const CUresult result = real.cuMemAllocHost_v2(pp, bytesize);
  if (result == CUDA_SUCCESS && Recording() && pp != nullptr) {
    RecordAlloc(RegistryId::kHostPointers, reinterpret_cast<std::uintptr_t>(*pp), bytesize,
                Kind::kHost);
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemFreeHost(void* p) {
  VRAMSCOPE_PROLOGUE(cuMemFreeHost);
  const CUresult result = real.cuMemFreeHost(p);
  if (result == CUDA_SUCCESS && Recording()) {
    (void)RecordFree(RegistryId::kHostPointers, reinterpret_cast<std::uintptr_t>(p));
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemHostRegister_v2(void* p, size_t bytesize,
                                                       unsigned int Flags) {
  VRAMSCOPE_PROLOGUE(cuMemHostRegister_v2);
  const CUresult result = real.cuMemHostRegister_v2(p, bytesize, Flags);
  if (result == CUDA_SUCCESS && Recording()) {
    RecordAlloc(RegistryId::kHostPointers, reinterpret_cast<std::uintptr_t>(p), bytesize,
                Kind::kHostRegistered);
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemHostUnregister(void* p) {
  VRAMSCOPE_PROLOGUE(cuMemHostUnregister);
  const CUresult result = real.cuMemHostUnregister(p);
  if (result == CUDA_SUCCESS && Recording()) {
    (void)RecordFree(RegistryId::kHostPointers, reinterpret_cast<std::uintptr_t>(p));
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize,
                                                  CUstream hStream) {
  VRAMSCOPE_PROLOGUE(cuMemAllocAsync);
  const bool graph = GraphOwned(real.cuStreamIsCapturing, hStream);
  const CUresult result =
      graph ? real.cuMemAllocAsync(dptr, bytesize, hStream)
            : WithOomRetry([&] { return real.cuMemAllocAsync(dptr, bytesize, hStream); });
  RecordAsync(result, dptr, bytesize, graph, hStream);
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                       CUstream hStream) {
  VRAMSCOPE_PROLOGUE(cuMemAllocAsync_ptsz);
  const bool graph = GraphOwned(real.cuStreamIsCapturing_ptsz, hStream);
  const CUresult result =
      graph ? real.cuMemAllocAsync_ptsz(dptr, bytesize, hStream)
            : WithOomRetry([&] { return real.cuMemAllocAsync_ptsz(dptr, bytesize, hStream); });
  RecordAsync(result, dptr, bytesize, graph, hStream);
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize,
                                                          CUmemoryPool pool, CUstream hStream) {
  VRAMSCOPE_PROLOGUE(cuMemAllocFromPoolAsync);
  const bool graph = GraphOwned(real.cuStreamIsCapturing, hStream);
  const CUresult result =
      graph ? real.cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream) : WithOomRetry([&] {
        return real.cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream);
      });
  RecordAsync(result, dptr, bytesize, graph, hStream);
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                               CUmemoryPool pool,
                                                               CUstream hStream) {
  VRAMSCOPE_PROLOGUE(cuMemAllocFromPoolAsync_ptsz);
  const bool graph = GraphOwned(real.cuStreamIsCapturing_ptsz, hStream);
  const CUresult result =
      graph ? real.cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, hStream) : WithOomRetry([&] {
        return real.cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, hStream);
      });
  RecordAsync(result, dptr, bytesize, graph, hStream);
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  VRAMSCOPE_PROLOGUE(cuMemFreeAsync);
  return FreeAsync(real.cuMemFreeAsync, dptr, hStream);
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  VRAMSCOPE_PROLOGUE(cuMemFreeAsync_ptsz);
  return FreeAsync(real.cuMemFreeAsync_ptsz, dptr, hStream);
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                              const CUmemAllocationProp* prop,
                                              unsigned long long flags) {
  VRAMSCOPE_PROLOGUE(cuMemCreate);
  const CUresult result = WithOomRetry([&] { return real.cuMemCreate(handle, size, prop, flags); });
  if (result == CUDA_SUCCESS && Recording() && handle != nullptr) {
    AllocOrigin origin;
    if (prop != nullptr && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
      origin.device = prop->location.id;
    }
    RecordAlloc(RegistryId::kVmmHandles, *handle, size, Kind::kVmmPhysical, origin);
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  VRAMSCOPE_PROLOGUE(cuMemRelease);
  const CUresult result = real.cuMemRelease(handle);
  if (result == CUDA_SUCCESS && Recording()) (void)RecordFree(RegistryId::kVmmHandles, handle);
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                           CUmemGenericAllocationHandle handle,
                                           unsigned long long flags) {
  VRAMSCOPE_PROLOGUE(cuMemMap);
  const CUresult result = real.cuMemMap(ptr, size, offset, handle, flags);
  if (result == CUDA_SUCCESS && Recording()) {
    RecordGauge(Kind::kVmmMapped, static_cast<std::int64_t>(size));
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  VRAMSCOPE_PROLOGUE(cuMemUnmap);
  const CUresult result = real.cuMemUnmap(ptr, size);
  if (result == CUDA_SUCCESS && Recording()) {
    RecordGauge(Kind::kVmmMapped, -static_cast<std::int64_t>(size));
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size,
                                                      size_t alignment, CUdeviceptr addr,
                                                      unsigned long long flags) {
  VRAMSCOPE_PROLOGUE(cuMemAddressReserve);
  const CUresult result = real.cuMemAddressReserve(ptr, size, alignment, addr, flags);
  if (result == CUDA_SUCCESS && Recording()) {
    RecordGauge(Kind::kVmmReserved, static_cast<std::int64_t>(size));
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  VRAMSCOPE_PROLOGUE(cuMemAddressFree);
  const CUresult result = real.cuMemAddressFree(ptr, size);
  if (result == CUDA_SUCCESS && Recording()) {
    RecordGauge(Kind::kVmmReserved, -static_cast<std::int64_t>(size));
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                                        unsigned int Flags) {
  VRAMSCOPE_PROLOGUE(cuIpcOpenMemHandle_v2);
  const CUresult result = real.cuIpcOpenMemHandle_v2(pdptr, handle, Flags);
  if (result == CUDA_SUCCESS && Recording() && pdptr != nullptr) {
    size_t size = 0;
    if (real.cuMemGetAddressRange_v2 != nullptr) {
      (void)real.cuMemGetAddressRange_v2(nullptr, &size, *pdptr);
    }
    RecordAlloc(RegistryId::kDevicePointers, *pdptr, size, Kind::kIpcImport);
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
  VRAMSCOPE_PROLOGUE(cuIpcCloseMemHandle);
  const CUresult result = real.cuIpcCloseMemHandle(dptr);
  if (result == CUDA_SUCCESS && Recording()) (void)RecordFree(RegistryId::kDevicePointers, dptr);
  return result;
}
