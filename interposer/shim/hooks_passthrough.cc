// Every other way to take memory from the driver: passed through unchanged and recorded by
// kind (counters.h), so the shim's totals equal what the driver holds for the process. A driver
// OOM on these calls gives the pools' idle memory back and retries once.
//
// Graph memory: cuMemAllocAsync on a capturing stream creates graph-owned memory (mapped when
// the graph is instantiated/uploaded/launched, from the device's graph memory pool); it is passed
// through without a record of its own, and marks its device so that the graph pool is recorded
// (hooks_graph.cc, graph_memory.h: one GRAPH entry per device, the driver's reserved bytes).
//
// CUDA arrays (cuArrayCreate_v2, cuArray3DCreate_v2, cuMipmappedArrayCreate until
// cuArrayDestroy / cuMipmappedArrayDestroy): recorded by handle (RegistryId::kArrays). Allocated
// bytes are the driver's (cuArrayGetMemoryRequirements / cuMipmappedArrayGetMemoryRequirements);
// the driver documents those for CUDA_ARRAY3D_DEFERRED_MAPPING arrays only, so for the others
// they usually fail and the size comes from the descriptor (ArrayDescriptorBytes: texels x bytes
// per texel, summed over mip levels, no tiling or alignment: a lower bound). Requested bytes are
// always the descriptor's. Sparse and deferred-mapping arrays own no memory (their backing is
// cuMemCreate memory mapped with cuMemMapArrayAsync, recorded as VMM) and are not recorded.
// The 32-bit legacy cuArrayCreate/cuArray3DCreate ABIs are returned unwrapped.
#include "capture.h"
#include "counters.h"
#include "device_pools.h"
#include "graph_memory.h"
#include "hooks.h"
#include "ipc.h"
#include "ordered.h"
#include "registry.h"
#include "ring_events.h"
#include "stream_fence.h"

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
  if (result == CUDA_SUCCESS && graph) NoteGraphMemAllocNode(-1);  // a captured mem-alloc node
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

// Bits per texel of an array format (block-compressed and planar YUV formats averaged over a
// block / the planes); 8 x 4 x channels for a format this table does not know.
std::uint64_t BitsPerTexel(CUarray_format format, unsigned int channels) {
  switch (static_cast<int>(format)) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 8ull * channels;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 16ull * channels;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      return 32ull * channels;
    case CU_AD_FORMAT_UNORM_INT8X1:
    case CU_AD_FORMAT_SNORM_INT8X1:
      return 8;
    case CU_AD_FORMAT_UNORM_INT8X2:
    case CU_AD_FORMAT_SNORM_INT8X2:
    case CU_AD_FORMAT_UNORM_INT16X1:
    case CU_AD_FORMAT_SNORM_INT16X1:
    case CU_AD_FORMAT_YUY2:
    case CU_AD_FORMAT_NV16:
      return 16;
    case CU_AD_FORMAT_UNORM_INT8X4:
    case CU_AD_FORMAT_SNORM_INT8X4:
    case CU_AD_FORMAT_UNORM_INT16X2:
    case CU_AD_FORMAT_SNORM_INT16X2:
    case CU_AD_FORMAT_UNORM_INT_101010_2:
    case CU_AD_FORMAT_Y210:
    case CU_AD_FORMAT_Y216:
    case CU_AD_FORMAT_AYUV:
    case CU_AD_FORMAT_Y410:
    case CU_AD_FORMAT_P210:
    case CU_AD_FORMAT_P216:
      return 32;
    case CU_AD_FORMAT_UNORM_INT16X4:
    case CU_AD_FORMAT_SNORM_INT16X4:
    case CU_AD_FORMAT_Y416:
      return 64;
    case CU_AD_FORMAT_NV12:
      return 12;
    case CU_AD_FORMAT_P010:
    case CU_AD_FORMAT_P016:
      return 24;
    case CU_AD_FORMAT_Y444_PLANAR8:
    case CU_AD_FORMAT_YUV444_8bit_SemiPlanar:
      return 24;
    case CU_AD_FORMAT_Y444_PLANAR10:
    case CU_AD_FORMAT_YUV444_16bit_SemiPlanar:
      return 48;
    case CU_AD_FORMAT_BC1_UNORM:
    case CU_AD_FORMAT_BC1_UNORM_SRGB:
    case CU_AD_FORMAT_BC4_UNORM:
    case CU_AD_FORMAT_BC4_SNORM:
      return 4;  // 8 bytes per 4x4 block
    case CU_AD_FORMAT_BC2_UNORM:
    case CU_AD_FORMAT_BC2_UNORM_SRGB:
    case CU_AD_FORMAT_BC3_UNORM:
    case CU_AD_FORMAT_BC3_UNORM_SRGB:
    case CU_AD_FORMAT_BC5_UNORM:
    case CU_AD_FORMAT_BC5_SNORM:
    case CU_AD_FORMAT_BC6H_UF16:
    case CU_AD_FORMAT_BC6H_SF16:
    case CU_AD_FORMAT_BC7_UNORM:
    case CU_AD_FORMAT_BC7_UNORM_SRGB:
      return 8;  // 16 bytes per 4x4 block
    default:
      return 32ull * (channels == 0 ? 1 : channels);
  }
}

