// Declarations of the exact exported driver names that <cuda.h> does not declare in an ordinary
// build, and the list of every entry point the shim hooks.
//
// CUDA 13's <cuda.h> maps base names to versioned ones with macros (cuMemAlloc -> cuMemAlloc_v2)
// and declares the per-thread-default-stream variants (*_ptsz) only under
// CUDA_API_PER_THREAD_DEFAULT_STREAM; it also hides the 4-argument cuGetProcAddress of the
// CUDA 11.3 ABI behind `#define cuGetProcAddress cuGetProcAddress_v2`. The shim must define the
// exact exported names, so it declares the missing ones here (signatures from the
// __CUDA_API_VERSION_INTERNAL section of cuda.h / cudaTypedefs.h).
#pragma once

#include <cuda.h>

#undef cuGetProcAddress
#undef cuStreamBeginCapture
#undef cuStreamEndCapture
#undef cuStreamBeginCaptureToGraph
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuCtxDestroy
#undef cuStreamDestroy
#undef cuGraphInstantiate
#undef cuGraphAddNode
#undef cuIpcOpenMemHandle

extern "C" {
CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                  cuuint64_t flags);
// Pre-11.0 names of the context teardown calls (same arguments as their _v2).
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev);
CUresult CUDAAPI cuCtxDestroy(CUcontext ctx);
// Pre-11.0 name of cuIpcOpenMemHandle_v2 (same arguments).
CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags);
CUresult CUDAAPI cuStreamDestroy(CUstream hStream);
CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream);
CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hStream);
CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph* phGraph);
CUresult CUDAAPI cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                             const CUgraphNode* dependencies,
                                             const CUgraphEdgeData* dependencyData,
                                             size_t numDependencies, CUstreamCaptureMode mode);
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream hStream);
CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph);
CUresult CUDAAPI cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus);
CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                  const CUgraphNode* dependencies,
                                                  const CUgraphEdgeData* dependencyData,
                                                  size_t numDependencies, CUstreamCaptureMode mode);
// Graphs: the CUDA 10.0 and 11.0 ABIs of cuGraphInstantiate (cuda.h now maps the name to
// cuGraphInstantiateWithFlags), the CUDA 12.2 ABI of cuGraphAddNode (no edge data; the name maps
// to cuGraphAddNode_v2), and the per-thread-stream variants.
CUresult CUDAAPI cuGraphInstantiate(CUgraphExec* phGraphExec, CUgraph hGraph,
                                    CUgraphNode* phErrorNode, char* logBuffer, size_t bufferSize);
CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec* phGraphExec, CUgraph hGraph,
                                       CUgraphNode* phErrorNode, char* logBuffer,
                                       size_t bufferSize);
CUresult CUDAAPI cuGraphAddNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                const CUgraphNode* dependencies, size_t numDependencies,
                                CUgraphNodeParams* nodeParams);
CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(
    CUgraphExec* phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams);
CUresult CUDAAPI cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream);
CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);
}

