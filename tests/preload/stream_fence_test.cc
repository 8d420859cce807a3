// Contract of the stream-aware event fences (interposer/shim/stream_fence.h) over the fake driver
// with manual kernels: a kernel stays "running" until the test completes it, and an event
// recorded after it completes only then (with the legacy stream's implicit synchronisation).
//
// The rule under test: a pooled block freed while kernels that may use it are queued is never
// handed out again before every stream that had work has passed the free. Each test frees a
// 32 MiB block with kernels pending, then allocates the same size on a worker thread: far more
// than the lag bound is pending, so the worker waits (blocking sync: really blocks) for the
// oldest fence instead of growing, and must get the block back only once the kernels finished.
//
// Runs in pool mode with ordered reuse off (VRAMSCOPE_ORDERED=0: every free waits for a fence).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <cuda.h>

#include "fake_cuda_control.h"
#include "manual_kernels.h"
#include "routes.h"

namespace vramscope::fake {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kBlock = 32 * kMiB;

std::uint64_t Calls(const char* name) { return vramscope_fake_call_count(name); }
// Driver calls that take device memory for the pool (VMM maps or segments).
std::uint64_t DriverAllocs() { return Calls("cuMemCreate") + Calls("cuMemAlloc_v2"); }

class StreamFenceTest : public ManualKernelsTest {
 protected:
  CUstream NewStream(unsigned flags) {
    CUstream stream = nullptr;
    EXPECT_EQ(api_.cuStreamCreate(&stream, flags), CUDA_SUCCESS);
    return stream;
  }

  // Allocates kBlock on another thread; `pending_kernels` is what was still running the moment
  // the allocation returned.
  struct Worker {
    std::atomic<bool> done{false};
    std::atomic<int> pending_kernels{-1};
    CUdeviceptr got = 0;
    std::thread thread;
  };
  void StartAllocation(Worker* w) {
    w->thread = std::thread([this, w] {
      EXPECT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
      EXPECT_EQ(api_.cuMemAlloc_v2(&w->got, kBlock), CUDA_SUCCESS);
      w->pending_kernels = vramscope_fake_pending_kernels();
      w->done = true;
    });
  }
};

// Two non-blocking streams use the block; it comes back only after both kernels finished. Fails
// if a fence forgets a stream (the worker then returns after the first kernel).
TEST_F(StreamFenceTest, EveryStreamThatHadWorkMustPassTheFree) {
  CUstream a = NewStream(CU_STREAM_NON_BLOCKING);
  CUstream b = NewStream(CU_STREAM_NON_BLOCKING);
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, kBlock), CUDA_SUCCESS);
  Launch(a);
  Launch(b);
  const std::uint64_t syncs = Calls("cuCtxSynchronize");
  ASSERT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  Worker w;
  StartAllocation(&w);
  // The worker blocks on one stream's event (whichever the fence lists first)...
  EXPECT_TRUE(
      Eventually([&] { return vramscope_fake_blocked_wait_stream() != nullptr || w.done; }));
  EXPECT_FALSE(w.done) << "handed out with both kernels running";
  CUstream first = vramscope_fake_blocked_wait_stream();
  ASSERT_TRUE(first == a || first == b);
  CUstream second = first == a ? b : a;
  EXPECT_EQ(vramscope_fake_complete_kernels(first, 1), 1);
  // ...then on the other's.
  EXPECT_TRUE(Eventually([&] { return vramscope_fake_blocked_wait_stream() == second || w.done; }));
  EXPECT_FALSE(w.done) << "handed out with the other stream's kernel running";
  EXPECT_EQ(vramscope_fake_complete_kernels(second, 1), 1);
  w.thread.join();
  EXPECT_EQ(w.pending_kernels.load(), 0);
  EXPECT_EQ(w.got, p) << "waited, then reused the block instead of growing";
  EXPECT_EQ(Calls("cuCtxSynchronize"), syncs) << "no device synchronisation";
  EXPECT_EQ(api_.cuMemFree_v2(w.got), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamDestroy_v2(a), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamDestroy_v2(b), CUDA_SUCCESS);
}

