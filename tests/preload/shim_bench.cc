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

}  // namespace

BENCHMARK_MAIN();
