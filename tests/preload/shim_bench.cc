// Host-side cost of an allocation plus a free through the preloaded shim over the fake driver
// (target on the GPU machine: under 150 ns for the pair, hook included). Compare with
// VRAMSCOPE_MODE=passthrough, which measures the fake driver's own cost.
#include <benchmark/benchmark.h>

#include <cuda.h>

namespace {

bool InitOnce() {
  static const bool ok = [] {
    CUcontext ctx = nullptr;
    return cuInit(0) == CUDA_SUCCESS && cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS &&
           cuCtxSetCurrent(ctx) == CUDA_SUCCESS;
  }();
  return ok;
}

void BM_AllocFree(benchmark::State& state) {
  if (!InitOnce()) {
    state.SkipWithError("no driver");
    return;
  }
  // Threads other than the first need the context current as well.
  CUcontext ctx = nullptr;
  cuDevicePrimaryCtxRetain(&ctx, 0);
  cuCtxSetCurrent(ctx);
  const size_t size = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    CUdeviceptr p = 0;
    if (cuMemAlloc_v2(&p, size) != CUDA_SUCCESS || cuMemFree_v2(p) != CUDA_SUCCESS) {
      state.SkipWithError("allocation failed");
      break;
    }
    benchmark::DoNotOptimize(p);
  }
  cuDevicePrimaryCtxRelease_v2(0);
}
BENCHMARK(BM_AllocFree)->Arg(4096)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(BM_AllocFree)->Arg(1 << 20)->Threads(4);

// The fake driver's cuCtxGetCurrent, which every pooled allocation calls once (not hooked): take
// it from BM_AllocFree to get the shim's own cost (on the H200 the real one costs 7-8 ns).
void BM_FakeCtxGetCurrent(benchmark::State& state) {
  if (!InitOnce()) {
    state.SkipWithError("no driver");
    return;
  }
  for (auto _ : state) {
    CUcontext ctx = nullptr;
    benchmark::DoNotOptimize(cuCtxGetCurrent(&ctx));
    benchmark::DoNotOptimize(ctx);
  }
}
BENCHMARK(BM_FakeCtxGetCurrent);

// A graph launch through the shim: without any mem-alloc node in the process (Arg 0, runs
// first: the hook adds one relaxed load) and after one was made (Arg 1: the graph pool of the
// device is re-read after each launch). Without LD_PRELOAD: the fake driver alone.
void BM_GraphLaunch(benchmark::State& state) {
  if (!InitOnce()) {
    state.SkipWithError("no driver");
    return;
  }
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  CUstream stream = nullptr;
  CUgraphNode node = nullptr;
  CUDA_MEM_ALLOC_NODE_PARAMS params{};
  params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  params.bytesize = 1 << 20;
  if (cuGraphCreate(&graph, 0) != CUDA_SUCCESS ||
      (state.range(0) != 0 &&
       cuGraphAddMemAllocNode(&node, graph, nullptr, 0, &params) != CUDA_SUCCESS) ||
      cuGraphInstantiate(&exec, graph, 0) != CUDA_SUCCESS ||
      cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    state.SkipWithError("graph setup failed");
    return;
  }
  for (auto _ : state) {
    if (cuGraphLaunch(exec, stream) != CUDA_SUCCESS) {
      state.SkipWithError("launch failed");
      break;
    }
  }
  cuGraphExecDestroy(exec);
  cuGraphDestroy(graph);
  cuDeviceGraphMemTrim(0);
  cuStreamDestroy(stream);
}
BENCHMARK(BM_GraphLaunch)->Arg(0)->Arg(1);

}  // namespace

BENCHMARK_MAIN();
