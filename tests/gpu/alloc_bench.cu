// alloc_bench: cost of one cudaMalloc + cudaFree pair of a size the program uses over and over
// (the pool's hot path once it is warm), of the same pair made with the driver's cuMemAlloc_v2 +
// cuMemFree_v2 (fetched with cudaGetDriverEntryPointByVersion, as libraries do: without the
// runtime's own per-call work, so under the shim it is the hook and the pool alone), and of
// cudaMallocAsync + cudaFreeAsync for reference.
//
// Usage: alloc_bench [PAIRS] [BYTES] [REPS]
// Each figure is measured REPS times (default 7) over PAIRS pairs. Prints "alloc_bench: ...
// malloc_free_ns=... driver_pair_ns=... malloc_async_ns=..." (nanoseconds per pair, the best of
// the REPS runs) and the same figures' medians (..._median_ns).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>

using MemAllocFn = CUresult (*)(CUdeviceptr*, size_t);
using MemFreeFn = CUresult (*)(CUdeviceptr);

// The driver pair: warm-up as below, then PAIRS timed pairs; -1 if the entry points are missing.
static double DriverNsPerPair(int pairs, size_t bytes) {
  void* alloc = nullptr;
  void* release = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuMemAlloc", &alloc, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess ||
      cudaGetDriverEntryPointByVersion("cuMemFree", &release, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    return -1;
  }
  const auto mem_alloc = reinterpret_cast<MemAllocFn>(alloc);
  const auto mem_free = reinterpret_cast<MemFreeFn>(release);
  CUdeviceptr p = 0;
  for (int i = 0; i < 16; ++i) {
    mem_alloc(&p, bytes);
    mem_free(p);
  }
  cudaDeviceSynchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < pairs; ++i) {
    if (mem_alloc(&p, bytes) != CUDA_SUCCESS || mem_free(p) != CUDA_SUCCESS) return -1;
  }
  const auto end = std::chrono::steady_clock::now();
  cudaDeviceSynchronize();
  return std::chrono::duration<double, std::nano>(end - start).count() / pairs;
}

static double NsPerPair(int pairs, size_t bytes, bool async) {
  void* p = nullptr;
  // Warm-up: the first pair creates whatever the allocator caches.
  for (int i = 0; i < 16; ++i) {
    if (async) {
      cudaMallocAsync(&p, bytes, 0);
      cudaFreeAsync(p, 0);
    } else {
      cudaMalloc(&p, bytes);
      cudaFree(p);
    }
  }
  cudaDeviceSynchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < pairs; ++i) {
    if (async) {
      cudaMallocAsync(&p, bytes, 0);
      cudaFreeAsync(p, 0);
    } else {
      cudaMalloc(&p, bytes);
      cudaFree(p);
    }
  }
  const auto end = std::chrono::steady_clock::now();
  cudaDeviceSynchronize();
  return std::chrono::duration<double, std::nano>(end - start).count() / pairs;
}

// The cheapest driver call the shim's allocation path makes itself: cuCtxGetCurrent (the shim
// asks it on every cuMemAlloc_v2 to pick the context's pool). Nanoseconds per call.
static double CtxGetCurrentNs(int calls) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    return -1;
  }
  const auto get_current = reinterpret_cast<CUresult (*)(CUcontext*)>(fn);
  CUcontext ctx = nullptr;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) get_current(&ctx);
  const auto end = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(end - start).count() / calls;
}

// Best and median of `reps` measurements: the GPU machine is a VM whose timings swing by up to
// 2x between identical runs (neighbours), so one run is not a figure.
template <typename Measure>
static void Repeat(int reps, Measure&& measure, double* best, double* median) {
  std::vector<double> v;
  for (int i = 0; i < reps; ++i) v.push_back(measure());
  std::sort(v.begin(), v.end());
  *best = v.front();
  *median = v[v.size() / 2];
}

int main(int argc, char** argv) {
  const int pairs = argc > 1 ? std::atoi(argv[1]) : 200000;
  const size_t bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (1u << 20);
  const int reps = argc > 3 ? std::max(1, std::atoi(argv[3])) : 7;
  cudaFree(nullptr);
  double sync_ns, sync_med, driver_ns, driver_med, async_ns, async_med, ctx_ns, ctx_med;
  Repeat(
      reps, [&] { return NsPerPair(pairs, bytes, false); }, &sync_ns, &sync_med);
  Repeat(
      reps, [&] { return DriverNsPerPair(pairs, bytes); }, &driver_ns, &driver_med);
  Repeat(
      reps, [&] { return NsPerPair(pairs, bytes, true); }, &async_ns, &async_med);
  Repeat(
      reps, [&] { return CtxGetCurrentNs(pairs); }, &ctx_ns, &ctx_med);
  std::printf(
      "alloc_bench: bytes=%zu pairs=%d reps=%d malloc_free_ns=%.1f driver_pair_ns=%.1f "
      "malloc_async_ns=%.1f ctx_get_current_ns=%.1f malloc_free_median_ns=%.1f "
      "driver_pair_median_ns=%.1f malloc_async_median_ns=%.1f\n",
      bytes, pairs, reps, sync_ns, driver_ns, async_ns, ctx_ns, sync_med, driver_med, async_med);
  return 0;
}
