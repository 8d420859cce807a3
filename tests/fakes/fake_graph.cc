// Graphs and graph memory of the fake CUDA driver: cuGraphCreate/Destroy, mem-alloc nodes
// (cuGraphAddMemAllocNode, cuGraphAddNode(_v2), and cuMemAllocAsync on a capturing stream, which
// fake_streams.cc hands over at cuStreamEndCapture), instantiation (every ABI), upload, launch,
// cuGraphExecDestroy, and each device's graph memory pool (cuDeviceGraphMemTrim,
// cuDeviceGet/SetGraphMemAttribute).
//
// Model of the graph memory pool (simpler than the driver, same observable figures): an exec
// needs, per device, the sum of its graph's mem-alloc node sizes (no reuse inside a graph).
// Instantiation maps that need (so does upload or launch of an exec a trim unmapped): the pool's
// used bytes grow by it, and its reserved bytes (charged to the device, what cuMemGetInfo and
// vramscope_fake_live_bytes see) grow to cover used. cuGraphExecDestroy unmaps: reserved stays,
// cached for the next graph. cuDeviceGraphMemTrim unmaps every exec of that device (launches
// complete at once here, so none is running) and uncharges everything reserved. Nodes other than
// MEM_ALLOC and EMPTY are refused (CUDA_ERROR_NOT_SUPPORTED): the fake runs no work.
#include <cuda.h>

#include "fake_cuda_decls.h"
#include "fake_state.h"

