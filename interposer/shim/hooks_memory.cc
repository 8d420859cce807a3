// cuMemAlloc_v2 / cuMemFree_v2 through the pool, and the calls that must see pooled pointers
// as the application's own allocations: cuMemGetInfo_v2, cuMemGetAddressRange_v2,
// cuPointerGetAttribute(s), cuIpcGetMemHandle.
//
// IPC choice (docs/design.md, "IPC"): a legacy IPC handle names a whole driver allocation and the
// importer maps it at the allocation's base; VMM-mapped memory cannot be exported with
// cuIpcGetMemHandle at all. A block of a VMM pool with shareable physical memory gets a
// vramscope handle (ipc.h) that an importing shim opens at the block. Otherwise pooled memory
// is passed through when the block starts a cuMemAlloc segment (the importer maps exactly this
// block) and refused with CUDA_ERROR_NOT_SUPPORTED and one warning naming the fix
// (VRAMSCOPE_MODE=passthrough). Never a handle that the importer resolves to another address.
#include <algorithm>

#include "capture.h"
#include "counters.h"
#include "device_pools.h"
#include "hooks.h"
#include "ipc.h"
#include "log.h"
#include "ordered.h"
#include "registry.h"

namespace vramscope::interposer {
namespace {

// The calling thread's capture mode is RELAXED (probed by exchanging it and back).
bool ThreadIsRelaxed() {
  const RealDriver& real = Real();
  if (real.cuThreadExchangeStreamCaptureMode == nullptr) return true;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (real.cuThreadExchangeStreamCaptureMode(&mode) != CUDA_SUCCESS) return true;
  CUstreamCaptureMode restore = mode;
  (void)real.cuThreadExchangeStreamCaptureMode(&restore);
  return mode == CU_STREAM_CAPTURE_MODE_RELAXED;
}

bool AnyPools() {
  Slot* slot = nullptr;
  return LiveSlots(&slot, 1) > 0;
}

}  // namespace

bool FlushCachesForRetry() {
  IpcPollDeferred(FreePooled);  // blocks whose importers all closed go back to their pools first
  if (!FlushCaches()) return false;
  CUcontext ctx = nullptr;
  int device = 0;
  if (Real().cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx != nullptr &&
      Real().cuCtxGetDevice(&device) == CUDA_SUCCESS) {
    DeviceCountersFor(device).oom_retries.Add(1);
  }
  return true;
}

}  // namespace vramscope::interposer

using namespace vramscope::interposer;

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  VRAMSCOPE_PROLOGUE(cuMemAlloc_v2);
  if (!Active() || dptr == nullptr || bytesize == 0) return real.cuMemAlloc_v2(dptr, bytesize);
  // While a capture is live, a thread that is not in relaxed mode gets the driver's own answer
  // (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and the capture invalidated, where the driver says
  // so): the pool must not make a prohibited cudaMalloc succeed.
  if (Cfg().mode != Mode::kPassthrough && !(AnyCaptureLive() && !ThreadIsRelaxed())) {
    CUcontext ctx = nullptr;
    // No current context: the driver's own answer (CUDA_ERROR_INVALID_CONTEXT and friends).
    if (real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) {
      return real.cuMemAlloc_v2(dptr, bytesize);
    }
    std::uintptr_t address = 0;
    CUresult driver_error = CUDA_SUCCESS;
    switch (AllocatePooled(ctx, bytesize, &address, &driver_error)) {
      case ShimStatus::kOk:
        *dptr = address;
        return CUDA_SUCCESS;
      case ShimStatus::kOutOfMemory:
        return CUDA_ERROR_OUT_OF_MEMORY;
      case ShimStatus::kDriverError:
        return driver_error;
      case ShimStatus::kNotOurs:
      case ShimStatus::kUnavailable:
      case ShimStatus::kInvalidValue:
        break;  // this context is not pooled
    }
  }
  const CUresult result = WithOomRetry([&] { return real.cuMemAlloc_v2(dptr, bytesize); });
  if (result == CUDA_SUCCESS)
    RecordAlloc(RegistryId::kDevicePointers, *dptr, bytesize, Kind::kDevice);
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  VRAMSCOPE_PROLOGUE(cuMemFree_v2);
  // cuMemFree_v2(0) is the runtime's context-initialisation idiom: always the driver's.
  if (dptr == 0 || !CanRouteFrees()) return real.cuMemFree_v2(dptr);
  switch (FreePooled(dptr, Cfg().mode == Mode::kStrict)) {
    case ShimStatus::kOk:
      return CUDA_SUCCESS;
    case ShimStatus::kInvalidValue:
      VRAMSCOPE_LOG(kDebug, "cuMemFree_v2(%#llx): not a live pooled allocation",
                    static_cast<unsigned long long>(dptr));
      return CUDA_ERROR_INVALID_VALUE;
    case ShimStatus::kDriverError:
      return CUDA_ERROR_UNKNOWN;
    case ShimStatus::kNotOurs:
    case ShimStatus::kUnavailable:
    case ShimStatus::kOutOfMemory:
      break;
  }
  const CUresult result = real.cuMemFree_v2(dptr);
  if (result == CUDA_SUCCESS) (void)RecordFree(RegistryId::kDevicePointers, dptr);
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  VRAMSCOPE_PROLOGUE(cuMemGetInfo_v2);
  const CUresult result = real.cuMemGetInfo_v2(free, total);
  if (result != CUDA_SUCCESS || free == nullptr || !Active() || !AnyPools()) return result;
  // Idle cached bytes would be free without the shim: report them as free, so frameworks that
  // size themselves from free memory (vLLM, JAX) behave as they would without it.
  CUcontext ctx = nullptr;
  int device = 0;
  if (real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) return result;
  if (Slot* slot = ExistingSlot(ctx); slot != nullptr) {
    device = slot->device;
  } else if (real.cuCtxGetDevice == nullptr || real.cuCtxGetDevice(&device) != CUDA_SUCCESS) {
    return result;
  }
  const std::uint64_t idle = IdleBytesOnDevice(device);
  const std::uint64_t limit = total != nullptr ? *total : ~std::uint64_t{0};
  *free = static_cast<size_t>(std::min<std::uint64_t>(*free + idle, limit));
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize,
                                                          CUdeviceptr dptr) {
  VRAMSCOPE_PROLOGUE(cuMemGetAddressRange_v2);
  if (CanRouteFrees() && AnyPools()) {
    vramscope::pool::BlockInfo info;
    if (FindPooledBlock(dptr, &info) != nullptr) {
      // The application's allocation is the block, not the segment that holds it.
      if (pbase != nullptr) *pbase = info.address;
      if (psize != nullptr) *psize = info.requested;
      return CUDA_SUCCESS;
    }
  }
  return real.cuMemGetAddressRange_v2(pbase, psize, dptr);
}

