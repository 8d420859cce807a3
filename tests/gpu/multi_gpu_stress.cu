// multi_gpu_stress: allocation, peer copies and cross-device frees on two GPUs at once.
//
// THREADS host threads per device (devices 0 and 1), each looping: make its device current,
// allocate a source block of varied size there and a destination block on the OTHER device, fill
// the source with a kernel (a pattern per thread and iteration), copy it to the other device with
// cudaMemcpyPeerAsync, then verify every word of the copy on the device: a kernel on the device
// that holds it, and (when the devices can reach each other) a kernel on the thread's own device
// reading it through peer access. Mismatches are counted into managed counters; every word is
// checked again on the host for a sample of iterations. Frees are issued both from the owning
// device and from the other one (cudaSetDevice(other) then cudaFree(pointer of this device)),
// some blocks are kept for a few iterations before being freed, and cudaMemGetInfo is asked of
// both devices now and then: all must succeed.
//
// Usage: multi_gpu_stress [THREADS_PER_DEVICE] [ITERATIONS]
// Prints "multi_gpu_stress: devices=2 threads=N iterations=M mismatches=0 free_failures=0" on
// stdout (N: threads in all, M: iterations per thread) and the elapsed time on stderr; exits 0
// only when nothing mismatched and every free and memory query succeeded, 1 otherwise, 2 on an
// unexpected CUDA error (or fewer than two devices).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
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

namespace {

constexpr int kDevices = 2;

__host__ __device__ inline std::uint32_t Expected(std::uint32_t pattern, std::size_t i) {
  return pattern ^ (static_cast<std::uint32_t>(i) * 2654435761u) ^ static_cast<std::uint32_t>(i);
}

__global__ void Fill(std::uint32_t* data, std::size_t n, std::uint32_t pattern) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    data[i] = Expected(pattern, i);
  }
}

// Counts the words of data that do not hold the pattern; data may live on another device.
__global__ void Verify(const std::uint32_t* data, std::size_t n, std::uint32_t pattern,
                       unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    if (data[i] != Expected(pattern, i)) ++bad;
  }
  if (bad) atomicAdd_system(mismatches, bad);
}

bool MemInfoOk(int device) {
  if (cudaSetDevice(device) != cudaSuccess) return false;
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return total_bytes > 0 && free_bytes <= total_bytes;
}

}  // namespace

