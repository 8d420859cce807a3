// Routes by which a program reaches the CUDA driver, as helpers that fill one table.
//
// Real programs reach libcuda.so.1 by (docs/driver-notes.md)
//   (R4) the PLT: linked against libcuda, calling cuMemAlloc_v2 etc. by name    -> LoadDirect
//   (R3) dlopen("libcuda.so.1") + dlsym(handle, "<exact versioned name>")      -> LoadByDlsym
//        (JAX/XLA, cuBLASLt, NVML, ctypes)
//   (R1) the CUDA runtime's way: dlopen + one dlsym(h, "cuGetProcAddress_v2"), an empty-name
//        probe, cuGetProcAddress itself at 11030 and 12000 through it, then every base name
//        through the returned cuGetProcAddress_v2, with flags 2 for _ptsz/_ptds variants
//                                                                              -> LoadByProcAddress
// Each loader fills the same DriverApi, one member per exact exported name, typed with the
// PFN_* typedef of cudaTypedefs.h for that ABI version. Tests written against a DriverApi run
// unchanged over every route, and with LD_PRELOAD=libvramscope.so they prove each route reaches
// the shim (ModuleOf tells which library a pointer lives in).
//
// LoadDirect lives in routes_direct.cc (fake_routes_direct_dep), which links the fake driver;
// everything here only needs libdl, so a program using it has no DT_NEEDED on libcuda.
//
// Thread safety: the loaders may run concurrently; a DriverApi is immutable once filled.
// Errors: loaders return false and describe the first failure in *error.
#ifndef VRAMSCOPE_TESTS_FAKES_ROUTES_H_
#define VRAMSCOPE_TESTS_FAKES_ROUTES_H_

#include <stddef.h>
#include <stdint.h>

#include <string>
#include <vector>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "fake_cuda_decls.h"

