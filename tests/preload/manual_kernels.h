// What the preload tests over the fake driver's manual kernels share (stream_fence_test,
// gpu_wait_test): a fixture that checks the shim is preloaded, makes the primary context current
// and has kernels stay "running" until the test completes them (with blocking synchronisation, so
// a host wait the rule forbids hangs instead of passing), and Eventually, which yields until a
// condition holds or a generous deadline passes. Never a timing assertion: a broken rule shows as
// the caller's failed EXPECT on the false Eventually returns.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <cuda.h>

#include "fake_cuda_control.h"
#include "routes.h"

namespace vramscope::fake {

template <typename Done>
bool Eventually(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

class ManualKernelsTest : public ::testing::Test {
 protected:
  inline static const CUfunction kKernel = reinterpret_cast<CUfunction>(0x1);

  static void SetUpTestSuite() {
    std::string error;
    ASSERT_TRUE(LoadDirect(&api_, &error)) << error;
  }

  void SetUp() override {
    ASSERT_NE(ModuleOf(reinterpret_cast<void*>(api_.cuMemAlloc_v2)).find("libvramscope"),
              std::string::npos)
        << "run with LD_PRELOAD=libvramscope.so";
    ASSERT_EQ(api_.cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    vramscope_fake_set_manual_events(0);
    vramscope_fake_set_manual_kernels(1);
    vramscope_fake_set_blocking_sync(1);
  }

  // Completes all work, lets the derived fixture free what it holds (ReleaseHeld, with the
  // context still current), then releases the context.
  void TearDown() override {
    vramscope_fake_set_blocking_sync(0);
    vramscope_fake_complete_all_events();
    vramscope_fake_set_manual_kernels(0);
    ASSERT_EQ(api_.cuCtxSynchronize(), CUDA_SUCCESS);
    ReleaseHeld();
    EXPECT_EQ(api_.cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
  }
  virtual void ReleaseHeld() {}

  void Launch(CUstream stream) {
    ASSERT_EQ(api_.cuLaunchKernel(kKernel, 1, 1, 1, 1, 1, 1, 0, stream, nullptr, nullptr),
              CUDA_SUCCESS);
  }

  // One thread per stream of `streams`: `rounds` times, allocates a 4 MiB block, calls
  // `use(t, block)` under one lock shared by all threads (it launches thread t's kernel on
  // streams[t] and keeps the test's books), and frees the block; meanwhile another thread
  // completes kernels in stream order. Blocks of the one size move between threads and streams.
  template <typename Use>
  void ChurnOnOwnStreams(const std::vector<CUstream>& streams, int rounds, Use use) {
    std::mutex mu;
    std::atomic<int> running{static_cast<int>(streams.size())};
    std::vector<std::thread> threads;
    for (int t = 0; t < static_cast<int>(streams.size()); ++t) {
      threads.emplace_back([&, t] {
        EXPECT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
        for (int i = 0; i < rounds; ++i) {
          CUdeviceptr p = 0;
          ASSERT_EQ(api_.cuMemAlloc_v2(&p, std::size_t{4} << 20), CUDA_SUCCESS);
          {
            std::lock_guard<std::mutex> lock(mu);
            use(t, p);
          }
          ASSERT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
        }
        --running;
      });
    }
    std::thread completer([&] {
      while (running.load() > 0) {
        for (CUstream s : streams) (void)vramscope_fake_complete_kernels(s, 1);
        std::this_thread::yield();
      }
    });
    for (std::thread& thread : threads) thread.join();
    completer.join();
  }

  inline static DriverApi api_;
  CUcontext ctx_ = nullptr;
};

}  // namespace vramscope::fake