// Every entry point the shim exports and substitutes when cuGetProcAddress or dlsym returns the
// driver's own function. X(exact_name).
#define VRAMSCOPE_HOOKED_ENTRY_POINTS(X) \
  X(cuGetProcAddress)                    \
  X(cuGetProcAddress_v2)                 \
  X(cuMemAlloc_v2)                       \
  X(cuMemFree_v2)                        \
  X(cuMemGetInfo_v2)                     \
  X(cuMemGetAddressRange_v2)             \
  X(cuPointerGetAttribute)               \
  X(cuPointerGetAttributes)              \
  X(cuMemAllocPitch_v2)                  \
  X(cuMemAllocManaged)                   \
  X(cuMemHostAlloc)                      \
  X(cuMemAllocHost_v2)                   \
  X(cuMemFreeHost)                       \
  X(cuMemHostRegister_v2)                \
  X(cuMemHostUnregister)                 \
  X(cuMemAllocAsync)                     \
  X(cuMemAllocAsync_ptsz)                \
  X(cuMemFreeAsync)                      \
  X(cuMemFreeAsync_ptsz)                 \
  X(cuMemAllocFromPoolAsync)             \
  X(cuMemAllocFromPoolAsync_ptsz)        \
  X(cuMemCreate)                         \
  X(cuMemRelease)                        \
  X(cuMemMap)                            \
  X(cuMemUnmap)                          \
  X(cuMemAddressReserve)                 \
  X(cuMemAddressFree)                    \
  X(cuIpcGetMemHandle)                   \
  X(cuIpcOpenMemHandle_v2)               \
  X(cuIpcOpenMemHandle)                  \
  X(cuIpcCloseMemHandle)                 \
  X(cuStreamBeginCapture)                \
  X(cuStreamBeginCapture_ptsz)           \
  X(cuStreamBeginCapture_v2)             \
  X(cuStreamBeginCapture_v2_ptsz)        \
  X(cuStreamBeginCaptureToGraph)         \
  X(cuStreamBeginCaptureToGraph_ptsz)    \
  X(cuStreamEndCapture)                  \
  X(cuStreamEndCapture_ptsz)             \
  X(cuCtxSynchronize)                    \
  X(cuCtxSynchronize_v2)                 \
  X(cuDevicePrimaryCtxReset_v2)          \
  X(cuDevicePrimaryCtxReset)             \
  X(cuDevicePrimaryCtxRelease_v2)        \
  X(cuDevicePrimaryCtxRelease)           \
  X(cuCtxDestroy_v2)                     \
  X(cuCtxDestroy)                        \
  X(cuStreamDestroy_v2)                  \
  X(cuStreamDestroy)                     \
  X(cuArrayCreate_v2)                    \
  X(cuArray3DCreate_v2)                  \
  X(cuMipmappedArrayCreate)              \
  X(cuArrayDestroy)                      \
  X(cuMipmappedArrayDestroy)             \
  X(cuGraphAddMemAllocNode)              \
  X(cuGraphAddNode)                      \
  X(cuGraphAddNode_v2)                   \
  X(cuGraphInstantiate)                  \
  X(cuGraphInstantiate_v2)               \
  X(cuGraphInstantiateWithFlags)         \
  X(cuGraphInstantiateWithParams)        \
  X(cuGraphInstantiateWithParams_ptsz)   \
  X(cuGraphUpload)                       \
  X(cuGraphUpload_ptsz)                  \
  X(cuGraphLaunch)                       \
  X(cuGraphLaunch_ptsz)                  \
  X(cuGraphExecDestroy)                  \
  X(cuGraphDestroy)                      \
  X(cuDeviceGraphMemTrim)

// Driver functions the shim calls for its own work but does not hook. X(exact_name).
#define VRAMSCOPE_USED_ENTRY_POINTS(X)      \
  X(cuCtxGetCurrent)                        \
  X(cuCtxGetDevice)                         \
  X(cuCtxPushCurrent_v2)                    \
  X(cuCtxPopCurrent_v2)                     \
  X(cuDeviceGetAttribute)                   \
  X(cuDeviceCanAccessPeer)                  \
  X(cuDeviceGetCount)                       \
  X(cuDeviceGetName)                        \
  X(cuDeviceGetUuid_v2)                     \
  X(cuDeviceTotalMem_v2)                    \
  X(cuDevicePrimaryCtxGetState)             \
  X(cuDevicePrimaryCtxRetain)               \
  X(cuMemSetAccess)                         \
  X(cuMemGetAllocationGranularity)          \
  X(cuMemRetainAllocationHandle)            \
  X(cuMemExportToShareableHandle)           \
  X(cuMemImportFromShareableHandle)         \
  X(cuMemGetAllocationPropertiesFromHandle) \
  X(cuStreamIsCapturing)                    \
  X(cuStreamIsCapturing_ptsz)               \
  X(cuStreamGetCtx)                         \
  X(cuEventCreate)                          \
  X(cuEventQuery)                           \
  X(cuEventSynchronize)                     \
  X(cuEventDestroy_v2)                      \
  X(cuThreadExchangeStreamCaptureMode)      \
  X(cuDeviceGetGraphMemAttribute)           \
  X(cuArrayGetMemoryRequirements)           \
  X(cuMipmappedArrayGetMemoryRequirements)
