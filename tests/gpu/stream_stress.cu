// stream_stress: proves that a pool never hands out a block that queued work can still touch.
//
// Several non-blocking streams, each in its own host thread, loop: allocate a block, launch a
// kernel that fills it with the stream's pattern, spins for a while, then verifies that the
// whole block still holds its pattern; free the block right after the launch, while the kernel
// is still running (cudaFree must act as a device-wide fence: the block may only be reused once
// the kernel is done). Any reuse race shows up as a kernel finding another stream's pattern in
// its block. Every byte is checked again on the host for a sample of iterations.
//
// Usage: stream_stress [STREAMS] [ITERATIONS]
// Prints "stream_stress: ... races=0" and exits 0 when no race was seen, 1 otherwise.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#define CHECK(call)                                                      \
  do {                                                                   \
    cudaError_t err_ = (call);                                           \
    if (err_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(err_));                            \
      std::exit(2);                                                      \
    }                                                                    \
  } while (0)

__global__ void FillSpinVerify(std::uint32_t* data, std::size_t n, std::uint32_t pattern,
                               long long spin_cycles, unsigned long long* bad_words) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    data[i] = pattern ^ static_cast<std::uint32_t>(i);
  }
  const long long start = clock64();
  while (clock64() - start < spin_cycles) {
  }
  unsigned long long bad = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    if (data[i] != (pattern ^ static_cast<std::uint32_t>(i))) ++bad;
  }
  if (bad) atomicAdd(bad_words, bad);
}

int main(int argc, char** argv) {
  const int streams = argc > 1 ? std::atoi(argv[1]) : 8;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 400;
  CHECK(cudaFree(nullptr));
  unsigned long long* bad_words;
  CHECK(cudaMallocManaged(&bad_words, sizeof(unsigned long long)));
  *bad_words = 0;
  std::atomic<unsigned long long> host_bad{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int s = 0; s < streams; ++s) {
    threads.emplace_back([&, s] {
      cudaStream_t stream;
      CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      std::uint32_t state = 777u + s;
      for (int it = 0; it < iterations; ++it) {
        state = state * 1664525u + 1013904223u;
        // Sizes that collide across streams, so freed blocks are candidates for reuse.
        const std::size_t n = std::size_t{1} << (14 + (state >> 29));
        const std::uint32_t pattern = (static_cast<std::uint32_t>(s) << 24) ^ (it * 2654435761u);
        std::uint32_t* block;
        CHECK(cudaMalloc(&block, n * sizeof(std::uint32_t)));
        FillSpinVerify<<<32, 256, 0, stream>>>(block, n, pattern, 20000, bad_words);
        CHECK(cudaGetLastError());
        if (it % 50 == 0) {
          // Host-side check of every byte of this block once its kernel is done.
          std::vector<std::uint32_t> host(n);
          CHECK(cudaMemcpyAsync(host.data(), block, n * sizeof(std::uint32_t),
                                cudaMemcpyDeviceToHost, stream));
          CHECK(cudaStreamSynchronize(stream));
          for (std::size_t i = 0; i < n; ++i) {
            if (host[i] != (pattern ^ static_cast<std::uint32_t>(i))) host_bad.fetch_add(1);
          }
        }
        // Free while the kernel may still be running.
        if (cudaFree(block) != cudaSuccess) failures.fetch_add(1);
      }
      CHECK(cudaStreamSynchronize(stream));
      CHECK(cudaStreamDestroy(stream));
    });
  }
  for (auto& t : threads) t.join();
  CHECK(cudaDeviceSynchronize());
  const unsigned long long races = *bad_words + host_bad.load();
  std::printf("stream_stress: streams=%d iterations=%d races=%llu free_failures=%d\n", streams,
              iterations, races, failures.load());
  return races == 0 && failures.load() == 0 ? 0 : 1;
}