// Default streams: the legacy stream and a per-thread stream. One event on the legacy stream
// covers both (the per-thread stream is blocking); the block waits for both kernels.
TEST_F(StreamFenceTest, DefaultStreamsAreCoveredByTheLegacyStreamsEvent) {
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, kBlock), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuLaunchKernel_ptsz(kKernel, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr),
            CUDA_SUCCESS);
  Launch(nullptr);
  ASSERT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  Worker w;
  StartAllocation(&w);
  EXPECT_TRUE(
      Eventually([&] { return vramscope_fake_blocked_wait_stream() != nullptr || w.done; }));
  EXPECT_FALSE(w.done);
  EXPECT_EQ(vramscope_fake_blocked_wait_stream(), CU_STREAM_LEGACY);
  EXPECT_EQ(vramscope_fake_complete_kernels(CU_STREAM_PER_THREAD, 1), 1);
  // The legacy stream's event still waits for the legacy kernel: the worker stays blocked.
  EXPECT_TRUE(
      Eventually([&] { return vramscope_fake_blocked_wait_stream() != nullptr || w.done; }));
  EXPECT_FALSE(w.done) << "handed out with the legacy stream's kernel running";
  EXPECT_EQ(vramscope_fake_complete_kernels(nullptr, 1), 1);
  w.thread.join();
  EXPECT_EQ(w.pending_kernels.load(), 0);
  EXPECT_EQ(w.got, p);
  EXPECT_EQ(api_.cuMemFree_v2(w.got), CUDA_SUCCESS);
}

// A stream destroyed while its kernel still runs: the shim records the stream's event before
// the destroy (recording on it afterwards would fail), and the block waits for that kernel,
// without a device synchronisation.
TEST_F(StreamFenceTest, StreamDestroyedWhileItsWorkIsPending) {
  CUstream a = NewStream(CU_STREAM_NON_BLOCKING);
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, kBlock), CUDA_SUCCESS);
  Launch(a);
  const std::uint64_t syncs = Calls("cuCtxSynchronize");
  // Free and destroy before any round can look at the stream (the destroy records its event).
  ASSERT_EQ(api_.cuStreamDestroy_v2(a), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  Worker w;
  StartAllocation(&w);
  EXPECT_TRUE(
      Eventually([&] { return vramscope_fake_blocked_wait_stream() != nullptr || w.done; }));
  EXPECT_FALSE(w.done) << "handed out with the destroyed stream's kernel running";
  EXPECT_EQ(vramscope_fake_complete_next_event(), 1);  // the kernel
  w.thread.join();
  EXPECT_EQ(w.pending_kernels.load(), 0);
  EXPECT_EQ(w.got, p);
  EXPECT_EQ(Calls("cuCtxSynchronize"), syncs);
  EXPECT_EQ(api_.cuMemFree_v2(w.got), CUDA_SUCCESS);
}

// While a capture is live no event is recorded anywhere (it could join the graph): the pool
// grows rather than reuse, and the capture is never invalidated by the shim. (Relaxed mode: a
// global-mode capture refuses the allocation itself, as the driver does.)
TEST_F(StreamFenceTest, CaptureLiveFallsBackToTheDeviceRule) {
  CUstream a = NewStream(CU_STREAM_NON_BLOCKING);
  CUstream captured = NewStream(CU_STREAM_NON_BLOCKING);
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, kBlock), CUDA_SUCCESS);
  Launch(a);
  ASSERT_EQ(api_.cuStreamBeginCapture_v2(captured, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  const std::uint64_t records = Calls("cuEventRecord");
  ASSERT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  CUdeviceptr q = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&q, kBlock), CUDA_SUCCESS);
  EXPECT_NE(q, p) << "reused during a capture with its kernel running";
  EXPECT_EQ(Calls("cuEventRecord"), records);
  CUgraph graph = nullptr;
  EXPECT_EQ(api_.cuStreamEndCapture(captured, &graph), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_invalidated_captures(), 0);
  if (graph != nullptr) {
    EXPECT_EQ(api_.cuGraphDestroy(graph), CUDA_SUCCESS);
  }
  // After the capture the fences work again: the block comes back once the kernel finished.
  Worker w;
  StartAllocation(&w);
  EXPECT_TRUE(Eventually([&] { return Calls("cuEventRecord") > records || w.done; }));
  EXPECT_EQ(vramscope_fake_complete_kernels(a, 1), 1);
  w.thread.join();
  EXPECT_EQ(w.pending_kernels.load(), 0);
  EXPECT_EQ(w.got, p);
  EXPECT_EQ(api_.cuMemFree_v2(q), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(w.got), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamDestroy_v2(a), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamDestroy_v2(captured), CUDA_SUCCESS);
}

