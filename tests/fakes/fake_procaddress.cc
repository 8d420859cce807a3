// cuGetProcAddress (CUDA 11.3 ABI, 4 arguments) and cuGetProcAddress_v2 (CUDA 12 ABI, 5
// arguments) of the fake CUDA driver, serving the fake's own table.
//
// Mimics the real driver as measured (docs/driver-notes.md) and documented in cuda.h:
// - the symbol is a base name ("cuMemAlloc"); the driver returns the newest variant introduced
//   at or before `cudaVersion` ("cuMemAlloc" at 3020 -> cuMemAlloc_v2; "cuGetProcAddress" at
//   11030 -> the 4-argument cuGetProcAddress, at 12000 -> cuGetProcAddress_v2);
// - flags CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM returns the _ptsz/_ptds variant where
//   one exists (else the legacy one); CU_GET_PROC_ADDRESS_DEFAULT (0) means legacy, since the
//   driver cannot see how the caller was compiled (cuda.h's inline wrapper adds the flag);
// - an unknown symbol (including the runtime's first probe: empty name, version 0) returns
//   CUDA_SUCCESS with *pfn = NULL and status CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND; a known one
//   too new for cudaVersion returns NULL and CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
// - cudaVersion above the driver's version, NULL symbol or pfn, or unknown flags return
//   CUDA_ERROR_INVALID_VALUE;
// - it works before cuInit (the runtime calls it first).
// Every pointer returned equals dlsym(libcuda, "<exact name>"), so a shim can route by pointer.
//
// Deviation: the pre-3.2 32-bit ABIs (cuMemAlloc v2000 etc.) are not implemented, so such
// versions get VERSION_NOT_SUFFICIENT instead of the old function.
#include <string.h>

#include <string>

#include <cuda.h>

#include "fake_cuda_decls.h"
#include "fake_state.h"

