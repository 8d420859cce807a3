// Ordered reuse (interposer/shim/ordered.h) over the fake driver, by the route named in
// VRAMSCOPE_ORDERED_ROUTE (direct, dlsym, procaddress). Ordered reuse ends once per process, so
// meson runs every test in a process of its own (--gtest_filter).
//
// The fake runs no kernels: an event recorded with manual events on stays pending, which stands
// for a kernel still running ("work"). A block freed while such work is queued:
//  - under ordered reuse (only the legacy stream used), is handed out again at once;
//  - after it ended, waits for its fence (the next request of its size gets another block).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <string>

#include "fake_cuda_control.h"
#include "routes.h"

namespace vramscope::fake {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

std::uint64_t Syncs() { return vramscope_fake_call_count("cuCtxSynchronize"); }
std::uint64_t Waits() {
  return vramscope_fake_call_count("cuStreamWaitEvent") +
         vramscope_fake_call_count("cuStreamWaitEvent_ptsz");
}

class OrderedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* route_env = getenv("VRAMSCOPE_ORDERED_ROUTE");
    const std::string route = route_env != nullptr ? route_env : "direct";
    std::string error;
    const bool loaded = route == "dlsym"         ? LoadByDlsym(&api_, &error)
                        : route == "procaddress" ? LoadByProcAddress(&api_, &error)
                                                 : LoadDirect(&api_, &error);
    ASSERT_TRUE(loaded) << route << ": " << error;
    vramscope_fake_set_manual_events(1);
    ASSERT_EQ(api_.cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuEventCreate(&work_, 0), CUDA_SUCCESS);
  }

  void TearDown() override {
    vramscope_fake_complete_all_events();
    vramscope_fake_set_manual_events(0);
  }

  // Frees a block of `bytes` while work queued on the legacy stream still "runs", then asks for
  // the same size again: true if the same block came back.
  bool ReusedAtOnce(size_t bytes) {
    CUdeviceptr a = 0;
    CUdeviceptr b = 0;
    EXPECT_EQ(api_.cuMemAlloc_v2(&a, bytes), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuEventRecord(work_, nullptr), CUDA_SUCCESS);  // a kernel using a
    EXPECT_EQ(api_.cuMemFree_v2(a), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuMemAlloc_v2(&b, bytes), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuMemFree_v2(b), CUDA_SUCCESS);
    return a == b;
  }

  // A kernel launch on `stream` (the fake queues nothing).
  CUresult Launch(CUstream stream, bool per_thread = false) {
    auto* f = reinterpret_cast<CUfunction>(&api_);  // any non-null handle
    return per_thread ? api_.cuLaunchKernel_ptsz(f, 1, 1, 1, 32, 1, 1, 0, stream, nullptr, nullptr)
                      : api_.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, stream, nullptr, nullptr);
  }

  DriverApi api_{};
  CUcontext ctx_ = nullptr;
  CUevent work_ = nullptr;
};

// Only the legacy stream (a null handle, or CU_STREAM_LEGACY): every free is reusable at once, and
// a loop of one size (thrust's temporaries) holds one block and never synchronises.
TEST_F(OrderedTest, LegacyStreamWorkIsReusedAtOnce) {
  const std::uint64_t syncs = Syncs();
  const std::uint64_t allocs =
      vramscope_fake_call_count("cuMemCreate") + vramscope_fake_call_count("cuMemAlloc_v2");
  EXPECT_TRUE(ReusedAtOnce(4 * kMiB));
  for (int i = 0; i < 1000; ++i) {
    CUdeviceptr p = 0;
    ASSERT_EQ(api_.cuMemAlloc_v2(&p, 4351590), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuEventRecord(work_, CU_STREAM_LEGACY), CUDA_SUCCESS);
    ASSERT_EQ(Launch(i % 2 == 0 ? nullptr : CU_STREAM_LEGACY), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuMemsetD8_v2(p, 0, 64), CUDA_SUCCESS);  // synchronous: the legacy stream
    ASSERT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  }
  EXPECT_EQ(Syncs(), syncs);
  EXPECT_EQ(Waits(), 0u);
  // The pool took memory from the driver for the first blocks only.
  EXPECT_LE(vramscope_fake_call_count("cuMemCreate") + vramscope_fake_call_count("cuMemAlloc_v2") -
                allocs,
            4u);
}