namespace vramscope::fake {

// ABIs cudaTypedefs.h declares only under __CUDA_API_VERSION_INTERNAL (cuGraphInstantiate of
// CUDA 10.0 and 11.0, before the name became cuGraphInstantiateWithFlags).
typedef CUresult(CUDAAPI* PFN_vramscope_cuGraphInstantiate_v10000)(CUgraphExec* phGraphExec,
                                                                   CUgraph hGraph,
                                                                   CUgraphNode* phErrorNode,
                                                                   char* logBuffer,
                                                                   size_t bufferSize);
typedef PFN_vramscope_cuGraphInstantiate_v10000 PFN_vramscope_cuGraphInstantiate_v11000;

// X(member, direct_expression, "exported name", "cuGetProcAddress symbol", version,
//   per_thread, PFN type). `per_thread` entries are fetched with
// CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM; `version` is the CUDA version of that ABI.
#define VRAMSCOPE_FAKE_DRIVER_API(X)                                                               \
  X(cuGetProcAddress_v11030, vramscope_fake_cuGetProcAddress_v11030, "cuGetProcAddress",           \
    "cuGetProcAddress", 11030, 0, PFN_cuGetProcAddress_v11030)                                     \
  X(cuGetProcAddress_v2, cuGetProcAddress_v2, "cuGetProcAddress_v2", "cuGetProcAddress", 12000, 0, \
    PFN_cuGetProcAddress_v12000)                                                                   \
  X(cuInit, cuInit, "cuInit", "cuInit", 2000, 0, PFN_cuInit_v2000)                                 \
  X(cuDriverGetVersion, cuDriverGetVersion, "cuDriverGetVersion", "cuDriverGetVersion", 2020, 0,   \
    PFN_cuDriverGetVersion_v2020)                                                                  \
  X(cuDeviceGet, cuDeviceGet, "cuDeviceGet", "cuDeviceGet", 2000, 0, PFN_cuDeviceGet_v2000)        \
  X(cuDeviceGetCount, cuDeviceGetCount, "cuDeviceGetCount", "cuDeviceGetCount", 2000, 0,           \
    PFN_cuDeviceGetCount_v2000)                                                                    \
  X(cuDeviceGetName, cuDeviceGetName, "cuDeviceGetName", "cuDeviceGetName", 2000, 0,               \
    PFN_cuDeviceGetName_v2000)                                                                     \
  X(cuDeviceGetUuid_v2, cuDeviceGetUuid_v2, "cuDeviceGetUuid_v2", "cuDeviceGetUuid", 11040, 0,     \
    PFN_cuDeviceGetUuid_v11040)                                                                    \
  X(cuDeviceTotalMem_v2, cuDeviceTotalMem_v2, "cuDeviceTotalMem_v2", "cuDeviceTotalMem", 3020, 0,  \
    PFN_cuDeviceTotalMem_v3020)                                                                    \
  X(cuDeviceGetAttribute, cuDeviceGetAttribute, "cuDeviceGetAttribute", "cuDeviceGetAttribute",    \
    2000, 0, PFN_cuDeviceGetAttribute_v2000)                                                       \
  X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain",                \
    "cuDevicePrimaryCtxRetain", 7000, 0, PFN_cuDevicePrimaryCtxRetain_v7000)                       \
  X(cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease_v2",    \
    "cuDevicePrimaryCtxRelease", 11000, 0, PFN_cuDevicePrimaryCtxRelease_v11000)                   \
  X(cuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset_v2",          \
    "cuDevicePrimaryCtxReset", 11000, 0, PFN_cuDevicePrimaryCtxReset_v11000)                       \
  X(cuCtxGetCurrent, cuCtxGetCurrent, "cuCtxGetCurrent", "cuCtxGetCurrent", 4000, 0,               \
    PFN_cuCtxGetCurrent_v4000)                                                                     \
  X(cuCtxSetCurrent, cuCtxSetCurrent, "cuCtxSetCurrent", "cuCtxSetCurrent", 4000, 0,               \
    PFN_cuCtxSetCurrent_v4000)                                                                     \
  X(cuCtxGetDevice, cuCtxGetDevice, "cuCtxGetDevice", "cuCtxGetDevice", 2000, 0,                   \
    PFN_cuCtxGetDevice_v2000)                                                                      \
  X(cuCtxPushCurrent_v2, cuCtxPushCurrent_v2, "cuCtxPushCurrent_v2", "cuCtxPushCurrent", 4000, 0,  \
    PFN_cuCtxPushCurrent_v4000)                                                                    \
  X(cuCtxPopCurrent_v2, cuCtxPopCurrent_v2, "cuCtxPopCurrent_v2", "cuCtxPopCurrent", 4000, 0,      \
    PFN_cuCtxPopCurrent_v4000)                                                                     \
  X(cuCtxSynchronize, cuCtxSynchronize, "cuCtxSynchronize", "cuCtxSynchronize", 2000, 0,           \
    PFN_cuCtxSynchronize_v2000)                                                                    \
  X(cuCtxSynchronize_v2, cuCtxSynchronize_v2, "cuCtxSynchronize_v2", "cuCtxSynchronize", 13000, 0, \
    PFN_cuCtxSynchronize_v13000)                                                                   \
  X(cuGetErrorString, cuGetErrorString, "cuGetErrorString", "cuGetErrorString", 6000, 0,           \
    PFN_cuGetErrorString_v6000)                                                                    \
  X(cuGetErrorName, cuGetErrorName, "cuGetErrorName", "cuGetErrorName", 6000, 0,                   \
    PFN_cuGetErrorName_v6000)                                                                      \
  X(cuGetExportTable, cuGetExportTable, "cuGetExportTable", "cuGetExportTable", 3000, 0,           \
    PFN_cuGetExportTable_v3000)                                                                    \
  X(cuMemAlloc_v2, cuMemAlloc_v2, "cuMemAlloc_v2", "cuMemAlloc", 3020, 0, PFN_cuMemAlloc_v3020)    \
  X(cuMemFree_v2, cuMemFree_v2, "cuMemFree_v2", "cuMemFree", 3020, 0, PFN_cuMemFree_v3020)         \
  X(cuMemGetInfo_v2, cuMemGetInfo_v2, "cuMemGetInfo_v2", "cuMemGetInfo", 3020, 0,                  \
    PFN_cuMemGetInfo_v3020)                                                                        \
  X(cuMemGetAddressRange_v2, cuMemGetAddressRange_v2, "cuMemGetAddressRange_v2",                   \
    "cuMemGetAddressRange", 3020, 0, PFN_cuMemGetAddressRange_v3020)                               \
  X(cuMemAllocPitch_v2, cuMemAllocPitch_v2, "cuMemAllocPitch_v2", "cuMemAllocPitch", 3020, 0,      \
    PFN_cuMemAllocPitch_v3020)                                                                     \
  X(cuMemAllocManaged, cuMemAllocManaged, "cuMemAllocManaged", "cuMemAllocManaged", 6000, 0,       \
    PFN_cuMemAllocManaged_v6000)                                                                   \
  X(cuMemHostAlloc, cuMemHostAlloc, "cuMemHostAlloc", "cuMemHostAlloc", 2020, 0,                   \
    PFN_cuMemHostAlloc_v2020)                                                                      \
  X(cuMemFreeHost, cuMemFreeHost, "cuMemFreeHost", "cuMemFreeHost", 2000, 0,                       \
    PFN_cuMemFreeHost_v2000)                                                                       \
  X(cuMemAllocHost_v2, cuMemAllocHost_v2, "cuMemAllocHost_v2", "cuMemAllocHost", 3020, 0,          \
    PFN_cuMemAllocHost_v3020)                                                                      \
  X(cuMemcpyHtoD_v2, cuMemcpyHtoD_v2, "cuMemcpyHtoD_v2", "cuMemcpyHtoD", 3020, 0,                  \
    PFN_cuMemcpyHtoD_v3020)                                                                        \
  X(cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD_v2_ptds, "cuMemcpyHtoD_v2_ptds", "cuMemcpyHtoD", 7000, 1,   \
    PFN_cuMemcpyHtoD_v7000_ptds)                                                                   \
  X(cuMemcpyDtoH_v2, cuMemcpyDtoH_v2, "cuMemcpyDtoH_v2", "cuMemcpyDtoH", 3020, 0,                  \
    PFN_cuMemcpyDtoH_v3020)                                                                        \
  X(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH_v2_ptds, "cuMemcpyDtoH_v2_ptds", "cuMemcpyDtoH", 7000, 1,   \
    PFN_cuMemcpyDtoH_v7000_ptds)                                                                   \
  X(cuMemcpyDtoD_v2, cuMemcpyDtoD_v2, "cuMemcpyDtoD_v2", "cuMemcpyDtoD", 3020, 0,                  \
    PFN_cuMemcpyDtoD_v3020)                                                                        \
  X(cuMemcpyDtoD_v2_ptds, cuMemcpyDtoD_v2_ptds, "cuMemcpyDtoD_v2_ptds", "cuMemcpyDtoD", 7000, 1,   \
    PFN_cuMemcpyDtoD_v7000_ptds)                                                                   \
  X(cuMemsetD8_v2, cuMemsetD8_v2, "cuMemsetD8_v2", "cuMemsetD8", 3020, 0, PFN_cuMemsetD8_v3020)    \
  X(cuMemsetD8_v2_ptds, cuMemsetD8_v2_ptds, "cuMemsetD8_v2_ptds", "cuMemsetD8", 7000, 1,           \
    PFN_cuMemsetD8_v7000_ptds)                                                                     \
  X(cuPointerGetAttribute, cuPointerGetAttribute, "cuPointerGetAttribute",                         \
    "cuPointerGetAttribute", 4000, 0, PFN_cuPointerGetAttribute_v4000)                             \
  X(cuPointerGetAttributes, cuPointerGetAttributes, "cuPointerGetAttributes",                      \
    "cuPointerGetAttributes", 7000, 0, PFN_cuPointerGetAttributes_v7000)                           \
  X(cuStreamCreate, cuStreamCreate, "cuStreamCreate", "cuStreamCreate", 2000, 0,                   \
    PFN_cuStreamCreate_v2000)                                                                      \
  X(cuStreamCreateWithPriority, cuStreamCreateWithPriority, "cuStreamCreateWithPriority",          \
    "cuStreamCreateWithPriority", 5050, 0, PFN_cuStreamCreateWithPriority_v5050)                   \
  X(cuStreamDestroy_v2, cuStreamDestroy_v2, "cuStreamDestroy_v2", "cuStreamDestroy", 4000, 0,      \
    PFN_cuStreamDestroy_v4000)                                                                     \
  X(cuStreamSynchronize, cuStreamSynchronize, "cuStreamSynchronize", "cuStreamSynchronize", 2000,  \
    0, PFN_cuStreamSynchronize_v2000)                                                              \
  X(cuStreamSynchronize_ptsz, cuStreamSynchronize_ptsz, "cuStreamSynchronize_ptsz",                \
    "cuStreamSynchronize", 7000, 1, PFN_cuStreamSynchronize_v7000_ptsz)                            \
  X(cuStreamQuery, cuStreamQuery, "cuStreamQuery", "cuStreamQuery", 2000, 0,                       \
    PFN_cuStreamQuery_v2000)                                                                       \
  X(cuStreamQuery_ptsz, cuStreamQuery_ptsz, "cuStreamQuery_ptsz", "cuStreamQuery", 7000, 1,        \
    PFN_cuStreamQuery_v7000_ptsz)                                                                  \
  X(cuStreamWaitEvent, cuStreamWaitEvent, "cuStreamWaitEvent", "cuStreamWaitEvent", 3020, 0,       \
    PFN_cuStreamWaitEvent_v3020)                                                                   \
  X(cuStreamWaitEvent_ptsz, cuStreamWaitEvent_ptsz, "cuStreamWaitEvent_ptsz", "cuStreamWaitEvent", \
    7000, 1, PFN_cuStreamWaitEvent_v7000_ptsz)                                                     \
  X(cuEventCreate, cuEventCreate, "cuEventCreate", "cuEventCreate", 2000, 0,                       \
    PFN_cuEventCreate_v2000)                                                                       \
  X(cuEventRecord, cuEventRecord, "cuEventRecord", "cuEventRecord", 2000, 0,                       \
    PFN_cuEventRecord_v2000)                                                                       \
  X(cuEventRecord_ptsz, cuEventRecord_ptsz, "cuEventRecord_ptsz", "cuEventRecord", 7000, 1,        \
    PFN_cuEventRecord_v7000_ptsz)                                                                  \
  X(cuLaunchKernel, cuLaunchKernel, "cuLaunchKernel", "cuLaunchKernel", 4000, 0,                   \
    PFN_cuLaunchKernel_v4000)                                                                      \
  X(cuLaunchKernel_ptsz, cuLaunchKernel_ptsz, "cuLaunchKernel_ptsz", "cuLaunchKernel", 7000, 1,    \
    PFN_cuLaunchKernel_v7000_ptsz)                                                                 \
  X(cuEventQuery, cuEventQuery, "cuEventQuery", "cuEventQuery", 2000, 0, PFN_cuEventQuery_v2000)   \
  X(cuEventSynchronize, cuEventSynchronize, "cuEventSynchronize", "cuEventSynchronize", 2000, 0,   \
    PFN_cuEventSynchronize_v2000)                                                                  \
  X(cuEventDestroy_v2, cuEventDestroy_v2, "cuEventDestroy_v2", "cuEventDestroy", 4000, 0,          \
    PFN_cuEventDestroy_v4000)                                                                      \
  X(cuEventElapsedTime_v2, cuEventElapsedTime_v2, "cuEventElapsedTime_v2", "cuEventElapsedTime",   \
    12080, 0, PFN_cuEventElapsedTime_v12080)                                                       \
  X(cuMemAllocAsync, cuMemAllocAsync, "cuMemAllocAsync", "cuMemAllocAsync", 11020, 0,              \
    PFN_cuMemAllocAsync_v11020)                                                                    \
  X(cuMemAllocAsync_ptsz, cuMemAllocAsync_ptsz, "cuMemAllocAsync_ptsz", "cuMemAllocAsync", 11020,  \
    1, PFN_cuMemAllocAsync_v11020_ptsz)                                                            \
  X(cuMemFreeAsync, cuMemFreeAsync, "cuMemFreeAsync", "cuMemFreeAsync", 11020, 0,                  \
    PFN_cuMemFreeAsync_v11020)                                                                     \
  X(cuMemFreeAsync_ptsz, cuMemFreeAsync_ptsz, "cuMemFreeAsync_ptsz", "cuMemFreeAsync", 11020, 1,   \
    PFN_cuMemFreeAsync_v11020_ptsz)                                                                \
  X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync",                   \
    "cuMemAllocFromPoolAsync", 11020, 0, PFN_cuMemAllocFromPoolAsync_v11020)                       \
  X(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync_ptsz",    \
    "cuMemAllocFromPoolAsync", 11020, 1, PFN_cuMemAllocFromPoolAsync_v11020_ptsz)                  \
  X(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool",             \
    "cuDeviceGetDefaultMemPool", 11020, 0, PFN_cuDeviceGetDefaultMemPool_v11020)                   \
  X(cuMemPoolTrimTo, cuMemPoolTrimTo, "cuMemPoolTrimTo", "cuMemPoolTrimTo", 11020, 0,              \
    PFN_cuMemPoolTrimTo_v11020)                                                                    \
  X(cuMemPoolGetAttribute, cuMemPoolGetAttribute, "cuMemPoolGetAttribute",                         \
    "cuMemPoolGetAttribute", 11020, 0, PFN_cuMemPoolGetAttribute_v11020)                           \
  X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", \
    "cuMemGetAllocationGranularity", 10020, 0, PFN_cuMemGetAllocationGranularity_v10020)           \
  X(cuMemAddressReserve, cuMemAddressReserve, "cuMemAddressReserve", "cuMemAddressReserve", 10020, \
    0, PFN_cuMemAddressReserve_v10020)                                                             \
  X(cuMemAddressFree, cuMemAddressFree, "cuMemAddressFree", "cuMemAddressFree", 10020, 0,          \
    PFN_cuMemAddressFree_v10020)                                                                   \
  X(cuMemCreate, cuMemCreate, "cuMemCreate", "cuMemCreate", 10020, 0, PFN_cuMemCreate_v10020)      \
  X(cuMemRelease, cuMemRelease, "cuMemRelease", "cuMemRelease", 10020, 0, PFN_cuMemRelease_v10020) \
  X(cuMemMap, cuMemMap, "cuMemMap", "cuMemMap", 10020, 0, PFN_cuMemMap_v10020)                     \
  X(cuMemUnmap, cuMemUnmap, "cuMemUnmap", "cuMemUnmap", 10020, 0, PFN_cuMemUnmap_v10020)           \
  X(cuMemSetAccess, cuMemSetAccess, "cuMemSetAccess", "cuMemSetAccess", 10020, 0,                  \
    PFN_cuMemSetAccess_v10020)                                                                     \
  X(cuStreamBeginCapture_v2, cuStreamBeginCapture_v2, "cuStreamBeginCapture_v2",                   \
    "cuStreamBeginCapture", 10010, 0, PFN_cuStreamBeginCapture_v10010)                             \
  X(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture_v2_ptsz",    \
    "cuStreamBeginCapture", 10010, 1, PFN_cuStreamBeginCapture_v10010_ptsz)                        \
  X(cuStreamEndCapture, cuStreamEndCapture, "cuStreamEndCapture", "cuStreamEndCapture", 10000, 0,  \
    PFN_cuStreamEndCapture_v10000)                                                                 \
  X(cuStreamEndCapture_ptsz, cuStreamEndCapture_ptsz, "cuStreamEndCapture_ptsz",                   \
    "cuStreamEndCapture", 10000, 1, PFN_cuStreamEndCapture_v10000_ptsz)                            \
  X(cuStreamIsCapturing, cuStreamIsCapturing, "cuStreamIsCapturing", "cuStreamIsCapturing", 10000, \
    0, PFN_cuStreamIsCapturing_v10000)                                                             \
  X(cuStreamIsCapturing_ptsz, cuStreamIsCapturing_ptsz, "cuStreamIsCapturing_ptsz",                \
    "cuStreamIsCapturing", 10000, 1, PFN_cuStreamIsCapturing_v10000_ptsz)                          \
  X(cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo_v3, "cuStreamGetCaptureInfo_v3",             \
    "cuStreamGetCaptureInfo", 12030, 0, PFN_cuStreamGetCaptureInfo_v12030)                         \
  X(cuStreamGetCaptureInfo_v3_ptsz, cuStreamGetCaptureInfo_v3_ptsz,                                \
    "cuStreamGetCaptureInfo_v3_ptsz", "cuStreamGetCaptureInfo", 12030, 1,                          \
    PFN_cuStreamGetCaptureInfo_v12030_ptsz)                                                        \
  X(cuThreadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode,                          \
    "cuThreadExchangeStreamCaptureMode", "cuThreadExchangeStreamCaptureMode", 10010, 0,            \
    PFN_cuThreadExchangeStreamCaptureMode_v10010)                                                  \
  X(cuGraphDestroy, cuGraphDestroy, "cuGraphDestroy", "cuGraphDestroy", 10000, 0,                  \
    PFN_cuGraphDestroy_v10000)                                                                     \
  X(cuIpcGetMemHandle, cuIpcGetMemHandle, "cuIpcGetMemHandle", "cuIpcGetMemHandle", 4010, 0,       \
    PFN_cuIpcGetMemHandle_v4010)                                                                   \
  X(cuIpcOpenMemHandle_v2, cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle",   \
    11000, 0, PFN_cuIpcOpenMemHandle_v11000)                                                       \
  X(cuIpcCloseMemHandle, cuIpcCloseMemHandle, "cuIpcCloseMemHandle", "cuIpcCloseMemHandle", 4010,  \
    0, PFN_cuIpcCloseMemHandle_v4010)                                                              \
  X(cuCtxCreate_v4, cuCtxCreate_v4, "cuCtxCreate_v4", "cuCtxCreate", 12050, 0,                     \
    PFN_cuCtxCreate_v12050)                                                                        \
  X(cuCtxDestroy_v2, cuCtxDestroy_v2, "cuCtxDestroy_v2", "cuCtxDestroy", 4000, 0,                  \
    PFN_cuCtxDestroy_v4000)                                                                        \
  X(cuMemHostRegister_v2, cuMemHostRegister_v2, "cuMemHostRegister_v2", "cuMemHostRegister", 6050, \
    0, PFN_cuMemHostRegister_v6050)                                                                \
  X(cuMemHostUnregister, cuMemHostUnregister, "cuMemHostUnregister", "cuMemHostUnregister", 4000,  \
    0, PFN_cuMemHostUnregister_v4000)                                                              \
  X(cuMemHostGetDevicePointer_v2, cuMemHostGetDevicePointer_v2, "cuMemHostGetDevicePointer_v2",    \
    "cuMemHostGetDevicePointer", 3020, 0, PFN_cuMemHostGetDevicePointer_v3020)                     \
  X(cuStreamGetCaptureInfo_v2, cuStreamGetCaptureInfo_v2, "cuStreamGetCaptureInfo_v2",             \
    "cuStreamGetCaptureInfo", 11030, 0, PFN_cuStreamGetCaptureInfo_v11030)                         \
  X(cuStreamGetCaptureInfo_v2_ptsz, cuStreamGetCaptureInfo_v2_ptsz,                                \
    "cuStreamGetCaptureInfo_v2_ptsz", "cuStreamGetCaptureInfo", 11030, 1,                          \
    PFN_cuStreamGetCaptureInfo_v11030_ptsz)                                                        \
  X(cuArrayCreate_v2, cuArrayCreate_v2, "cuArrayCreate_v2", "cuArrayCreate", 3020, 0,              \
    PFN_cuArrayCreate_v3020)                                                                       \
  X(cuArray3DCreate_v2, cuArray3DCreate_v2, "cuArray3DCreate_v2", "cuArray3DCreate", 3020, 0,      \
    PFN_cuArray3DCreate_v3020)                                                                     \
  X(cuMipmappedArrayCreate, cuMipmappedArrayCreate, "cuMipmappedArrayCreate",                      \
    "cuMipmappedArrayCreate", 5000, 0, PFN_cuMipmappedArrayCreate_v5000)                           \
  X(cuArrayDestroy, cuArrayDestroy, "cuArrayDestroy", "cuArrayDestroy", 2000, 0,                   \
    PFN_cuArrayDestroy_v2000)                                                                      \
  X(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy",                   \
    "cuMipmappedArrayDestroy", 5000, 0, PFN_cuMipmappedArrayDestroy_v5000)                         \
  X(cuArrayGetMemoryRequirements, cuArrayGetMemoryRequirements, "cuArrayGetMemoryRequirements",    \
    "cuArrayGetMemoryRequirements", 11060, 0, PFN_cuArrayGetMemoryRequirements_v11060)             \
  X(cuGraphCreate, cuGraphCreate, "cuGraphCreate", "cuGraphCreate", 10000, 0,                      \
    PFN_cuGraphCreate_v10000)                                                                      \
  X(cuGraphAddMemAllocNode, cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode",                      \
    "cuGraphAddMemAllocNode", 11040, 0, PFN_cuGraphAddMemAllocNode_v11040)                         \
  X(cuGraphAddNode_v12020, vramscope_fake_cuGraphAddNode_v12020, "cuGraphAddNode",                 \
    "cuGraphAddNode", 12020, 0, PFN_cuGraphAddNode_v12020)                                         \
  X(cuGraphAddNode_v2, cuGraphAddNode_v2, "cuGraphAddNode_v2", "cuGraphAddNode", 12030, 0,         \
    PFN_cuGraphAddNode_v12030)                                                                     \
  X(cuGraphInstantiate_v10000, vramscope_fake_cuGraphInstantiate_v10000, "cuGraphInstantiate",     \
    "cuGraphInstantiate", 10000, 0, PFN_vramscope_cuGraphInstantiate_v10000)                       \
  X(cuGraphInstantiate_v2, cuGraphInstantiate_v2, "cuGraphInstantiate_v2", "cuGraphInstantiate",   \
    11000, 0, PFN_vramscope_cuGraphInstantiate_v11000)                                             \
  X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags",       \
    "cuGraphInstantiateWithFlags", 11040, 0, PFN_cuGraphInstantiateWithFlags_v11040)               \
  X(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, "cuGraphInstantiateWithParams",    \
    "cuGraphInstantiateWithParams", 12000, 0, PFN_cuGraphInstantiateWithParams_v12000)             \
  X(cuGraphInstantiateWithParams_ptsz, cuGraphInstantiateWithParams_ptsz,                          \
    "cuGraphInstantiateWithParams_ptsz", "cuGraphInstantiateWithParams", 12000, 1,                 \
    PFN_cuGraphInstantiateWithParams_v12000_ptsz)                                                  \
  X(cuGraphUpload, cuGraphUpload, "cuGraphUpload", "cuGraphUpload", 11010, 0,                      \
    PFN_cuGraphUpload_v11010)                                                                      \
  X(cuGraphUpload_ptsz, cuGraphUpload_ptsz, "cuGraphUpload_ptsz", "cuGraphUpload", 11010, 1,       \
    PFN_cuGraphUpload_v11010_ptsz)                                                                 \
  X(cuGraphLaunch, cuGraphLaunch, "cuGraphLaunch", "cuGraphLaunch", 10000, 0,                      \
    PFN_cuGraphLaunch_v10000)                                                                      \
  X(cuGraphLaunch_ptsz, cuGraphLaunch_ptsz, "cuGraphLaunch_ptsz", "cuGraphLaunch", 10000, 1,       \
    PFN_cuGraphLaunch_v10000_ptsz)                                                                 \
  X(cuGraphExecDestroy, cuGraphExecDestroy, "cuGraphExecDestroy", "cuGraphExecDestroy", 10000, 0,  \
    PFN_cuGraphExecDestroy_v10000)                                                                 \
  X(cuDeviceGraphMemTrim, cuDeviceGraphMemTrim, "cuDeviceGraphMemTrim", "cuDeviceGraphMemTrim",    \
    11040, 0, PFN_cuDeviceGraphMemTrim_v11040)                                                     \
  X(cuDeviceGetGraphMemAttribute, cuDeviceGetGraphMemAttribute, "cuDeviceGetGraphMemAttribute",    \
    "cuDeviceGetGraphMemAttribute", 11040, 0, PFN_cuDeviceGetGraphMemAttribute_v11040)

