// stream_stress: proves that a pool never hands out a block that queued work can still touch.
//
// Several non-blocking streams, each in its own host thread, loop: allocate a block, launch a
// kernel that fills it with the stream's pattern, spins for a while, then verifies that the
// whole block still holds its pattern; free the block right after the launch, while the kernel
// is still running (cudaFree must act as a device-wide fence: the block may only be reused once
// the kernel is done). Any reuse race shows up as a kernel finding another stream's pattern in
// its block. Every byte is checked again on the host for a sample of iterations.
//
// With --legacy the threads all launch on the legacy default stream and create no stream: the
// shim's ordered reuse (interposer/shim/ordered.h) hands a freed block out again at once, which
// the legacy stream's order makes safe. Then the main thread launches a long kernel on a block,
// frees it, creates a non-blocking stream (ordered reuse ends there) and fills a block of the
// same size on the new stream at once: the shim must make that work wait for the old kernel.
// "end_reused" counts the blocks that came back while their old kernel still ran.
//
// With --busy (free while busy): each thread alternates between two non-blocking streams of its
// own, kernels spin ~10x longer, and no thread ever waits for its stream inside the loop, so the
// host runs far ahead of the GPU while every block is freed under a running kernel: the case
// where a fence that waits for the whole device (or for a batch) lets freed memory pile up.
// The shim's summary then says how much it held (peak_reserved against peak_requested).
//
// Usage: stream_stress [--legacy | --busy] [STREAMS] [ITERATIONS]
// Prints "stream_stress: ... races=0" and exits 0 when no race was seen, 1 otherwise.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
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

// The end of ordered reuse, several times over: a long kernel on the legacy stream checks its
// block; the block is freed at once; a new non-blocking stream fills a block of the same size.
// Returns the number of blocks handed out again while their old kernel was still running.
int OrderedEnd(int rounds, unsigned long long* bad_words) {
  constexpr std::size_t kWords = std::size_t{1} << 20;
  int reused = 0;
  std::vector<cudaStream_t> streams(rounds);
  for (int r = 0; r < rounds; ++r) {
    std::uint32_t* old_block;
    CHECK(cudaMalloc(&old_block, kWords * sizeof(std::uint32_t)));
    // ~2 ms of spinning between the fill and the check.
    FillSpinVerify<<<32, 256>>>(old_block, kWords, 0xA5000000u + r, 4000000, bad_words);
    CHECK(cudaGetLastError());
    CHECK(cudaFree(old_block));
    CHECK(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
    std::uint32_t* new_block;
    CHECK(cudaMalloc(&new_block, kWords * sizeof(std::uint32_t)));
    if (new_block == old_block && cudaStreamQuery(nullptr) == cudaErrorNotReady) ++reused;
    FillSpinVerify<<<32, 256, 0, streams[r]>>>(new_block, kWords, 0x5A000000u + r, 1000, bad_words);
    CHECK(cudaGetLastError());
    CHECK(cudaFree(new_block));
  }
  CHECK(cudaDeviceSynchronize());
  for (cudaStream_t s : streams) CHECK(cudaStreamDestroy(s));
  return reused;
}

int main(int argc, char** argv) {
  const bool legacy = argc > 1 && std::string(argv[1]) == "--legacy";
  const bool busy = argc > 1 && std::string(argv[1]) == "--busy";
  if (legacy || busy) {
    --argc;
    ++argv;
  }
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
      cudaStream_t own[2] = {nullptr, nullptr};  // --legacy: the legacy default stream
      if (!legacy) CHECK(cudaStreamCreateWithFlags(&own[0], cudaStreamNonBlocking));
      if (busy) CHECK(cudaStreamCreateWithFlags(&own[1], cudaStreamNonBlocking));
      const long long spin = busy ? 200000 : 20000;
      std::uint32_t state = 777u + s;
      for (int it = 0; it < iterations; ++it) {
        cudaStream_t stream = busy ? own[it & 1] : own[0];
        state = state * 1664525u + 1013904223u;
        // Sizes that collide across streams, so freed blocks are candidates for reuse.
        const std::size_t n = std::size_t{1} << (14 + (state >> 29));
        const std::uint32_t pattern = (static_cast<std::uint32_t>(s) << 24) ^ (it * 2654435761u);
        std::uint32_t* block;
        CHECK(cudaMalloc(&block, n * sizeof(std::uint32_t)));
        FillSpinVerify<<<32, 256, 0, stream>>>(block, n, pattern, spin, bad_words);
        CHECK(cudaGetLastError());
        if (!busy && it % 50 == 0) {
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
      for (cudaStream_t stream : own) {
        if (stream == nullptr) continue;
        CHECK(cudaStreamSynchronize(stream));
        CHECK(cudaStreamDestroy(stream));
      }
      if (legacy) CHECK(cudaStreamSynchronize(nullptr));
    });
  }
  for (auto& t : threads) t.join();
  const int end_reused = legacy ? OrderedEnd(20, bad_words) : 0;
  CHECK(cudaDeviceSynchronize());
  const unsigned long long races = *bad_words + host_bad.load();
  std::printf("stream_stress: %s=%d iterations=%d races=%llu free_failures=%d end_reused=%d\n",
              legacy ? "legacy_threads" : (busy ? "busy_threads" : "streams"), streams, iterations,
              races, failures.load(), end_reused);
  return races == 0 && failures.load() == 0 ? 0 : 1;
}
