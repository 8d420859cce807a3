// Declarations of exported driver names that CUDA 13's <cuda.h> does not declare in ordinary
// builds.
//
// The real libcuda.so.1 exports more names than <cuda.h> lets a program call by name: the
// per-thread-default-stream variants (`*_ptsz`, `*_ptds`), which the header only declares when
// CUDA_API_PER_THREAD_DEFAULT_STREAM or __CUDA_API_VERSION_INTERNAL is set, and the 4-argument
// `cuGetProcAddress` of the CUDA 11.3 ABI, which the header hides behind
// `#define cuGetProcAddress cuGetProcAddress_v2`. The runtime reaches all of them through
// cuGetProcAddress_v2, and JAX/cuBLASLt/ctypes reach them with dlsym by exact name, so the fake
// exports them and the route helpers name them. Signatures are copied from the
// __CUDA_API_VERSION_INTERNAL section of cuda.h and from cudaTypedefs.h (PFN_*_ptsz).
//
// Include after <cuda.h>. Plain C declarations, no state.
#ifndef VRAMSCOPE_TESTS_FAKES_FAKE_CUDA_DECLS_H_
#define VRAMSCOPE_TESTS_FAKES_FAKE_CUDA_DECLS_H_

#include <cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

// CUDA 11.3 ABI of cuGetProcAddress (PFN_cuGetProcAddress_v11030). In CUDA 13's cuda.h the name
// cuGetProcAddress is a macro for cuGetProcAddress_v2, so the 4-argument symbol is declared
// under a distinct C++ name and bound to the exported symbol with an asm label.
CUresult CUDAAPI vramscope_fake_cuGetProcAddress_v11030(
    const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) __asm__("cuGetProcAddress");

// Per-thread default stream variants (PFN_*_ptsz / PFN_*_ptds in cudaTypedefs.h).
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream hStream);
CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream);
CUresult CUDAAPI cuStreamQuery_ptsz(CUstream hStream);
CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags);
CUresult CUDAAPI cuEventRecord_ptsz(CUevent hEvent, CUstream hStream);
CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                     unsigned int gridDimZ, unsigned int blockDimX,
                                     unsigned int blockDimY, unsigned int blockDimZ,
                                     unsigned int sharedMemBytes, CUstream hStream,
                                     void** kernelParams, void** extra);
CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph);
CUresult CUDAAPI cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus);
CUresult CUDAAPI cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream,
                                                CUstreamCaptureStatus* captureStatus_out,
                                                cuuint64_t* id_out, CUgraph* graph_out,
                                                const CUgraphNode** dependencies_out,
                                                const CUgraphEdgeData** edgeData_out,
                                                size_t* numDependencies_out);
CUresult CUDAAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount);
CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult CUDAAPI cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                      size_t ByteCount);
CUresult CUDAAPI cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N);

// cuCtxCreate's CUDA 3.2 and 11.4 ABIs (cuda.h maps cuCtxCreate to cuCtxCreate_v4).
CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* paramsArray, int numParams,
                                unsigned int flags, CUdevice dev);

// Older stream-capture ABIs, still requested by CUDA 11/12 runtimes.
CUresult CUDAAPI
vramscope_fake_cuStreamBeginCapture_v10000(CUstream hStream) __asm__("cuStreamBeginCapture");
CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hStream);
CUresult CUDAAPI vramscope_fake_cuStreamGetCaptureInfo_v10010(
    CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
    cuuint64_t* id_out) __asm__("cuStreamGetCaptureInfo");
CUresult CUDAAPI cuStreamGetCaptureInfo_ptsz(CUstream hStream,
                                             CUstreamCaptureStatus* captureStatus_out,
                                             cuuint64_t* id_out);
CUresult CUDAAPI cuStreamGetCaptureInfo_v2(CUstream hStream,
                                           CUstreamCaptureStatus* captureStatus_out,
                                           cuuint64_t* id_out, CUgraph* graph_out,
                                           const CUgraphNode** dependencies_out,
                                           size_t* numDependencies_out);
CUresult CUDAAPI cuStreamGetCaptureInfo_v2_ptsz(CUstream hStream,
                                                CUstreamCaptureStatus* captureStatus_out,
                                                cuuint64_t* id_out, CUgraph* graph_out,
                                                const CUgraphNode** dependencies_out,
                                                size_t* numDependencies_out);

// Older ABIs of names whose current version cuda.h maps to a _v2 (declared by cuda.h only under
// __CUDA_API_VERSION_INTERNAL; the real driver still exports them).
CUresult CUDAAPI vramscope_fake_cuDeviceGetUuid_v9020(CUuuid* uuid,
                                                      CUdevice dev) __asm__("cuDeviceGetUuid");
CUresult CUDAAPI
vramscope_fake_cuDevicePrimaryCtxRelease_v7000(CUdevice dev) __asm__("cuDevicePrimaryCtxRelease");
CUresult CUDAAPI
vramscope_fake_cuDevicePrimaryCtxReset_v7000(CUdevice dev) __asm__("cuDevicePrimaryCtxReset");
CUresult CUDAAPI vramscope_fake_cuIpcOpenMemHandle_v4010(
    CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) __asm__("cuIpcOpenMemHandle");
CUresult CUDAAPI vramscope_fake_cuEventElapsedTime_v2000(
    float* pMilliseconds, CUevent hStart, CUevent hEnd) __asm__("cuEventElapsedTime");
CUresult CUDAAPI vramscope_fake_cuStreamDestroy_v2000(CUstream hStream) __asm__("cuStreamDestroy");
CUresult CUDAAPI vramscope_fake_cuEventDestroy_v2000(CUevent hEvent) __asm__("cuEventDestroy");

// Graphs: the CUDA 10.0 and 11.0 ABIs of cuGraphInstantiate (cuda.h maps the name to
// cuGraphInstantiateWithFlags), the CUDA 12.2 ABI of cuGraphAddNode (the name maps to
// cuGraphAddNode_v2), and the per-thread-stream variants.
CUresult CUDAAPI vramscope_fake_cuGraphInstantiate_v10000(
    CUgraphExec* phGraphExec, CUgraph hGraph, CUgraphNode* phErrorNode, char* logBuffer,
    size_t bufferSize) __asm__("cuGraphInstantiate");
CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec* phGraphExec, CUgraph hGraph,
                                       CUgraphNode* phErrorNode, char* logBuffer,
                                       size_t bufferSize);
CUresult CUDAAPI vramscope_fake_cuGraphAddNode_v12020(
    CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
    size_t numDependencies, CUgraphNodeParams* nodeParams) __asm__("cuGraphAddNode");
CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(
    CUgraphExec* phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams);
CUresult CUDAAPI cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream);
CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // VRAMSCOPE_TESTS_FAKES_FAKE_CUDA_DECLS_H_