struct DriverApi {
#define VRAMSCOPE_FAKE_MEMBER(member, direct, exported, symbol, version, per_thread, pfn) \
  pfn member = nullptr;
  VRAMSCOPE_FAKE_DRIVER_API(VRAMSCOPE_FAKE_MEMBER)
#undef VRAMSCOPE_FAKE_MEMBER
};

// One row of VRAMSCOPE_FAKE_DRIVER_API, for tests that iterate over every entry point.
struct EntryPoint {
  const char* member;    // == exported, except cuGetProcAddress_v11030 ("cuGetProcAddress")
  const char* exported;  // exact symbol name in libcuda.so.1
  const char* symbol;    // base name for cuGetProcAddress
  int version;           // CUDA version of this ABI
  bool per_thread;       // fetched with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
};

// All rows, in declaration order.
const std::vector<EntryPoint>& EntryPoints();

// The member of `api` named by `entry`, as an untyped pointer (nullptr if not loaded).
void* Get(const DriverApi& api, const EntryPoint& entry);

// Path of the shared object (or executable) containing `fn`, from dladdr; "" if unknown.
std::string ModuleOf(const void* fn);

// (R3) dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), then dlsym of every exact name.
bool LoadByDlsym(DriverApi* api, std::string* error);

// (R1) The CUDA runtime's sequence (see the file comment). Every lookup must return
// CUDA_SUCCESS, a non-NULL pointer and CU_GET_PROC_ADDRESS_SUCCESS; the empty-name probe must
// return CUDA_SUCCESS with NULL. Each entry is asked for at its own ABI version (a runtime
// passes its own version, which gives the same function unless a newer ABI superseded it).
bool LoadByProcAddress(DriverApi* api, std::string* error);