// The context goes away with fences queued: its pool is dropped, its streams and events are
// never touched again, and a new context's pool works.
TEST_F(StreamFenceTest, ContextResetWithFencesQueued) {
  CUstream a = NewStream(CU_STREAM_NON_BLOCKING);
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, kBlock), CUDA_SUCCESS);
  Launch(a);
  const std::uint64_t records = Calls("cuEventRecord");
  ASSERT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_TRUE(Eventually([&] { return Calls("cuEventRecord") > records; }));
  vramscope_fake_set_blocking_sync(0);
  ASSERT_EQ(api_.cuDevicePrimaryCtxReset_v2(0), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);  // the reset kept one retain
  CUstream b = NewStream(CU_STREAM_NON_BLOCKING);
  CUdeviceptr q = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&q, kBlock), CUDA_SUCCESS);
  Launch(b);
  ASSERT_EQ(api_.cuMemFree_v2(q), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_complete_kernels(b, 1), 1);
  CUdeviceptr r = 0;
  EXPECT_TRUE(Eventually([&] {
    EXPECT_EQ(api_.cuMemAlloc_v2(&r, kBlock), CUDA_SUCCESS);
    if (r == q) return true;
    EXPECT_EQ(api_.cuMemFree_v2(r), CUDA_SUCCESS);
    return false;
  }));
  EXPECT_EQ(api_.cuMemFree_v2(r), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamDestroy_v2(b), CUDA_SUCCESS);
}

// A fork child starts with no streams and no fences; the parent's fences still complete.
TEST_F(StreamFenceTest, ForkChildStartsClean) {
  CUstream a = NewStream(CU_STREAM_NON_BLOCKING);
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, kBlock), CUDA_SUCCESS);
  Launch(a);
  ASSERT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The driver refuses everything in a child of an initialised process; the shim must not
    // touch the parent's pools or streams.
    CUdeviceptr c = 0;
    const bool ok =
        api_.cuMemAlloc_v2(&c, kBlock) != CUDA_SUCCESS &&
        api_.cuLaunchKernel(kKernel, 1, 1, 1, 1, 1, 1, 0, a, nullptr, nullptr) != CUDA_SUCCESS;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  Worker w;
  StartAllocation(&w);
  EXPECT_TRUE(
      Eventually([&] { return vramscope_fake_blocked_wait_stream() != nullptr || w.done; }));
  EXPECT_FALSE(w.done);
  EXPECT_EQ(vramscope_fake_complete_kernels(a, 1), 1);
  w.thread.join();
  EXPECT_EQ(w.got, p);
  EXPECT_EQ(api_.cuMemFree_v2(w.got), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamDestroy_v2(a), CUDA_SUCCESS);
}