namespace vramscope::fake {
namespace {

CUresult CheckMemAllocParams(const State& s, const CUmemPoolProps& props, size_t bytes) {
  if (bytes == 0 || props.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
      props.location.type != CU_MEM_LOCATION_TYPE_DEVICE || !ValidDevice(s, props.location.id) ||
      props.handleTypes != CU_MEM_HANDLE_TYPE_NONE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// A mem-alloc node: the graph-owned address (host memory, not charged) and the node.
CUresult AddMemAllocNode(Call& call, CUgraphNode* node, CUgraph graph, const CUmemPoolProps& props,
                         size_t bytes, CUdeviceptr* dptr) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (node == nullptr || s.graphs.count(graph) == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckMemAllocParams(s, props, bytes); r != CUDA_SUCCESS) return r;
  void* p = AllocStorage(bytes);
  if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  Allocation a;
  a.size = bytes;
  a.device = props.location.id;
  a.ctx = &s.devices[a.device].primary;
  a.kind = AllocKind::kGraph;
  a.buffer_id = s.next_buffer_id++;
  a.storage = p;
  *dptr = reinterpret_cast<CUdeviceptr>(p);
  s.allocations.emplace(*dptr, a);
  auto* n = new CUgraphNode_st;
  n->device = a.device;
  n->bytes = bytes;
  graph->nodes.push_back(n);
  *node = n;
  return CUDA_SUCCESS;
}

CUresult AddNode(Call& call, CUgraphNode* node, CUgraph graph, CUgraphNodeParams* params) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (node == nullptr || params == nullptr || s.graphs.count(graph) == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  switch (params->type) {
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
      return AddMemAllocNode(call, node, graph, params->alloc.poolProps, params->alloc.bytesize,
                             &params->alloc.dptr);
    case CU_GRAPH_NODE_TYPE_EMPTY: {
      auto* n = new CUgraphNode_st;
      graph->nodes.push_back(n);
      *node = n;
      return CUDA_SUCCESS;
    }
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

void Unmap(State& s, CUgraphExec_st* exec, int device) {
  if (!exec->mapped[device]) return;
  s.devices[device].graph_used -= exec->need[device];
  exec->mapped[device] = false;
}

// Maps every unmapped part of `exec`, growing the pools' reserved bytes as needed.
CUresult Map(State& s, CUgraphExec_st* exec) {
  for (int d = 0; d < kMaxDevices; ++d) {
    if (exec->mapped[d] || exec->need[d] == 0) continue;
    Device& device = s.devices[d];
    const size_t used = device.graph_used + exec->need[d];
    if (used > device.graph_reserved) {
      if (!Charge(s, d, used - device.graph_reserved)) return CUDA_ERROR_OUT_OF_MEMORY;
      device.graph_reserved = used;
    }
    device.graph_used = used;
    exec->mapped[d] = true;
    if (device.graph_used > device.graph_used_high) device.graph_used_high = device.graph_used;
    if (device.graph_reserved > device.graph_reserved_high) {
      device.graph_reserved_high = device.graph_reserved;
    }
  }
  return CUDA_SUCCESS;
}

void DestroyExec(State& s, CUgraphExec_st* exec) {
  for (int d = 0; d < kMaxDevices; ++d) Unmap(s, exec, d);
  s.graph_execs.erase(exec);
  delete exec;
}

CUresult Instantiate(Call& call, CUgraphExec* out, CUgraph graph) {
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (out == nullptr || s.graphs.count(graph) == 0) return CUDA_ERROR_INVALID_VALUE;
  auto* exec = new CUgraphExec_st;
  exec->ctx = ctx;
  for (const CUgraphNode_st* node : graph->nodes) {
    if (node->device >= 0) exec->need[node->device] += node->bytes;
  }
  s.graph_execs.insert(exec);
  if (CUresult r = Map(s, exec); r != CUDA_SUCCESS) {
    DestroyExec(s, exec);
    return r;
  }
  *out = exec;
  return CUDA_SUCCESS;
}

CUresult MapForLaunch(Call& call, CUgraphExec exec, CUstream stream, bool per_thread) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (s.graph_execs.count(exec) == 0) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t key = 0;
  if (!StreamKey(s, stream, per_thread, &key)) return CUDA_ERROR_INVALID_HANDLE;
  NoteWorkLocked(call, key);  // the graph's nodes run on the stream from here
  return Map(s, exec);
}

CUresult InstantiateWithParams(Call& call, CUgraphExec* out, CUgraph graph,
                               CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUresult r = Instantiate(call, out, graph);
  params->result_out =
      r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
  return r;
}

}  // namespace

void ResetGraphsAndArraysLocked(State& s) {
  while (!s.graph_execs.empty()) DestroyExec(s, *s.graph_execs.begin());
  for (CUarray_st* array : s.arrays) delete array;
  s.arrays.clear();
  for (Device& d : s.devices) {
    d.graph_reserved = d.graph_used = d.graph_reserved_high = d.graph_used_high = 0;
  }
}

void DestroyContextGraphsAndArraysLocked(State& s, CUctx_st* ctx) {
  for (auto it = s.graph_execs.begin(); it != s.graph_execs.end();) {
    CUgraphExec_st* exec = *it++;
    if (exec->ctx == ctx) DestroyExec(s, exec);
  }
  for (auto it = s.arrays.begin(); it != s.arrays.end();) {
    CUarray_st* array = *it;
    if (array->ctx == ctx) {
      Uncharge(s, array->device, array->charged);
      delete array;
      it = s.arrays.erase(it);
    } else {
      ++it;
    }
  }
  if (ctx->primary) {
    // The device's graph pool goes with its primary context; execs of other contexts on the
    // device keep their needs and map again at their next launch.
    Device& device = s.devices[ctx->device];
    for (CUgraphExec_st* exec : s.graph_execs) Unmap(s, exec, ctx->device);
    Uncharge(s, ctx->device, device.graph_reserved);
    device.graph_reserved = 0;
  }
}

}  // namespace vramscope::fake

using vramscope::fake::Call;
using vramscope::fake::State;
namespace fake = vramscope::fake;

VRAMSCOPE_FAKE_EXPORT CUresult cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  Call call("cuGraphCreate");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  if (phGraph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto* g = new CUgraph_st;
  call.state().graphs.insert(g);
  *phGraph = g;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) {
  Call call("cuGraphDestroy");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  auto it = s.graphs.find(hGraph);
  if (it == s.graphs.end()) return CUDA_ERROR_INVALID_VALUE;
  delete *it;
  s.graphs.erase(it);
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                                      const CUgraphNode* /*dependencies*/,
                                                      size_t /*numDependencies*/,
                                                      CUDA_MEM_ALLOC_NODE_PARAMS* nodeParams) {
  Call call("cuGraphAddMemAllocNode");
  if (nodeParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return fake::AddMemAllocNode(call, phGraphNode, hGraph, nodeParams->poolProps,
                               nodeParams->bytesize, &nodeParams->dptr);
}

VRAMSCOPE_FAKE_EXPORT CUresult vramscope_fake_cuGraphAddNode_v12020(
    CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* /*dependencies*/,
    size_t /*numDependencies*/, CUgraphNodeParams* nodeParams) {
  Call call("cuGraphAddNode");
  return fake::AddNode(call, phGraphNode, hGraph, nodeParams);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuGraphAddNode_v2(CUgraphNode* phGraphNode, CUgraph hGraph,
                                                 const CUgraphNode* /*dependencies*/,
                                                 const CUgraphEdgeData* /*dependencyData*/,
                                                 size_t /*numDependencies*/,
                                                 CUgraphNodeParams* nodeParams) {
  Call call("cuGraphAddNode_v2");
  return fake::AddNode(call, phGraphNode, hGraph, nodeParams);
}

VRAMSCOPE_FAKE_EXPORT CUresult vramscope_fake_cuGraphInstantiate_v10000(CUgraphExec* phGraphExec,
                                                                        CUgraph hGraph,
                                                                        CUgraphNode* phErrorNode,
                                                                        char* logBuffer,
                                                                        size_t bufferSize) {
  Call call("cuGraphInstantiate");
  if (phErrorNode != nullptr) *phErrorNode = nullptr;
  if (logBuffer != nullptr && bufferSize > 0) logBuffer[0] = '\0';
  return fake::Instantiate(call, phGraphExec, hGraph);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                     CUgraphNode* phErrorNode, char* logBuffer,
                                                     size_t bufferSize) {
  Call call("cuGraphInstantiate_v2");
  if (phErrorNode != nullptr) *phErrorNode = nullptr;
  if (logBuffer != nullptr && bufferSize > 0) logBuffer[0] = '\0';
  return fake::Instantiate(call, phGraphExec, hGraph);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                           unsigned long long /*flags*/) {
  Call call("cuGraphInstantiateWithFlags");
  return fake::Instantiate(call, phGraphExec, hGraph);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuGraphInstantiateWithParams(
    CUgraphExec* phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams) {
  Call call("cuGraphInstantiateWithParams");
  return fake::InstantiateWithParams(call, phGraphExec, hGraph, instantiateParams);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(
    CUgraphExec* phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams) {
  Call call("cuGraphInstantiateWithParams_ptsz");
  return fake::InstantiateWithParams(call, phGraphExec, hGraph, instantiateParams);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream) {
  Call call("cuGraphUpload");
  return fake::MapForLaunch(call, hGraphExec, hStream, false);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  Call call("cuGraphUpload_ptsz");
  return fake::MapForLaunch(call, hGraphExec, hStream, true);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  Call call("cuGraphLaunch");
  return fake::MapForLaunch(call, hGraphExec, hStream, false);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  Call call("cuGraphLaunch_ptsz");
  return fake::MapForLaunch(call, hGraphExec, hStream, true);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  Call call("cuGraphExecDestroy");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (s.graph_execs.count(hGraphExec) == 0) return CUDA_ERROR_INVALID_VALUE;
  fake::DestroyExec(s, hGraphExec);
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device) {
  Call call("cuDeviceGraphMemTrim");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (!fake::ValidDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
  for (CUgraphExec_st* exec : s.graph_execs) fake::Unmap(s, exec, device);
  fake::Device& d = s.devices[device];
  fake::Uncharge(s, device, d.graph_reserved - d.graph_used);
  d.graph_reserved = d.graph_used;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice device,
                                                            CUgraphMem_attribute attr,
                                                            void* value) {
  Call call("cuDeviceGetGraphMemAttribute");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (!fake::ValidDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const fake::Device& d = s.devices[device];
  cuuint64_t* out = static_cast<cuuint64_t*>(value);
  switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
      *out = d.graph_used;
      return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
      *out = d.graph_used_high;
      return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
      *out = d.graph_reserved;
      return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
      *out = d.graph_reserved_high;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// Only the high-water marks can be set, and only to 0 (which resets them to the current value).
VRAMSCOPE_FAKE_EXPORT CUresult cuDeviceSetGraphMemAttribute(CUdevice device,
                                                            CUgraphMem_attribute attr,
                                                            void* value) {
  Call call("cuDeviceSetGraphMemAttribute");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (!fake::ValidDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
  if (value == nullptr || *static_cast<cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
  fake::Device& d = s.devices[device];
  switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
      d.graph_used_high = d.graph_used;
      return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
      d.graph_reserved_high = d.graph_reserved;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

VRAMSCOPE_FAKE_EXPORT size_t vramscope_fake_graph_reserved_bytes(int device) {
  State& s = fake::GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  if (device < 0 || device >= fake::kMaxDevices) return static_cast<size_t>(-1);
  return s.devices[device].graph_reserved;
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_live_graph_execs(void) {
  State& s = fake::GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  return static_cast<int>(s.graph_execs.size());
}