// (R4) Address of each exported name as the dynamic linker bound it for this program. Defined
// in routes_direct.cc (fake_routes_direct_dep).
bool LoadDirect(DriverApi* api, std::string* error);

// The fake's control API fetched with dlsym, for programs that do not link the fake
// (fake_cuda_control.h documents each function).
struct FakeControl {
  void (*reset)(void) = nullptr;
  int (*set_capacity)(int device, size_t bytes) = nullptr;
  int (*set_device_count)(int count) = nullptr;
  void (*set_manual_events)(int on) = nullptr;
  void (*set_blocking_sync)(int on) = nullptr;
  int (*complete_all_events)(void) = nullptr;
  int (*complete_next_event)(void) = nullptr;
  int (*pending_events)(void) = nullptr;
  uint64_t (*call_count)(const char* exact_name) = nullptr;
  uint64_t (*total_calls)(void) = nullptr;
  uint64_t (*lookup_count)(const char* symbol) = nullptr;
  size_t (*live_bytes)(int device) = nullptr;
  int (*live_allocations)(int device) = nullptr;
  int (*live_host_allocations)(void) = nullptr;
  size_t (*pool_cached_bytes)(int device) = nullptr;
  int (*live_reservations)(void) = nullptr;
  int (*live_mappings)(void) = nullptr;
  int (*active_captures)(void) = nullptr;
  int (*invalidated_captures)(void) = nullptr;
  int (*forked_after_init)(void) = nullptr;
};

// dlopen("libcuda.so.1") (the already loaded one, if any) and dlsym("vramscope_fake_*").
// Returns false if the loaded libcuda.so.1 is not the fake.
bool LoadFakeControl(FakeControl* control, std::string* error);

}  // namespace vramscope::fake

#endif  // VRAMSCOPE_TESTS_FAKES_ROUTES_H_
