// The shim's runtime-level cudaMalloc / cudaFree (interposer/shim/hooks_runtime.cc) over the
// fake driver and two fake shared runtimes (tests/fakes/fake_cudart.cc): this program is linked
// against libcudart.so.13, libuses_cudart12.so against libcudart.so.12 (whose calls must never
// reach the shim's runtime-level exports). Each runtime counts the
// calls that reach it, so the tests see which calls the shim served from its pool and where it
// forwarded the rest. Runs once per VRAMSCOPE_MODE.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "fake_cuda_control.h"

extern "C" {
unsigned long long vramscope_fake_cudart13_calls(const char* name);
unsigned long long vs_rt12_calls(const char* name);
int vs_rt12_malloc(void** p, size_t size);
int vs_rt12_free(void* p);
}

namespace {

constexpr size_t kMiB = size_t{1} << 20;

std::string ModeName() {
  const char* mode = getenv("VRAMSCOPE_MODE");
  return mode == nullptr || mode[0] == '\0' ? "pool" : mode;
}
bool Pooled() {
  const char* hooks = getenv("VRAMSCOPE_RUNTIME_HOOKS");
  return ModeName() != "passthrough" && (hooks == nullptr || strcmp(hooks, "0") != 0);
}

unsigned long long Rt13(const char* name) { return vramscope_fake_cudart13_calls(name); }
unsigned long long Rt12(const char* name) { return vs_rt12_calls(name); }

class RuntimeHooksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(getenv("LD_PRELOAD"), nullptr) << "run with LD_PRELOAD=libvramscope.so";
    // The runtime's first call initialises it (and makes device 0's primary context current):
    // always the real runtime's.
    void* p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, kMiB), cudaSuccess);
    ASSERT_EQ(cudaFree(p), cudaSuccess);
    ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);  // every fence complete
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  }
};