int main(int argc, char** argv) {
  const int per_device = argc > 1 ? std::atoi(argv[1]) : 4;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 200;
  int device_count = 0;
  CHECK(cudaGetDeviceCount(&device_count));
  if (device_count < kDevices || per_device < 1 || iterations < 1) {
    std::fprintf(stderr,
                 "multi_gpu_stress: needs %d devices (found %d), THREADS >= 1, ITERATIONS >= 1\n",
                 kDevices, device_count);
    return 2;
  }
  // One managed counter per device, each in its own allocation, read by the host only at the end.
  unsigned long long* mismatch_counter[kDevices];
  bool peer[kDevices] = {false, false};
  for (int d = 0; d < kDevices; ++d) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaFree(nullptr));
    CHECK(cudaMallocManaged(&mismatch_counter[d], sizeof(unsigned long long)));
    *mismatch_counter[d] = 0;
    int can = 0;
    CHECK(cudaDeviceCanAccessPeer(&can, d, 1 - d));
    peer[d] = can != 0;
  }
  std::atomic<int> meminfo_failures{0};
  for (int d = 0; d < kDevices; ++d) {
    if (!MemInfoOk(d)) meminfo_failures.fetch_add(1);
  }

  std::atomic<unsigned long long> host_mismatches{0};
  std::atomic<int> free_failures{0};
  std::atomic<int> peer_failures{0};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int d = 0; d < kDevices; ++d) {
    for (int t = 0; t < per_device; ++t) {
      threads.emplace_back([&, d, t] {
        const int other = 1 - d;
        const int id = d * per_device + t;
        // Frees a block with `current` as the current device; counts a failure.
        auto free_from = [&](void* block, int current) {
          CHECK(cudaSetDevice(current));
          if (cudaFree(block) != cudaSuccess) {
            (void)cudaGetLastError();
            free_failures.fetch_add(1);
          }
        };
        CHECK(cudaSetDevice(d));
        if (peer[d]) {
          const cudaError_t err = cudaDeviceEnablePeerAccess(other, 0);
          if (err == cudaErrorPeerAccessAlreadyEnabled) {
            (void)cudaGetLastError();
          } else if (err != cudaSuccess) {
            std::fprintf(stderr, "cudaDeviceEnablePeerAccess(%d) on %d: %s\n", other, d,
                         cudaGetErrorString(err));
            (void)cudaGetLastError();
            peer_failures.fetch_add(1);
          }
        }
        cudaStream_t own;
        CHECK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
        CHECK(cudaSetDevice(other));
        cudaStream_t remote;
        CHECK(cudaStreamCreateWithFlags(&remote, cudaStreamNonBlocking));
        // Destination blocks (on `other`) kept for a few iterations before being freed.
        std::deque<std::uint32_t*> kept;
        std::uint32_t state = 12345u + 977u * static_cast<std::uint32_t>(id);
        for (int it = 0; it < iterations; ++it) {
          state = state * 1664525u + 1013904223u;
          // 1 word to 4 MiB, sizes spread over powers of two and odd in the low bits.
          const unsigned shift = 5 + (state >> 28);
          const std::size_t n = 1 + ((state * 2246822519u) >> 8) % (std::size_t{1} << shift);
          const std::size_t bytes = n * sizeof(std::uint32_t);
          const std::uint32_t pattern = (static_cast<std::uint32_t>(id) << 24) ^
                                        (static_cast<std::uint32_t>(it) * 0x9E3779B9u);
          const unsigned grid = static_cast<unsigned>(n < 256 * 64 ? (n + 255) / 256 : 64);

          CHECK(cudaSetDevice(d));
          std::uint32_t* src;
          CHECK(cudaMalloc(&src, bytes));
          CHECK(cudaSetDevice(other));
          std::uint32_t* dst;
          CHECK(cudaMalloc(&dst, bytes));
          CHECK(cudaSetDevice(d));
          Fill<<<grid, 256, 0, own>>>(src, n, pattern);
          CHECK(cudaGetLastError());
          CHECK(cudaMemcpyPeerAsync(dst, other, src, d, bytes, own));
          if (peer[d]) {
            // Read the copy on the other device through peer access.
            Verify<<<grid, 256, 0, own>>>(dst, n, pattern, mismatch_counter[d]);
            CHECK(cudaGetLastError());
          }
          CHECK(cudaStreamSynchronize(own));

          CHECK(cudaSetDevice(other));
          Verify<<<grid, 256, 0, remote>>>(dst, n, pattern, mismatch_counter[other]);
          CHECK(cudaGetLastError());
          if (it % 20 == 0) {
            std::vector<std::uint32_t> host(n);
            CHECK(cudaMemcpyAsync(host.data(), dst, bytes, cudaMemcpyDeviceToHost, remote));
            CHECK(cudaStreamSynchronize(remote));
            unsigned long long bad = 0;
            for (std::size_t i = 0; i < n; ++i) {
              if (host[i] != Expected(pattern, i)) ++bad;
            }
            host_mismatches.fetch_add(bad);
          }
          CHECK(cudaStreamSynchronize(remote));

          // The source block (of device d) is freed while the OTHER device is current.
          free_from(src, other);
          // Destination blocks (of `other`): kept up to 3 iterations, then freed alternately from
          // their own device and from device d.
          kept.push_back(dst);
          if (kept.size() > static_cast<std::size_t>(it % 4)) {
            free_from(kept.front(), it % 2 == 0 ? d : other);
            kept.pop_front();
          }
          if (it % 50 == 25 && (!MemInfoOk(d) || !MemInfoOk(other))) meminfo_failures.fetch_add(1);
        }
        while (!kept.empty()) {
          free_from(kept.front(), d);
          kept.pop_front();
        }
        CHECK(cudaSetDevice(other));
        CHECK(cudaStreamDestroy(remote));
        CHECK(cudaSetDevice(d));
        CHECK(cudaStreamDestroy(own));
      });
    }
  }
  for (auto& thread : threads) thread.join();
  for (int d = 0; d < kDevices; ++d) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaDeviceSynchronize());
    if (!MemInfoOk(d)) meminfo_failures.fetch_add(1);
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const unsigned long long mismatches =
      *mismatch_counter[0] + *mismatch_counter[1] + host_mismatches.load();
  for (int d = 0; d < kDevices; ++d) CHECK(cudaFree(mismatch_counter[d]));
  std::printf(
      "multi_gpu_stress: devices=%d threads=%d iterations=%d mismatches=%llu free_failures=%d\n",
      kDevices, kDevices * per_device, iterations, mismatches, free_failures.load());
  std::fprintf(
      stderr,
      "multi_gpu_stress: peer access %s/%s, meminfo_failures=%d peer_failures=%d, %.1f ms\n",
      peer[0] ? "0->1" : "none", peer[1] ? "1->0" : "none", meminfo_failures.load(),
      peer_failures.load(), ms);
  return mismatches == 0 && free_failures.load() == 0 && meminfo_failures.load() == 0 &&
                 peer_failures.load() == 0
             ? 0
             : 1;
}
