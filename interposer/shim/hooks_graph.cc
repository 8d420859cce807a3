// Graph memory nodes: passed through unchanged; the device's graph memory pool is recorded as
// one entry per device (graph_memory.h has the scheme).
//
// Making a mem-alloc node (cuGraphAddMemAllocNode, cuGraphAddNode(_v2) of type MEM_ALLOC, or
// cuMemAllocAsync on a capturing stream in hooks_passthrough.cc) marks its device. The calls
// that can change what the pool holds (every cuGraphInstantiate* ABI, cuGraphUpload(_ptsz),
// cuGraphLaunch(_ptsz), cuGraphExecDestroy, cuGraphDestroy, cuDeviceGraphMemTrim) then re-read
// CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT of the marked devices after the driver returns,
// whatever it returned (a failed launch may still have mapped memory). Before the first node
// that is one relaxed load per call. Instantiation, upload and launch map graph memory: a driver
// OOM there gives the pools' idle memory back and retries once, as for every passthrough call.
#include "graph_memory.h"
#include "hooks.h"
#include "ordered.h"
#include "stream_fence.h"

using namespace vramscope::interposer;

namespace vramscope::interposer {
namespace {

// The device a mem-alloc node's memory lives on: its pool's location, else the current one.
int NodeDevice(const CUmemPoolProps& props) {
  return props.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? props.location.id : -1;
}

CUresult AfterGraphCall(CUresult result) {
  RefreshGraphMemory();
  return result;
}

}  // namespace
}  // namespace vramscope::interposer

