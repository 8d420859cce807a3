// A CUDA program for graph_array_test: CUDA arrays and graph memory nodes over the fake driver,
// through one route to the driver, writing what the fake holds to a file as `key=value` lines.
//
//   graph_array_app ROUTE OUT [threads]   ROUTE: direct | dlsym | procaddress
//   (tests/fakes/routes.h)
//
// Arrays on device 0: a 2D float array, a 3D RGBA8 array and a 4-level mipmapped array; the 2D
// and the mipmapped ones are destroyed, the 3D one stays live. Graphs: on device 0, graph G1 with
// two mem-alloc nodes (cuGraphAddMemAllocNode 4 MiB, cuGraphAddNode_v2 1 MiB) and a captured
// graph G2 (cuMemAllocAsync 2 MiB on a capturing stream), instantiated by different ABIs,
// launched, uploaded, destroyed and trimmed; G1 instantiated again and left live; then a graph on
// device 1 (cuGraphAddNode, 8 MiB) left live. Errors must come back as the fake's own (a
// destroyed array, a destroyed exec, a bad device): exit status 10+ otherwise.
//
// Figures (device memory the fake charges, vramscope_fake_*): array_peak, array_final (device 0,
// sums over live arrays), graph_peak (largest sum of both devices' graph pools after a call),
// graph_final_dev0/1, graph_peak_dev0/1, live_peak_dev0, live_final_dev0/1 (everything charged),
// array_requested_* (each array's texel bytes from its descriptor, what the shim records as
// requested).
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <cuda.h>

#include "fake_cuda_control.h"
#include "routes.h"