namespace vramscope::fake {
namespace {

struct Entry {
  const char* symbol;  // base name, as passed to cuGetProcAddress
  int version;         // CUDA version that introduced this variant
  void* legacy;        // the function for legacy-stream semantics
  void* per_thread;    // its _ptsz/_ptds variant, or nullptr if it has none
};

template <typename F>
void* Fn(F* f) {
  return reinterpret_cast<void*>(f);
}

#define VRAMSCOPE_E(sym, ver, fn) \
  { sym, ver, Fn(&fn), nullptr }
#define VRAMSCOPE_EP(sym, ver, fn) \
  { sym, ver, Fn(&fn), Fn(&fn##_ptsz) }
#define VRAMSCOPE_ED(sym, ver, fn) \
  { sym, ver, Fn(&fn), Fn(&fn##_ptds) }

// Sorted by symbol, then version (ascending): lookups take the last match not newer than the
// caller's version.
const Entry kTable[] = {
    VRAMSCOPE_E("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    VRAMSCOPE_E("cuArrayCreate", 3020, cuArrayCreate_v2),
    VRAMSCOPE_E("cuArrayDestroy", 2000, cuArrayDestroy),
    VRAMSCOPE_E("cuArrayGetMemoryRequirements", 11060, cuArrayGetMemoryRequirements),
    VRAMSCOPE_E("cuCtxCreate", 3020, cuCtxCreate_v2),
    VRAMSCOPE_E("cuCtxCreate", 11040, cuCtxCreate_v3),
    VRAMSCOPE_E("cuCtxCreate", 12050, cuCtxCreate_v4),
    VRAMSCOPE_E("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    VRAMSCOPE_E("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    VRAMSCOPE_E("cuCtxGetDevice", 2000, cuCtxGetDevice),
    VRAMSCOPE_E("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    VRAMSCOPE_E("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    VRAMSCOPE_E("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    VRAMSCOPE_E("cuCtxSynchronize", 2000, cuCtxSynchronize),
    VRAMSCOPE_E("cuCtxSynchronize", 13000, cuCtxSynchronize_v2),
    VRAMSCOPE_E("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer),
    VRAMSCOPE_E("cuDeviceGet", 2000, cuDeviceGet),
    VRAMSCOPE_E("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    VRAMSCOPE_E("cuDeviceGetCount", 2000, cuDeviceGetCount),
    VRAMSCOPE_E("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    VRAMSCOPE_E("cuDeviceGetGraphMemAttribute", 11040, cuDeviceGetGraphMemAttribute),
    VRAMSCOPE_E("cuDeviceGetName", 2000, cuDeviceGetName),
    VRAMSCOPE_E("cuDeviceGetUuid", 9020, vramscope_fake_cuDeviceGetUuid_v9020),
    VRAMSCOPE_E("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    VRAMSCOPE_E("cuDeviceGraphMemTrim", 11040, cuDeviceGraphMemTrim),
    VRAMSCOPE_E("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
    VRAMSCOPE_E("cuDevicePrimaryCtxRelease", 7000, vramscope_fake_cuDevicePrimaryCtxRelease_v7000),
    VRAMSCOPE_E("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    VRAMSCOPE_E("cuDevicePrimaryCtxReset", 7000, vramscope_fake_cuDevicePrimaryCtxReset_v7000),
    VRAMSCOPE_E("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    VRAMSCOPE_E("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    VRAMSCOPE_E("cuDeviceSetGraphMemAttribute", 11040, cuDeviceSetGraphMemAttribute),
    VRAMSCOPE_E("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    VRAMSCOPE_E("cuDriverGetVersion", 2020, cuDriverGetVersion),
    VRAMSCOPE_E("cuEventCreate", 2000, cuEventCreate),
    VRAMSCOPE_E("cuEventDestroy", 2000, vramscope_fake_cuEventDestroy_v2000),
    VRAMSCOPE_E("cuEventDestroy", 4000, cuEventDestroy_v2),
    VRAMSCOPE_E("cuEventElapsedTime", 2000, vramscope_fake_cuEventElapsedTime_v2000),
    VRAMSCOPE_E("cuEventElapsedTime", 12080, cuEventElapsedTime_v2),
    VRAMSCOPE_E("cuEventQuery", 2000, cuEventQuery),
    VRAMSCOPE_EP("cuEventRecord", 2000, cuEventRecord),
    VRAMSCOPE_E("cuEventSynchronize", 2000, cuEventSynchronize),
    VRAMSCOPE_E("cuGetErrorName", 6000, cuGetErrorName),
    VRAMSCOPE_E("cuGetErrorString", 6000, cuGetErrorString),
    VRAMSCOPE_E("cuGetExportTable", 3000, cuGetExportTable),
    VRAMSCOPE_E("cuGetProcAddress", 11030, vramscope_fake_cuGetProcAddress_v11030),
    VRAMSCOPE_E("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    VRAMSCOPE_E("cuGraphAddMemAllocNode", 11040, cuGraphAddMemAllocNode),
    VRAMSCOPE_E("cuGraphAddNode", 12020, vramscope_fake_cuGraphAddNode_v12020),
    VRAMSCOPE_E("cuGraphAddNode", 12030, cuGraphAddNode_v2),
    VRAMSCOPE_E("cuGraphCreate", 10000, cuGraphCreate),
    VRAMSCOPE_E("cuGraphDestroy", 10000, cuGraphDestroy),
    VRAMSCOPE_E("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    VRAMSCOPE_E("cuGraphInstantiate", 10000, vramscope_fake_cuGraphInstantiate_v10000),
    VRAMSCOPE_E("cuGraphInstantiate", 11000, cuGraphInstantiate_v2),
    VRAMSCOPE_E("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    VRAMSCOPE_EP("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams),
    VRAMSCOPE_EP("cuGraphLaunch", 10000, cuGraphLaunch),
    VRAMSCOPE_EP("cuGraphUpload", 11010, cuGraphUpload),
    VRAMSCOPE_E("cuInit", 2000, cuInit),
    VRAMSCOPE_E("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle),
    VRAMSCOPE_E("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
    VRAMSCOPE_E("cuIpcOpenMemHandle", 4010, vramscope_fake_cuIpcOpenMemHandle_v4010),
    VRAMSCOPE_E("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2),
    VRAMSCOPE_EP("cuLaunchKernel", 4000, cuLaunchKernel),
    VRAMSCOPE_E("cuMemAddressFree", 10020, cuMemAddressFree),
    VRAMSCOPE_E("cuMemAddressReserve", 10020, cuMemAddressReserve),
    VRAMSCOPE_E("cuMemAlloc", 3020, cuMemAlloc_v2),
    VRAMSCOPE_EP("cuMemAllocAsync", 11020, cuMemAllocAsync),
    VRAMSCOPE_EP("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    VRAMSCOPE_E("cuMemAllocHost", 3020, cuMemAllocHost_v2),
    VRAMSCOPE_E("cuMemAllocManaged", 6000, cuMemAllocManaged),
    VRAMSCOPE_E("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    VRAMSCOPE_E("cuMemCreate", 10020, cuMemCreate),
    VRAMSCOPE_E("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
    VRAMSCOPE_E("cuMemFree", 3020, cuMemFree_v2),
    VRAMSCOPE_EP("cuMemFreeAsync", 11020, cuMemFreeAsync),
    VRAMSCOPE_E("cuMemFreeHost", 2000, cuMemFreeHost),
    VRAMSCOPE_E("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    VRAMSCOPE_E("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    VRAMSCOPE_E("cuMemGetAllocationPropertiesFromHandle", 10020,
                cuMemGetAllocationPropertiesFromHandle),
    VRAMSCOPE_E("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    VRAMSCOPE_E("cuMemHostAlloc", 2020, cuMemHostAlloc),
    VRAMSCOPE_E("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2),
    VRAMSCOPE_E("cuMemHostRegister", 6050, cuMemHostRegister_v2),
    VRAMSCOPE_E("cuMemHostUnregister", 4000, cuMemHostUnregister),
    VRAMSCOPE_E("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
    VRAMSCOPE_E("cuMemMap", 10020, cuMemMap),
    VRAMSCOPE_E("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute),
    VRAMSCOPE_E("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute),
    VRAMSCOPE_E("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
    VRAMSCOPE_E("cuMemRelease", 10020, cuMemRelease),
    VRAMSCOPE_E("cuMemRetainAllocationHandle", 10020, cuMemRetainAllocationHandle),
    VRAMSCOPE_E("cuMemSetAccess", 10020, cuMemSetAccess),
    VRAMSCOPE_E("cuMemUnmap", 10020, cuMemUnmap),
    VRAMSCOPE_ED("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2),
    VRAMSCOPE_ED("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2),
    VRAMSCOPE_ED("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2),
    VRAMSCOPE_ED("cuMemsetD8", 3020, cuMemsetD8_v2),
    VRAMSCOPE_E("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    VRAMSCOPE_E("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    VRAMSCOPE_E("cuMipmappedArrayGetMemoryRequirements", 11060,
                cuMipmappedArrayGetMemoryRequirements),
    VRAMSCOPE_E("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
    VRAMSCOPE_E("cuPointerGetAttributes", 7000, cuPointerGetAttributes),
    {"cuStreamBeginCapture", 10000, Fn(&vramscope_fake_cuStreamBeginCapture_v10000),
     Fn(&cuStreamBeginCapture_ptsz)},
    VRAMSCOPE_EP("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2),
    VRAMSCOPE_E("cuStreamCreate", 2000, cuStreamCreate),
    VRAMSCOPE_E("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority),
    VRAMSCOPE_E("cuStreamDestroy", 2000, vramscope_fake_cuStreamDestroy_v2000),
    VRAMSCOPE_E("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    VRAMSCOPE_EP("cuStreamEndCapture", 10000, cuStreamEndCapture),
    {"cuStreamGetCaptureInfo", 10010, Fn(&vramscope_fake_cuStreamGetCaptureInfo_v10010),
     Fn(&cuStreamGetCaptureInfo_ptsz)},
    VRAMSCOPE_EP("cuStreamGetCaptureInfo", 11030, cuStreamGetCaptureInfo_v2),
    VRAMSCOPE_EP("cuStreamGetCaptureInfo", 12030, cuStreamGetCaptureInfo_v3),
    VRAMSCOPE_EP("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
    VRAMSCOPE_EP("cuStreamQuery", 2000, cuStreamQuery),
    VRAMSCOPE_EP("cuStreamSynchronize", 2000, cuStreamSynchronize),
    VRAMSCOPE_EP("cuStreamWaitEvent", 3020, cuStreamWaitEvent),
    VRAMSCOPE_E("cuThreadExchangeStreamCaptureMode", 10010, cuThreadExchangeStreamCaptureMode),
};

#undef VRAMSCOPE_E
#undef VRAMSCOPE_EP
#undef VRAMSCOPE_ED

CUresult Lookup(State& s, const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  constexpr cuuint64_t kKnownFlags =
      CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if (symbol == nullptr || pfn == nullptr || (flags & ~kKnownFlags) != 0 ||
      cuda_version > kDriverVersion) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  ++s.call_counts[std::string("lookup:") + symbol];
  bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  const Entry* best = nullptr;
  bool known = false;
  for (const Entry& e : kTable) {
    if (strcmp(e.symbol, symbol) != 0) continue;
    known = true;
    if (e.version <= cuda_version) best = &e;
  }
  *pfn = nullptr;
  CUdriverProcAddressQueryResult result = CU_GET_PROC_ADDRESS_SUCCESS;
  if (best != nullptr) {
    *pfn = per_thread && best->per_thread != nullptr ? best->per_thread : best->legacy;
  } else {
    result =
        known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  }
  if (status != nullptr) *status = result;
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace vramscope::fake

// cuda.h maps the name cuGetProcAddress to cuGetProcAddress_v2; the 5-argument function is
// exported as cuGetProcAddress_v2, the 4-argument one as cuGetProcAddress (asm label in
// fake_cuda_decls.h).
VRAMSCOPE_FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                                   cuuint64_t flags,
                                                   CUdriverProcAddressQueryResult* symbolStatus) {
  vramscope::fake::Call call("cuGetProcAddress_v2");
  if (call.state().forked_after_init) return CUDA_ERROR_NOT_INITIALIZED;
  return vramscope::fake::Lookup(call.state(), symbol, pfn, cudaVersion, flags, symbolStatus);
}

VRAMSCOPE_FAKE_EXPORT CUresult vramscope_fake_cuGetProcAddress_v11030(const char* symbol,
                                                                      void** pfn, int cudaVersion,
                                                                      cuuint64_t flags) {
  vramscope::fake::Call call("cuGetProcAddress");
  if (call.state().forked_after_init) return CUDA_ERROR_NOT_INITIALIZED;
  return vramscope::fake::Lookup(call.state(), symbol, pfn, cudaVersion, flags, nullptr);
}