// Four threads, each on its own non-blocking stream, allocate, "use" (a kernel), free; a fifth
// completes kernels in stream order (and the shim's own host waits finish what they wait for).
// Every block handed out must have had every kernel that used it finished: kernels finish in
// stream order, so kernel k of a stream is done once launched - still pending >= k. Blocks come
// from one size class, so they move between threads and streams.
TEST_F(StreamFenceTest, ThreadsOnTheirOwnStreamsNeverGetABlockStillInUse) {
  vramscope_fake_set_blocking_sync(0);  // host waits finish the kernels they wait for
  constexpr int kThreads = 4;
  constexpr int kRounds = 300;
  std::vector<std::uint64_t> launched(kThreads, 0);
  struct Use {  // the test's own books: which kernel last used which block
    int thread = -1;
    std::uint64_t kernel = 0;
  };
  std::vector<std::pair<CUdeviceptr, Use>> last_use;
  int violations = 0;
  std::vector<CUstream> streams(kThreads);
  for (CUstream& s : streams) s = NewStream(CU_STREAM_NON_BLOCKING);
  ChurnOnOwnStreams(streams, kRounds, [&](int t, CUdeviceptr p) {
    for (auto& [address, use] : last_use) {
      if (address != p || use.thread < 0) continue;
      const auto pending =
          static_cast<std::uint64_t>(vramscope_fake_pending_kernels_on(streams[use.thread]));
      if (launched[use.thread] - pending < use.kernel) ++violations;
    }
    ASSERT_EQ(api_.cuLaunchKernel(kKernel, 1, 1, 1, 1, 1, 1, 0, streams[t], nullptr, nullptr),
              CUDA_SUCCESS);
    const std::uint64_t kernel = ++launched[t];
    bool found = false;
    for (auto& [address, use] : last_use) {
      if (address == p) {
        use = {t, kernel};
        found = true;
      }
    }
    if (!found) last_use.push_back({p, {t, kernel}});
  });
  EXPECT_EQ(violations, 0);
  vramscope_fake_complete_all_events();
  for (CUstream s : streams) EXPECT_EQ(api_.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

// A pool queues at most 64 fences; a round past that joins the newest fence. The newest fence's
// own events must stay in it: here they cover stream C, which the joining round does not touch.
// Rounds are issued inline (VRAMSCOPE_FENCE_ASYNC=0, one per 8 MiB freed) and allocations never
// wait (VRAMSCOPE_FENCE_LAG_FRACTION=0), so the sequence is deterministic.
TEST_F(StreamFenceTest, AFullFenceQueueKeepsEveryStreamOfItsNewestFence) {
  const char* async = getenv("VRAMSCOPE_FENCE_ASYNC");
  if (async == nullptr || std::string(async) != "0") GTEST_SKIP() << "stream_fence_inline only";
  vramscope_fake_set_blocking_sync(0);
  ASSERT_EQ(vramscope_fake_set_capacity(0, size_t{4} << 30), 0);  // no pressure synchronisation
  constexpr size_t kRoundBlock = 8 * kMiB;
  CUstream a = NewStream(CU_STREAM_NON_BLOCKING);
  CUstream b = NewStream(CU_STREAM_NON_BLOCKING);
  CUstream c = NewStream(CU_STREAM_NON_BLOCKING);
  auto use_and_free = [&](CUstream stream) {
    CUdeviceptr p = 0;
    EXPECT_EQ(api_.cuMemAlloc_v2(&p, kRoundBlock), CUDA_SUCCESS);
    Launch(stream);
    EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);  // one round
    return p;
  };
  use_and_free(a);                               // fence 1: stream a, stays pending
  for (int i = 0; i < 62; ++i) use_and_free(b);  // fences 2-63
  const CUdeviceptr on_c = use_and_free(c);      // fence 64 (the queue is full): stream c
  use_and_free(b);                               // joins fence 64
  EXPECT_EQ(vramscope_fake_complete_kernels(a, -1), 1);
  EXPECT_EQ(vramscope_fake_complete_kernels(b, -1), 63);
  // One more round (no stream work since: it joins fence 64 too), and its poll.
  CUdeviceptr t = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&t, kRoundBlock), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemFree_v2(t), CUDA_SUCCESS);
  // Everything but c's kernel finished: every block but c's may come back, c's may not.
  std::vector<CUdeviceptr> got;
  int early = 0;
  const std::uint64_t grown = DriverAllocs();
  for (int i = 0; i < 70; ++i) {
    CUdeviceptr p = 0;
    ASSERT_EQ(api_.cuMemAlloc_v2(&p, kRoundBlock), CUDA_SUCCESS);
    if (p == on_c && vramscope_fake_pending_kernels_on(c) != 0) ++early;
    got.push_back(p);
  }
  EXPECT_EQ(early, 0) << "stream c's block handed out with its kernel running";
  EXPECT_LT(DriverAllocs() - grown, got.size()) << "the finished fences' blocks came back";
  EXPECT_EQ(vramscope_fake_complete_kernels(c, -1), 1);
  for (CUdeviceptr p : got) EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  for (CUstream s : {a, b, c}) EXPECT_EQ(api_.cuStreamDestroy_v2(s), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_set_capacity(0, size_t{1} << 30), 0);
}

}  // namespace
}  // namespace vramscope::fake