namespace {

using vramscope::fake::DriverApi;

constexpr size_t kMiB = size_t{1} << 20;

struct Peaks {
  size_t array = 0;
  size_t graph = 0;
  size_t graph_dev[2] = {0, 0};
  size_t live_dev0 = 0;
  void Observe() {
    array = std::max(array, vramscope_fake_array_bytes(0));
    const size_t g0 = vramscope_fake_graph_reserved_bytes(0);
    const size_t g1 = vramscope_fake_graph_reserved_bytes(1);
    graph = std::max(graph, g0 + g1);
    graph_dev[0] = std::max(graph_dev[0], g0);
    graph_dev[1] = std::max(graph_dev[1], g1);
    live_dev0 = std::max(live_dev0, vramscope_fake_live_bytes(0));
  }
};

CUDA_MEM_ALLOC_NODE_PARAMS MemAllocParams(int device, size_t bytes) {
  CUDA_MEM_ALLOC_NODE_PARAMS params{};
  params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  params.poolProps.location.id = device;
  params.bytesize = bytes;
  return params;
}

bool Load(const std::string& route, DriverApi* api) {
  std::string error;
  bool ok = false;
  if (route == "direct") ok = vramscope::fake::LoadDirect(api, &error);
  if (route == "dlsym") ok = vramscope::fake::LoadByDlsym(api, &error);
  if (route == "procaddress") ok = vramscope::fake::LoadByProcAddress(api, &error);
  if (!ok) fprintf(stderr, "graph_array_app: route %s: %s\n", route.c_str(), error.c_str());
  return ok;
}

#define CHECK_OK(call)                                                      \
  do {                                                                      \
    const CUresult r_ = (call);                                             \
    if (r_ != CUDA_SUCCESS) {                                               \
      fprintf(stderr, "graph_array_app: %s returned %d\n", #call, (int)r_); \
      return 2;                                                             \
    }                                                                       \
    peaks.Observe();                                                        \
  } while (0)

#define CHECK_ERROR(call, expected)                                                \
  do {                                                                             \
    const CUresult r_ = (call);                                                    \
    if (r_ != (expected)) {                                                        \
      fprintf(stderr, "graph_array_app: %s returned %d, not %d\n", #call, (int)r_, \
              (int)(expected));                                                    \
      return 10;                                                                   \
    }                                                                              \
  } while (0)

}  // namespace

// `threads` mode: four threads instantiate, launch and destroy graphs of their own on device 0
// while one of them trims the pool now and then; the last figure the shim records must be the
// pool's final one.
int Threads(const DriverApi& api, CUcontext ctx, const char* out_path) {
  std::atomic<int> failures{0};
  CUgraphExec live[2] = {nullptr, nullptr};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      CUgraph graph = nullptr;
      CUgraphNode node = nullptr;
      CUDA_MEM_ALLOC_NODE_PARAMS params = MemAllocParams(0, (t + 1) * kMiB);
      if (api.cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
          api.cuGraphCreate(&graph, 0) != CUDA_SUCCESS ||
          api.cuGraphAddMemAllocNode(&node, graph, nullptr, 0, &params) != CUDA_SUCCESS) {
        ++failures;
        return;
      }
      for (int i = 0; i < 200; ++i) {
        CUgraphExec exec = nullptr;
        if (api.cuGraphInstantiateWithFlags(&exec, graph, 0) != CUDA_SUCCESS ||
            api.cuGraphLaunch(exec, nullptr) != CUDA_SUCCESS ||
            api.cuGraphExecDestroy(exec) != CUDA_SUCCESS) {
          ++failures;
        }
        if (t == 0 && i % 16 == 0 && api.cuDeviceGraphMemTrim(0) != CUDA_SUCCESS) ++failures;
      }
      // Threads 2 and 3 leave one exec live.
      if (t >= 2 && api.cuGraphInstantiateWithFlags(&live[t - 2], graph, 0) != CUDA_SUCCESS) {
        ++failures;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  // A known end: everything trimmed, then the two live execs mapped again (3 + 4 MiB).
  if (failures != 0 || api.cuDeviceGraphMemTrim(0) != CUDA_SUCCESS ||
      api.cuGraphLaunch(live[0], nullptr) != CUDA_SUCCESS ||
      api.cuGraphLaunch(live[1], nullptr) != CUDA_SUCCESS) {
    return 2;
  }
  FILE* out = fopen(out_path, "w");
  if (out == nullptr) return 3;
  fprintf(out, "graph_final_dev0=%zu\nlive_final_dev0=%zu\n",
          vramscope_fake_graph_reserved_bytes(0), vramscope_fake_live_bytes(0));
  fclose(out);
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 3 && !(argc == 4 && strcmp(argv[3], "threads") == 0)) {
    fprintf(stderr, "usage: graph_array_app direct|dlsym|procaddress OUT [threads]\n");
    return 1;
  }
  DriverApi api;
  if (!Load(argv[1], &api)) return 1;
  Peaks peaks;
  CUcontext ctx0 = nullptr;
  CUcontext ctx1 = nullptr;
  CHECK_OK(api.cuInit(0));
  CHECK_OK(api.cuDevicePrimaryCtxRetain(&ctx0, 0));
  CHECK_OK(api.cuDevicePrimaryCtxRetain(&ctx1, 1));
  CHECK_OK(api.cuCtxSetCurrent(ctx0));
  if (argc == 4) return Threads(api, ctx0, argv[2]);

  // Arrays.
  CUDA_ARRAY_DESCRIPTOR desc2{};
  desc2.Width = 1000;
  desc2.Height = 100;
  desc2.Format = CU_AD_FORMAT_FLOAT;
  desc2.NumChannels = 1;
  CUDA_ARRAY3D_DESCRIPTOR desc3{};
  desc3.Width = 64;
  desc3.Height = 32;
  desc3.Depth = 16;
  desc3.Format = CU_AD_FORMAT_UNSIGNED_INT8;
  desc3.NumChannels = 4;
  CUarray a2 = nullptr;
  CUarray a3 = nullptr;
  CUmipmappedArray mip = nullptr;
  CHECK_OK(api.cuArrayCreate_v2(&a2, &desc2));
  CHECK_OK(api.cuArray3DCreate_v2(&a3, &desc3));
  CHECK_OK(api.cuMipmappedArrayCreate(&mip, &desc3, 4));
  CHECK_OK(api.cuArrayDestroy(a2));
  CHECK_OK(api.cuMipmappedArrayDestroy(mip));
  CHECK_ERROR(api.cuArrayDestroy(a2), CUDA_ERROR_INVALID_HANDLE);
  CHECK_ERROR(api.cuMipmappedArrayDestroy(mip), CUDA_ERROR_INVALID_HANDLE);
  const size_t array_final = vramscope_fake_array_bytes(0);

  // Graphs on device 0.
  CUstream stream = nullptr;
  CHECK_OK(api.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUgraph g1 = nullptr;
  CUgraphNode node = nullptr;
  CHECK_OK(api.cuGraphCreate(&g1, 0));
  CUDA_MEM_ALLOC_NODE_PARAMS four = MemAllocParams(0, 4 * kMiB);
  CHECK_OK(api.cuGraphAddMemAllocNode(&node, g1, nullptr, 0, &four));
  CUgraphNodeParams one{};
  one.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
  one.alloc.poolProps = MemAllocParams(0, 0).poolProps;
  one.alloc.bytesize = kMiB;
  CHECK_OK(api.cuGraphAddNode_v2(&node, g1, nullptr, nullptr, 0, &one));
  CHECK_OK(api.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUdeviceptr captured = 0;
  CHECK_OK(api.cuMemAllocAsync(&captured, 2 * kMiB, stream));
  CHECK_OK(api.cuMemFreeAsync(captured, stream));
  CUgraph g2 = nullptr;
  CHECK_OK(api.cuStreamEndCapture(stream, &g2));
  CUgraphExec e1 = nullptr;
  CUgraphExec e2 = nullptr;
  CHECK_OK(api.cuGraphInstantiateWithFlags(&e1, g1, 0));
  CHECK_OK(api.cuGraphInstantiate_v10000(&e2, g2, nullptr, nullptr, 0));
  CHECK_OK(api.cuGraphLaunch(e1, stream));
  CHECK_OK(api.cuGraphLaunch_ptsz(e2, nullptr));
  CHECK_OK(api.cuGraphUpload(e1, stream));
  CHECK_OK(api.cuGraphUpload_ptsz(e2, nullptr));
  CHECK_OK(api.cuDeviceGraphMemTrim(0));  // releases, the next launch maps again
  CHECK_OK(api.cuGraphLaunch(e2, stream));
  CHECK_OK(api.cuGraphExecDestroy(e1));
  CHECK_OK(api.cuGraphExecDestroy(e2));
  CHECK_ERROR(api.cuGraphLaunch(e1, stream), CUDA_ERROR_INVALID_VALUE);
  CHECK_ERROR(api.cuDeviceGraphMemTrim(9), CUDA_ERROR_INVALID_DEVICE);
  CHECK_OK(api.cuDeviceGraphMemTrim(0));
  CHECK_OK(api.cuGraphDestroy(g2));
  CUDA_GRAPH_INSTANTIATE_PARAMS params{};
  CHECK_OK(api.cuGraphInstantiateWithParams(&e1, g1, &params));
  CHECK_OK(api.cuGraphLaunch(e1, stream));

  // A graph on device 1, left live.
  CHECK_OK(api.cuCtxSetCurrent(ctx1));
  CUgraph g3 = nullptr;
  CHECK_OK(api.cuGraphCreate(&g3, 0));
  CUgraphNodeParams eight{};
  eight.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
  eight.alloc.poolProps = MemAllocParams(1, 0).poolProps;
  eight.alloc.bytesize = 8 * kMiB;
  CHECK_OK(api.cuGraphAddNode_v12020(&node, g3, nullptr, 0, &eight));
  CUgraphExec e3 = nullptr;
  CHECK_OK(api.cuGraphInstantiate_v2(&e3, g3, nullptr, nullptr, 0));
  CHECK_OK(api.cuGraphLaunch(e3, nullptr));
  CHECK_OK(api.cuCtxSetCurrent(ctx0));

  FILE* out = fopen(argv[2], "w");
  if (out == nullptr) return 3;
  fprintf(out, "array_peak=%zu\narray_final=%zu\n", peaks.array, array_final);
  fprintf(out, "array_requested_2d=%zu\narray_requested_3d=%zu\n", size_t{1000} * 100 * 4,
          size_t{64} * 32 * 16 * 4);
  fprintf(out, "graph_peak=%zu\n", peaks.graph);
  for (int d = 0; d < 2; ++d) {
    fprintf(out, "graph_peak_dev%d=%zu\ngraph_final_dev%d=%zu\nlive_final_dev%d=%zu\n", d,
            peaks.graph_dev[d], d, vramscope_fake_graph_reserved_bytes(d), d,
            vramscope_fake_live_bytes(d));
  }
  fprintf(out, "live_peak_dev0=%zu\n", peaks.live_dev0);
  fclose(out);
  return 0;  // a3, e1 (device 0) and e3 (device 1) stay live
}