// A settled block is reusable at once, but its memory goes back to the driver only once the work
// queued before its free finished. Two 64 MiB holes around a live block, then a request that
// fits neither: the pool's soft cap unmaps a hole before it maps the new block.
TEST_F(OrderedTest, SettledMemoryIsNotUnmappedUnderRunningWork) {
  const std::uint64_t unmaps = vramscope_fake_call_count("cuMemUnmap");
  for (int round = 0; round < 4; ++round) {
    CUdeviceptr a = 0;
    CUdeviceptr live = 0;
    CUdeviceptr b = 0;
    CUdeviceptr c = 0;
    ASSERT_EQ(api_.cuMemAlloc_v2(&a, 64 * kMiB), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuMemAlloc_v2(&live, 4 * kMiB), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuMemAlloc_v2(&b, 64 * kMiB), CUDA_SUCCESS);
    ASSERT_EQ(Launch(nullptr), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuEventRecord(work_, nullptr), CUDA_SUCCESS);  // a kernel using a and b
    ASSERT_EQ(api_.cuMemFree_v2(a), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuMemFree_v2(b), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuMemAlloc_v2(&c, (100 + 8 * round) * kMiB), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuMemFree_v2(c), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuMemFree_v2(live), CUDA_SUCCESS);
  }
  EXPECT_GT(vramscope_fake_call_count("cuMemUnmap"), unmaps) << "the soft cap never unmapped";
  EXPECT_EQ(vramscope_fake_unmaps_under_pending_work(), 0u);
}