VRAMSCOPE_EXPORT CUresult CUDAAPI cuGraphAddMemAllocNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                                         const CUgraphNode* dependencies,
                                                         size_t numDependencies,
                                                         CUDA_MEM_ALLOC_NODE_PARAMS* nodeParams) {
  VRAMSCOPE_PROLOGUE(cuGraphAddMemAllocNode);
  const CUresult result =
      real.cuGraphAddMemAllocNode(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
  if (result == CUDA_SUCCESS && nodeParams != nullptr) {
    NoteGraphMemAllocNode(NodeDevice(nodeParams->poolProps));
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuGraphAddNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                                 const CUgraphNode* dependencies,
                                                 size_t numDependencies,
                                                 CUgraphNodeParams* nodeParams) {
  VRAMSCOPE_PROLOGUE(cuGraphAddNode);
  const CUresult result =
      real.cuGraphAddNode(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
  if (result == CUDA_SUCCESS && nodeParams != nullptr &&
      nodeParams->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
    NoteGraphMemAllocNode(NodeDevice(nodeParams->alloc.poolProps));
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode* phGraphNode, CUgraph hGraph,
                                                    const CUgraphNode* dependencies,
                                                    const CUgraphEdgeData* dependencyData,
                                                    size_t numDependencies,
                                                    CUgraphNodeParams* nodeParams) {
  VRAMSCOPE_PROLOGUE(cuGraphAddNode_v2);
  const CUresult result = real.cuGraphAddNode_v2(phGraphNode, hGraph, dependencies, dependencyData,
                                                 numDependencies, nodeParams);
  if (result == CUDA_SUCCESS && nodeParams != nullptr &&
      nodeParams->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
    NoteGraphMemAllocNode(NodeDevice(nodeParams->alloc.poolProps));
  }
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuGraphInstantiate(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                     CUgraphNode* phErrorNode, char* logBuffer,
                                                     size_t bufferSize) {
  VRAMSCOPE_PROLOGUE(cuGraphInstantiate);
  return AfterGraphCall(WithOomRetry([&] {
    return real.cuGraphInstantiate(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
  }));
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                        CUgraphNode* phErrorNode, char* logBuffer,
                                                        size_t bufferSize) {
  VRAMSCOPE_PROLOGUE(cuGraphInstantiate_v2);
  return AfterGraphCall(WithOomRetry([&] {
    return real.cuGraphInstantiate_v2(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
  }));
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec,
                                                              CUgraph hGraph,
                                                              unsigned long long flags) {
  VRAMSCOPE_PROLOGUE(cuGraphInstantiateWithFlags);
  return AfterGraphCall(
      WithOomRetry([&] { return real.cuGraphInstantiateWithFlags(phGraphExec, hGraph, flags); }));
}

namespace {

// Instantiation with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD queues the upload on hUploadStream.
void WatchUploadStream(const CUDA_GRAPH_INSTANTIATE_PARAMS* params, bool per_thread,
                       const char* where) {
  if (params != nullptr && (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0) {
    WatchStream(params->hUploadStream, per_thread, where);
  }
}

// The stream an instantiation uploads on, or kNoUpload.
const CUstream kNoUpload = reinterpret_cast<CUstream>(~std::uintptr_t{0});
CUstream UploadStream(const CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return params != nullptr && (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0
             ? params->hUploadStream
             : kNoUpload;
}

}  // namespace

VRAMSCOPE_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams(
    CUgraphExec* phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams) {
  VRAMSCOPE_PROLOGUE(cuGraphInstantiateWithParams);
  WatchUploadStream(instantiateParams, false, "cuGraphInstantiateWithParams");
  const StreamWorkNote note(UploadStream(instantiateParams), false,
                            UploadStream(instantiateParams) != kNoUpload);
  return AfterGraphCall(WithOomRetry(
      [&] { return real.cuGraphInstantiateWithParams(phGraphExec, hGraph, instantiateParams); }));
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(
    CUgraphExec* phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams) {
  VRAMSCOPE_PROLOGUE(cuGraphInstantiateWithParams_ptsz);
  WatchUploadStream(instantiateParams, true, "cuGraphInstantiateWithParams_ptsz");
  const StreamWorkNote note(UploadStream(instantiateParams), true,
                            UploadStream(instantiateParams) != kNoUpload);
  return AfterGraphCall(WithOomRetry([&] {
    return real.cuGraphInstantiateWithParams_ptsz(phGraphExec, hGraph, instantiateParams);
  }));
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream) {
  VRAMSCOPE_PROLOGUE(cuGraphUpload);
  WatchStream(hStream, false, "cuGraphUpload");
  const StreamWorkNote note(hStream, false);
  return AfterGraphCall(WithOomRetry([&] { return real.cuGraphUpload(hGraphExec, hStream); }));
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  VRAMSCOPE_PROLOGUE(cuGraphUpload_ptsz);
  WatchStream(hStream, true, "cuGraphUpload_ptsz");
  const StreamWorkNote note(hStream, true);
  return AfterGraphCall(WithOomRetry([&] { return real.cuGraphUpload_ptsz(hGraphExec, hStream); }));
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  VRAMSCOPE_PROLOGUE(cuGraphLaunch);
  WatchStream(hStream, false, "cuGraphLaunch");
  const StreamWorkNote note(hStream, false);
  return AfterGraphCall(WithOomRetry([&] { return real.cuGraphLaunch(hGraphExec, hStream); }));
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  VRAMSCOPE_PROLOGUE(cuGraphLaunch_ptsz);
  WatchStream(hStream, true, "cuGraphLaunch_ptsz");
  const StreamWorkNote note(hStream, true);
  return AfterGraphCall(WithOomRetry([&] { return real.cuGraphLaunch_ptsz(hGraphExec, hStream); }));
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec) {
  VRAMSCOPE_PROLOGUE(cuGraphExecDestroy);
  return AfterGraphCall(real.cuGraphExecDestroy(hGraphExec));
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph) {
  VRAMSCOPE_PROLOGUE(cuGraphDestroy);
  return AfterGraphCall(real.cuGraphDestroy(hGraph));
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuDeviceGraphMemTrim(CUdevice device) {
  VRAMSCOPE_PROLOGUE(cuDeviceGraphMemTrim);
  const CUresult result = real.cuDeviceGraphMemTrim(device);
  RefreshGraphMemory(device);
  return result;
}
