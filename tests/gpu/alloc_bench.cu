// alloc_bench: cost of one cudaMalloc + cudaFree pair of a size the program uses over and over
// (the pool's hot path once it is warm), and of cudaMallocAsync + cudaFreeAsync for reference.
//
// Usage: alloc_bench [PAIRS] [BYTES]
// Prints "alloc_bench: malloc_free_ns=... malloc_async_ns=..." (nanoseconds per pair).
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

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

int main(int argc, char** argv) {
  const int pairs = argc > 1 ? std::atoi(argv[1]) : 200000;
  const size_t bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (1u << 20);
  cudaFree(nullptr);
  const double sync_ns = NsPerPair(pairs, bytes, false);
  const double async_ns = NsPerPair(pairs, bytes, true);
  std::printf("alloc_bench: bytes=%zu pairs=%d malloc_free_ns=%.1f malloc_async_ns=%.1f\n", bytes,
              pairs, sync_ns, async_ns);
  return 0;
}