// A stream that is created but given no work changes nothing. Its first work ends ordered
// reuse: the shim marks the point on the legacy stream (one event record of its own), and work
// queued elsewhere while that point has not passed first waits for it on the GPU (that first
// work included), so a block handed out again under ordered reuse is safe from the old work.
// Then frees wait for their fence.
TEST_F(OrderedTest, StreamUseEndsItAndNewWorkWaitsForTheOldWork) {
  CUstream stream = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUdeviceptr a = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&a, 4 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuEventRecord(work_, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemFree_v2(a), CUDA_SUCCESS);
  CUdeviceptr b = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&b, 4 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(b, a);  // ordered: the old work precedes anything queued on the legacy stream
  const std::uint64_t records = vramscope_fake_call_count("cuEventRecord");
  const int pending = vramscope_fake_pending_events();
  const std::uint64_t syncs = Syncs();
  const std::uint64_t waits = Waits();
  CUevent kernel_on_b = nullptr;
  ASSERT_EQ(api_.cuEventCreate(&kernel_on_b, 0), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuEventRecord(kernel_on_b, stream), CUDA_SUCCESS);  // new work, may use b
  // The end, marked (and the application's own record), then the wait before its record.
  EXPECT_EQ(vramscope_fake_call_count("cuEventRecord"), records + 2);
  EXPECT_EQ(vramscope_fake_pending_events(), pending + 2);
  EXPECT_EQ(Waits(), waits + 1) << "work on the new stream must wait for the old work";
  EXPECT_EQ(Syncs(), syncs) << "the host never blocks for it";
  ASSERT_EQ(Launch(stream), CUDA_SUCCESS);
  EXPECT_EQ(Waits(), waits + 2);
  // Work on the legacy stream follows the end in order: no wait.
  ASSERT_EQ(api_.cuEventRecord(work_, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(Launch(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(Waits(), waits + 2);
  // The old work finished: no more waits.
  ASSERT_GT(vramscope_fake_complete_all_events(), 0);
  ASSERT_EQ(api_.cuEventRecord(kernel_on_b, stream), CUDA_SUCCESS);
  ASSERT_EQ(Launch(stream), CUDA_SUCCESS);
  EXPECT_EQ(Waits(), waits + 2);
  ASSERT_EQ(api_.cuMemFree_v2(b), CUDA_SUCCESS);
  // From now on the fence applies.
  EXPECT_FALSE(ReusedAtOnce(4 * kMiB));
  EXPECT_EQ(api_.cuStreamDestroy_v2(stream), CUDA_SUCCESS);
}

// While the end is pending the shim queries its event before each watched call: in relaxed
// capture mode, so a global-mode capture begun meanwhile is not invalidated by it.
TEST_F(OrderedTest, CaptureWhileTheEndIsPendingIsNotInvalidated) {
  EXPECT_TRUE(ReusedAtOnce(4 * kMiB));  // leaves work pending on the legacy stream
  CUstream stream = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  ASSERT_GT(vramscope_fake_pending_events(), 1);  // the old work and the end
  CUevent captured = nullptr;
  ASSERT_EQ(api_.cuEventCreate(&captured, 0), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuEventRecord(captured, stream), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  EXPECT_EQ(api_.cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
  if (graph != nullptr) {
    EXPECT_EQ(api_.cuGraphDestroy(graph), CUDA_SUCCESS);
  }
  EXPECT_EQ(api_.cuStreamDestroy_v2(stream), CUDA_SUCCESS);
}

// Work for the per-thread default stream (a _ptsz entry point with a null stream, or the
// CU_STREAM_PER_THREAD handle), or from a second context, is not in the legacy stream's order.
TEST_F(OrderedTest, PerThreadStreamEndsIt) {
  EXPECT_TRUE(ReusedAtOnce(4 * kMiB));
  ASSERT_EQ(Launch(nullptr, /*per_thread=*/true), CUDA_SUCCESS);
  EXPECT_FALSE(ReusedAtOnce(4 * kMiB));
}

// CU_STREAM_LEGACY through a _ptsz entry point still names the legacy stream.
TEST_F(OrderedTest, LegacyHandleThroughPerThreadEntryPointKeepsIt) {
  ASSERT_EQ(Launch(CU_STREAM_LEGACY, /*per_thread=*/true), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuEventRecord_ptsz(work_, CU_STREAM_LEGACY), CUDA_SUCCESS);
  EXPECT_TRUE(ReusedAtOnce(4 * kMiB));
  ASSERT_EQ(api_.cuEventRecord_ptsz(work_, nullptr), CUDA_SUCCESS);
  EXPECT_FALSE(ReusedAtOnce(4 * kMiB));
}

TEST_F(OrderedTest, PerThreadHandleEndsIt) {
  EXPECT_TRUE(ReusedAtOnce(4 * kMiB));
  const std::uint64_t waits = Waits();
  ASSERT_EQ(api_.cuEventRecord(work_, CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  EXPECT_EQ(Waits(), waits + 1);
  EXPECT_FALSE(ReusedAtOnce(4 * kMiB));
}

TEST_F(OrderedTest, PerThreadSynchronousCopyEndsIt) {
  EXPECT_TRUE(ReusedAtOnce(4 * kMiB));
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, kMiB), CUDA_SUCCESS);
  const char host[16] = {};
  ASSERT_EQ(api_.cuMemcpyHtoD_v2_ptds(p, host, sizeof(host)), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_FALSE(ReusedAtOnce(4 * kMiB));
}

TEST_F(OrderedTest, WorkFromASecondContextEndsIt) {
  EXPECT_TRUE(ReusedAtOnce(4 * kMiB));
  CUcontext other = nullptr;
  ASSERT_EQ(api_.cuDevicePrimaryCtxRetain(&other, 1), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuCtxSetCurrent(other), CUDA_SUCCESS);
  CUevent there = nullptr;
  ASSERT_EQ(api_.cuEventCreate(&there, 0), CUDA_SUCCESS);
  const std::uint64_t waits = Waits();
  ASSERT_EQ(api_.cuEventRecord(there, nullptr), CUDA_SUCCESS);  // its own legacy stream
  EXPECT_EQ(Waits(), waits + 1);
  ASSERT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  EXPECT_FALSE(ReusedAtOnce(4 * kMiB));
  ASSERT_EQ(api_.cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
}

// An entry point the shim's <cuda.h> does not declare (a newer driver's) might queue work the
// shim does not watch. The fake exports one.
TEST_F(OrderedTest, UnknownEntryPointEndsIt) {
  EXPECT_TRUE(ReusedAtOnce(4 * kMiB));
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr);
  EXPECT_NE(dlsym(handle, "cuVramscopeFakeFutureEntryPoint"), nullptr);
  // Known but not wrapped: nothing changes.
  EXPECT_NE(dlsym(handle, "cuDeviceGetName"), nullptr);
  EXPECT_FALSE(ReusedAtOnce(4 * kMiB));
  dlclose(handle);
}

// VRAMSCOPE_ORDERED=0 (meson sets it for this test): the fence from the start.
TEST_F(OrderedTest, OffByEnvironment) {
  ASSERT_STREQ(getenv("VRAMSCOPE_ORDERED"), "0");
  EXPECT_FALSE(ReusedAtOnce(4 * kMiB));
}

}  // namespace
}  // namespace vramscope::fake