namespace vramscope::interposer {
namespace {

// Rewrites the attributes that describe the driver allocation so they describe the block.
void PatchAttribute(CUpointer_attribute attribute, void* data, const pool::BlockInfo& info,
                    bool vmm) {
  if (data == nullptr) return;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = info.address;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = info.requested;
      break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      // Consistent with cuIpcGetMemHandle's rule above.
      *static_cast<bool*>(data) = !vmm && info.address == info.segment_base;
      break;
    default:
      break;
  }
}

bool Patchable(CUpointer_attribute attribute) {
  return attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR ||
         attribute == CU_POINTER_ATTRIBUTE_RANGE_SIZE ||
         attribute == CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE;
}

}  // namespace
}  // namespace vramscope::interposer

VRAMSCOPE_EXPORT CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attribute,
                                                        CUdeviceptr ptr) {
  VRAMSCOPE_PROLOGUE(cuPointerGetAttribute);
  const CUresult result = real.cuPointerGetAttribute(data, attribute, ptr);
  if (result != CUDA_SUCCESS || !Patchable(attribute) || !CanRouteFrees() || !AnyPools()) {
    return result;
  }
  vramscope::pool::BlockInfo info;
  if (Slot* slot = FindPooledBlock(ptr, &info); slot != nullptr) {
    PatchAttribute(attribute, data, info, slot->upstream.vmm());
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes,
                                                         CUpointer_attribute* attributes,
                                                         void** data, CUdeviceptr ptr) {
  VRAMSCOPE_PROLOGUE(cuPointerGetAttributes);
  const CUresult result = real.cuPointerGetAttributes(numAttributes, attributes, data, ptr);
  if (result != CUDA_SUCCESS || attributes == nullptr || data == nullptr || !CanRouteFrees() ||
      !AnyPools()) {
    return result;
  }
  bool any = false;
  for (unsigned int i = 0; i < numAttributes; ++i) any = any || Patchable(attributes[i]);
  if (!any) return result;
  vramscope::pool::BlockInfo info;
  if (Slot* slot = FindPooledBlock(ptr, &info); slot != nullptr) {
    for (unsigned int i = 0; i < numAttributes; ++i) {
      PatchAttribute(attributes[i], data[i], info, slot->upstream.vmm());
    }
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  VRAMSCOPE_PROLOGUE(cuIpcGetMemHandle);
  if (CanRouteFrees() && AnyPools()) {
    if (CUresult result = CUDA_SUCCESS; IpcExportPooled(pHandle, dptr, &result, FreePooled))
      return result;
    vramscope::pool::BlockInfo info;
    if (Slot* slot = FindPooledBlock(dptr, &info); slot != nullptr) {
      if (!slot->upstream.vmm() && info.address == info.segment_base) {
        // Another process's work on the block is invisible to ordered reuse: it ends here,
        // after the work queued so far finished.
        BreakOrderedAndWait("cuIpcGetMemHandle");
        return real.cuIpcGetMemHandle(pHandle, dptr);  // the importer maps exactly this block
      }
      Counters().ipc_refused.Add(1);
      VRAMSCOPE_LOG_ONCE(kWarn,
                         "cuIpcGetMemHandle on pooled memory (%#llx, a sub-allocation of %s) is "
                         "refused with CUDA_ERROR_NOT_SUPPORTED: the importer would map another "
                         "address. Run with VRAMSCOPE_MODE=passthrough to share device memory "
                         "by legacy IPC",
                         static_cast<unsigned long long>(dptr),
                         slot->upstream.vmm() ? "a VMM mapping" : "a cuMemAlloc segment");
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (FindOwner(dptr) != nullptr) return CUDA_ERROR_INVALID_VALUE;  // freed pooled memory
  }
  return real.cuIpcGetMemHandle(pHandle, dptr);
}