// A block the pool holds is handed out and taken back without the runtime.
TEST_F(RuntimeHooksTest, CachedBlocksSkipTheRuntime) {
  const unsigned long long mallocs = Rt13("cudaMalloc");
  const unsigned long long frees = Rt13("cudaFree");
  for (int i = 0; i < 50; ++i) {
    void* p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, kMiB), cudaSuccess);
    ASSERT_NE(p, nullptr);
    memset(p, i, kMiB);                           // fake device memory is host memory
    ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);  // the program waits for its work
    ASSERT_EQ(cudaFree(p), CUDA_SUCCESS);
  }
  if (Pooled()) {
    // The loop's first allocation may find its block still waiting for the fence of SetUp's
    // free; every later one finds it complete (the program synchronised).
    EXPECT_LE(Rt13("cudaMalloc") - mallocs, 1u);
    EXPECT_EQ(Rt13("cudaFree") - frees, 0u);
  } else {
    EXPECT_EQ(Rt13("cudaMalloc") - mallocs, 50u);
    EXPECT_EQ(Rt13("cudaFree") - frees, 50u);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// What the pool does not serve goes to the runtime, with the runtime's answer and last error.
TEST_F(RuntimeHooksTest, EverythingElseIsTheRuntimesAnswer) {
  unsigned long long mallocs = Rt13("cudaMalloc");
  EXPECT_EQ(cudaMalloc(nullptr, kMiB), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  void* p = &p;
  EXPECT_EQ(cudaMalloc(&p, 0), cudaSuccess);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(Rt13("cudaMalloc") - mallocs, 2u);
  // Larger than the device: the driver's out-of-memory, as the runtime reports it.
  mallocs = Rt13("cudaMalloc");
  EXPECT_EQ(cudaMalloc(&p, size_t{4} << 30), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(Rt13("cudaMalloc") - mallocs, 1u);
  // A size the pool has never held: growth goes through the runtime and cuMemAlloc_v2's hook.
  mallocs = Rt13("cudaMalloc");
  void* big = nullptr;
  ASSERT_EQ(cudaMalloc(&big, 96 * kMiB), cudaSuccess);
  EXPECT_EQ(Rt13("cudaMalloc") - mallocs, 1u);
  EXPECT_EQ(cudaFree(big), cudaSuccess);

  // Bad frees: never a crash, the runtime's cudaErrorInvalidValue and its last error.
  static int not_device_memory;
  const unsigned long long frees = Rt13("cudaFree");
  EXPECT_EQ(cudaFree(&not_device_memory), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  void* a = nullptr;
  void* keep = nullptr;
  ASSERT_EQ(cudaMalloc(&a, kMiB), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&keep, kMiB), cudaSuccess);  // keeps the pool's memory alive
  EXPECT_EQ(cudaFree(static_cast<char*>(a) + 256), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(a), cudaSuccess);
  EXPECT_EQ(cudaFree(a), cudaErrorInvalidValue);  // double free
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(keep), cudaSuccess);
  EXPECT_EQ(cudaFree(nullptr), cudaSuccess);  // the runtime's initialisation idiom
  // The three bad frees and the null free reached the runtime (and the two good ones too
  // without the pool).
  EXPECT_EQ(Rt13("cudaFree") - frees, Pooled() ? 4u : 6u);
}

// Two runtimes in one process: the shim's exports carry the version libcudart.so.13, so a
// library built against libcudart.so.12 keeps calling its own runtime (which reaches the
// shim's driver-level hooks), and nothing of it lands in libcudart.so.13.
TEST_F(RuntimeHooksTest, AnotherRuntimeKeepsItsCalls) {
  const unsigned long long m12 = Rt12("cudaMalloc");
  const unsigned long long f12 = Rt12("cudaFree");
  const unsigned long long m13 = Rt13("cudaMalloc");
  const unsigned long long f13 = Rt13("cudaFree");
  void* p = nullptr;
  EXPECT_EQ(vs_rt12_malloc(&p, 0), cudaSuccess);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(vs_rt12_malloc(&p, 40 * kMiB), cudaSuccess);
    ASSERT_NE(p, nullptr);
    memset(p, 7, 40 * kMiB);
    ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT_EQ(vs_rt12_free(p), cudaSuccess);
  }
  EXPECT_EQ(vs_rt12_free(nullptr), cudaSuccess);
  EXPECT_EQ(Rt12("cudaMalloc") - m12, 4u);
  EXPECT_EQ(Rt12("cudaFree") - f12, 4u);
  EXPECT_EQ(Rt13("cudaMalloc"), m13);
  EXPECT_EQ(Rt13("cudaFree"), f13);
  // A block from one runtime freed through the other: both reach the same driver and pool.
  ASSERT_EQ(cudaMalloc(&p, 3 * kMiB), cudaSuccess);
  EXPECT_EQ(vs_rt12_free(p), cudaSuccess);
  ASSERT_EQ(vs_rt12_malloc(&p, 3 * kMiB), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

// While a capture is live, the driver decides: a prohibited cudaMalloc is refused and the capture
// invalidated, exactly as without the shim.
TEST_F(RuntimeHooksTest, ProhibitedAllocationDuringCaptureIsTheDriversError) {
  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, kMiB), cudaErrorStreamCaptureUnsupported);
  CUgraph graph = nullptr;
  EXPECT_EQ(cuStreamEndCapture(stream, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(cuStreamDestroy_v2(stream), CUDA_SUCCESS);
  (void)cudaGetLastError();
}

// Threads allocating and freeing through the runtime hooks at once: every block is theirs alone
// while live (each thread writes and checks its pattern).
TEST_F(RuntimeHooksTest, ManyThreads) {
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      (void)cuCtxSetCurrent(ctx);
      for (int i = 0; i < 300; ++i) {
        const size_t size = (static_cast<size_t>(i % 5) + 1) * 64 * 1024;
        void* p = nullptr;
        if (cudaMalloc(&p, size) != cudaSuccess) {
          ++bad[t];
          continue;
        }
        const auto pattern = static_cast<unsigned char>(t * 64 + i % 64);
        memset(p, pattern, size);
        if (i % 17 == 0) (void)cuCtxSynchronize();
        const auto* bytes = static_cast<const unsigned char*>(p);
        for (size_t k = 0; k < size; k += 4096) {
          if (bytes[k] != pattern) ++bad[t];
        }
        if (cudaFree(p) != cudaSuccess) ++bad[t];
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
}

// A forked child has no usable CUDA: its cudaMalloc gets the runtime's (here the fake driver's)
// error, not a block of the parent's pool.
TEST_F(RuntimeHooksTest, ForkChildGetsTheRuntimesAnswer) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, kMiB), cudaSuccess);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  const unsigned long long mallocs = Rt13("cudaMalloc");
  const pid_t pid = fork();
  ASSERT_NE(pid, -1);
  if (pid == 0) {
    void* q = nullptr;
    const cudaError_t e = cudaMalloc(&q, kMiB);
    // The call reached the child's runtime, and the parent's cached block was not handed out.
    _exit(Rt13("cudaMalloc") == mallocs + 1 && (e != cudaSuccess || q != p) ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