// Bytes of an array's texels from its descriptor: width x height x depth (0 counts as 1; a
// layered or cubemap array's depth is its layer count) x bits per texel, summed over `levels`
// mip levels (each halves width, height and, unless layered or cubemap, depth, to at least 1).
std::uint64_t ArrayDescriptorBytes(const CUDA_ARRAY3D_DESCRIPTOR& desc, unsigned int levels) {
  const bool layers = (desc.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
  const std::uint64_t bits = BitsPerTexel(desc.Format, desc.NumChannels);
  std::uint64_t w = desc.Width == 0 ? 1 : desc.Width;
  std::uint64_t h = desc.Height == 0 ? 1 : desc.Height;
  std::uint64_t d = desc.Depth == 0 ? 1 : desc.Depth;
  std::uint64_t total_bits = 0;
  for (unsigned int level = 0; level < (levels == 0 ? 1 : levels); ++level) {
    total_bits += w * h * d * bits;
    w = w > 1 ? w / 2 : 1;
    h = h > 1 ? h / 2 : 1;
    if (!layers) d = d > 1 ? d / 2 : 1;
  }
  return (total_bits + 7) / 8;
}

// Records an array the driver just created. `requirements` asks the driver for its size.
template <typename Requirements>
void RecordArray(std::uintptr_t handle, const CUDA_ARRAY3D_DESCRIPTOR& desc, unsigned int levels,
                 Requirements&& requirements) {
  if ((desc.Flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) != 0) return;
  const int device = CurrentDeviceOrZero();
  AllocOrigin origin;
  origin.device = device;
  origin.requested = ArrayDescriptorBytes(desc, levels);
  CUDA_ARRAY_MEMORY_REQUIREMENTS needs{};
  const std::uint64_t size =
      requirements(&needs, static_cast<CUdevice>(device)) == CUDA_SUCCESS && needs.size != 0
          ? needs.size
          : origin.requested;
  RecordAlloc(RegistryId::kArrays, handle, size, Kind::kArray, origin);
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
  WatchStream(hStream, false, "cuMemAllocAsync");
  const StreamWorkNote note(hStream, false);
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
  WatchStream(hStream, true, "cuMemAllocAsync_ptsz");
  const StreamWorkNote note(hStream, true);
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
  WatchStream(hStream, false, "cuMemAllocFromPoolAsync");
  const StreamWorkNote note(hStream, false);
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
  WatchStream(hStream, true, "cuMemAllocFromPoolAsync_ptsz");
  const StreamWorkNote note(hStream, true);
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
  WatchStream(hStream, false, "cuMemFreeAsync");
  const StreamWorkNote note(hStream, false);
  return FreeAsync(real.cuMemFreeAsync, dptr, hStream);
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  VRAMSCOPE_PROLOGUE(cuMemFreeAsync_ptsz);
  WatchStream(hStream, true, "cuMemFreeAsync_ptsz");
  const StreamWorkNote note(hStream, true);
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

namespace vramscope::interposer {
namespace {

// cuIpcOpenMemHandle_v2 and its pre-11.0 name: a vramscope handle (ipc.h) is opened by the shim,
// any other goes to the driver's entry point of that ABI.
template <typename Fn>
CUresult IpcOpen(Fn real_open, CUdeviceptr* pdptr, const CUipcMemHandle& handle,
                 unsigned int flags) {
  if (CUresult ours = CUDA_SUCCESS; IpcOpenPooled(pdptr, handle, flags, &ours)) return ours;
  const CUresult result = real_open(pdptr, handle, flags);
  if (result == CUDA_SUCCESS && Recording() && pdptr != nullptr) {
    size_t size = 0;
    if (Real().cuMemGetAddressRange_v2 != nullptr) {
      (void)Real().cuMemGetAddressRange_v2(nullptr, &size, *pdptr);
    }
    RecordAlloc(RegistryId::kDevicePointers, *pdptr, size, Kind::kIpcImport);
  }
  return result;
}

}  // namespace
}  // namespace vramscope::interposer

VRAMSCOPE_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                                        unsigned int Flags) {
  VRAMSCOPE_PROLOGUE(cuIpcOpenMemHandle_v2);
  return IpcOpen(real.cuIpcOpenMemHandle_v2, pdptr, handle, Flags);
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                                     unsigned int Flags) {
  VRAMSCOPE_PROLOGUE(cuIpcOpenMemHandle);
  return IpcOpen(real.cuIpcOpenMemHandle, pdptr, handle, Flags);
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
  VRAMSCOPE_PROLOGUE(cuIpcCloseMemHandle);
  if (CUresult ours = CUDA_SUCCESS; IpcClosePooled(dptr, &ours)) return ours;
  const CUresult result = real.cuIpcCloseMemHandle(dptr);
  if (result == CUDA_SUCCESS && Recording()) (void)RecordFree(RegistryId::kDevicePointers, dptr);
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuArrayCreate_v2(CUarray* pHandle,
                                                   const CUDA_ARRAY_DESCRIPTOR* pAllocateArray) {
  VRAMSCOPE_PROLOGUE(cuArrayCreate_v2);
  const CUresult result =
      WithOomRetry([&] { return real.cuArrayCreate_v2(pHandle, pAllocateArray); });
  if (result == CUDA_SUCCESS && Recording() && pHandle != nullptr && pAllocateArray != nullptr) {
    CUDA_ARRAY3D_DESCRIPTOR desc{};
    desc.Width = pAllocateArray->Width;
    desc.Height = pAllocateArray->Height;
    desc.Format = pAllocateArray->Format;
    desc.NumChannels = pAllocateArray->NumChannels;
    const CUarray array = *pHandle;
    RecordArray(reinterpret_cast<std::uintptr_t>(array), desc, 1,
                [&](CUDA_ARRAY_MEMORY_REQUIREMENTS* needs, CUdevice device) {
                  return real.cuArrayGetMemoryRequirements == nullptr
                             ? CUDA_ERROR_NOT_FOUND
                             : real.cuArrayGetMemoryRequirements(needs, array, device);
                });
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI
cuArray3DCreate_v2(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* pAllocateArray) {
  VRAMSCOPE_PROLOGUE(cuArray3DCreate_v2);
  const CUresult result =
      WithOomRetry([&] { return real.cuArray3DCreate_v2(pHandle, pAllocateArray); });
  if (result == CUDA_SUCCESS && Recording() && pHandle != nullptr && pAllocateArray != nullptr) {
    const CUarray array = *pHandle;
    RecordArray(reinterpret_cast<std::uintptr_t>(array), *pAllocateArray, 1,
                [&](CUDA_ARRAY_MEMORY_REQUIREMENTS* needs, CUdevice device) {
                  return real.cuArrayGetMemoryRequirements == nullptr
                             ? CUDA_ERROR_NOT_FOUND
                             : real.cuArrayGetMemoryRequirements(needs, array, device);
                });
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMipmappedArrayCreate(
    CUmipmappedArray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* pMipmappedArrayDesc,
    unsigned int numMipmapLevels) {
  VRAMSCOPE_PROLOGUE(cuMipmappedArrayCreate);
  const CUresult result = WithOomRetry(
      [&] { return real.cuMipmappedArrayCreate(pHandle, pMipmappedArrayDesc, numMipmapLevels); });
  if (result == CUDA_SUCCESS && Recording() && pHandle != nullptr &&
      pMipmappedArrayDesc != nullptr) {
    const CUmipmappedArray array = *pHandle;
    RecordArray(reinterpret_cast<std::uintptr_t>(array), *pMipmappedArrayDesc, numMipmapLevels,
                [&](CUDA_ARRAY_MEMORY_REQUIREMENTS* needs, CUdevice device) {
                  return real.cuMipmappedArrayGetMemoryRequirements == nullptr
                             ? CUDA_ERROR_NOT_FOUND
                             : real.cuMipmappedArrayGetMemoryRequirements(needs, array, device);
                });
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuArrayDestroy(CUarray hArray) {
  VRAMSCOPE_PROLOGUE(cuArrayDestroy);
  const CUresult result = real.cuArrayDestroy(hArray);
  if (result == CUDA_SUCCESS && Recording()) {
    (void)RecordFree(RegistryId::kArrays, reinterpret_cast<std::uintptr_t>(hArray));
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
  VRAMSCOPE_PROLOGUE(cuMipmappedArrayDestroy);
  const CUresult result = real.cuMipmappedArrayDestroy(hMipmappedArray);
  if (result == CUDA_SUCCESS && Recording()) {
    (void)RecordFree(RegistryId::kArrays, reinterpret_cast<std::uintptr_t>(hMipmappedArray));
  }
  return result;
}
