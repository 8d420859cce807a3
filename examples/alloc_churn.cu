// alloc_churn: a legacy-style CUDA program that calls cudaMalloc/cudaFree in its inner loop,
// the pattern vramscope's pool speeds up. Every iteration allocates buffers of varying size,
// runs a kernel over them, checks the result on the host and frees them.
//
// Output: one line with a checksum that must not change under the shim, and the time taken.
// Usage: alloc_churn [ITERATIONS] (default 2000)
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#define CHECK(call)                                                             \
  do {                                                                          \
    cudaError_t err_ = (call);                                                  \
    if (err_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(err_));                                   \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

__global__ void Fill(std::uint32_t* data, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    data[i] = static_cast<std::uint32_t>(i) * 2654435761u + seed;
  }
}

__global__ void Combine(const std::uint32_t* a, const std::uint32_t* b, std::uint32_t* out,
                        std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    out[i] = a[i] ^ (b[i] >> 3);
  }
}

__global__ void Sum(const std::uint32_t* data, std::size_t n, unsigned long long* total) {
  unsigned long long local = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    local += data[i];
  }
  atomicAdd(total, local);
}

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 2000;
  if (iterations <= 0) {
    std::fprintf(stderr, "usage: alloc_churn [ITERATIONS > 0]\n");
    return 2;
  }
  CHECK(cudaFree(nullptr));  // create the context outside the timed loop

  const auto start = std::chrono::steady_clock::now();
  unsigned long long checksum = 0;
  std::uint32_t state = 12345;
  for (int it = 0; it < iterations; ++it) {
    // Sizes from 1 KiB to 16 MiB, as a dynamic-shape workload would ask.
    state = state * 1664525u + 1013904223u;
    const std::size_t n = (std::size_t{256} << (state >> 28) % 13) + (state & 0xfff);
    std::uint32_t *a, *b, *out;
    unsigned long long* total;
    CHECK(cudaMalloc(&a, n * sizeof(std::uint32_t)));
    CHECK(cudaMalloc(&b, n * sizeof(std::uint32_t)));
    CHECK(cudaMalloc(&out, n * sizeof(std::uint32_t)));
    CHECK(cudaMalloc(&total, sizeof(unsigned long long)));
    CHECK(cudaMemset(total, 0, sizeof(unsigned long long)));
    Fill<<<64, 256>>>(a, n, static_cast<std::uint32_t>(it));
    Fill<<<64, 256>>>(b, n, static_cast<std::uint32_t>(it) * 7u);
    Combine<<<64, 256>>>(a, b, out, n);
    Sum<<<64, 256>>>(out, n, total);
    CHECK(cudaGetLastError());
    unsigned long long host_total = 0;
    CHECK(cudaMemcpy(&host_total, total, sizeof(host_total), cudaMemcpyDeviceToHost));
    // Check against the host's computation on a sample of iterations.
    if (it % 97 == 0) {
      unsigned long long expect = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t va = static_cast<std::uint32_t>(i) * 2654435761u + it;
        const std::uint32_t vb = static_cast<std::uint32_t>(i) * 2654435761u + it * 7u;
        expect += va ^ (vb >> 3);
      }
      if (expect != host_total) {
        std::fprintf(stderr, "iteration %d: wrong sum %llu, expected %llu\n", it, host_total,
                     expect);
        return 1;
      }
    }
    checksum = checksum * 31 + host_total;
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(out));
    CHECK(cudaFree(total));
  }
  CHECK(cudaDeviceSynchronize());
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("alloc_churn: iterations=%d checksum=%016llx\n", iterations, checksum);
  std::fprintf(stderr, "alloc_churn: %.1f ms\n", ms);
  return 0;
}
