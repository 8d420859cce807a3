// thrust_loop: thrust sort + reduce in a loop. thrust takes its temporary storage with cudaMalloc
// and gives it back with cudaFree on every call, so this is what an allocation-bound program looks
// like. With --cached, the same loop passes thrust a caching allocator inside the program: the
// speed limit any interposed pool can reach.
//
// Usage: thrust_loop [--cached] [ITERATIONS] [N]
// Prints a checksum line (identical in every mode) and the time per iteration on stderr.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include <cuda_runtime.h>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/reduce.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/transform.h>

// A simple caching allocator of the kind thrust's examples show: keeps freed blocks by size.
class CachingAllocator {
 public:
  using value_type = char;
  ~CachingAllocator() {
    for (auto& [size, ptr] : free_) cudaFree(ptr);
  }
  char* allocate(std::ptrdiff_t n) {
    auto it = free_.find(n);
    if (it != free_.end()) {
      char* p = it->second;
      free_.erase(it);
      return p;
    }
    char* p = nullptr;
    if (cudaMalloc(&p, n) != cudaSuccess) throw std::bad_alloc();
    return p;
  }
  void deallocate(char* p, size_t n) { free_.emplace(static_cast<std::ptrdiff_t>(n), p); }

 private:
  std::multimap<std::ptrdiff_t, char*> free_;
};

struct Scramble {
  int iteration;
  __host__ __device__ unsigned operator()(unsigned x) const {
    x ^= static_cast<unsigned>(iteration) * 0x9e3779b9u;
    x *= 0x85ebca6bu;
    return x ^ (x >> 13);
  }
};

int main(int argc, char** argv) {
  bool cached = false;
  int positional = 0;
  int iterations = 500;
  long n = 1 << 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--cached") == 0) {
      cached = true;
    } else if (positional == 0) {
      iterations = std::atoi(argv[i]);
      ++positional;
    } else {
      n = std::atol(argv[i]);
    }
  }
  cudaFree(nullptr);
  thrust::device_vector<unsigned> keys(n);
  CachingAllocator alloc;
  unsigned long long checksum = 0;
  // Warm-up outside the timed loop.
  thrust::sequence(keys.begin(), keys.end());
  thrust::sort(keys.begin(), keys.end());
  cudaDeviceSynchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int it = 0; it < iterations; ++it) {
    thrust::sequence(keys.begin(), keys.end());
    thrust::transform(keys.begin(), keys.end(), keys.begin(), Scramble{it});
    unsigned long long sum;
    unsigned first;
    if (cached) {
      thrust::sort(thrust::cuda::par(alloc), keys.begin(), keys.end());
      sum = thrust::reduce(thrust::cuda::par(alloc), keys.begin(), keys.end(), 0ull);
    } else {
      thrust::sort(keys.begin(), keys.end());
      sum = thrust::reduce(keys.begin(), keys.end(), 0ull);
    }
    first = keys[0];
    checksum = checksum * 1000003ull + sum + first;
  }
  cudaDeviceSynchronize();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("thrust_loop: iterations=%d n=%ld checksum=%016llx\n", iterations, n, checksum);
  std::fprintf(stderr, "thrust_loop: %s %.3f ms/iteration\n", cached ? "cached" : "plain",
               ms / iterations);
  return 0;
}
