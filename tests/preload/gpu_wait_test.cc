// Contract of the GPU-side waits (interposer/shim/stream_fence.h, VRAMSCOPE_FENCE_GPU_WAIT=1)
// over the fake driver with manual kernels: a kernel stays "running" until the test completes it,
// and the fake records, for the latest work queued on each stream, how many pending kernels it
// was not ordered after (same stream, the legacy stream's implicit synchronisation, or a
// cuStreamWaitEvent for an event recorded after the kernel).
//
// The rule under test: a block whose fence was handed over (given out again while the kernel
// that used it still runs) is never touched by work on any stream before that stream waited on
// the GPU for the fence's events. Each test uses a 32 MiB block on stream `old_` with its kernel
// left running, frees it, and allocates the same size: far more than the lag bound is pending,
// so the allocation takes the block at once (blocking sync is on: a host wait would hang, and
// the allocation runs on a worker thread that the test gives up on after a deadline). Then it
// queues work on some stream and checks that this work is ordered after the old kernel.
//
// Runs in pool mode with ordered reuse off (VRAMSCOPE_ORDERED=0), VRAMSCOPE_FENCE_EVENTS=1 and
// VRAMSCOPE_FENCE_GPU_WAIT=1.
#include <gtest/gtest.h>
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

class GpuWaitTest : public ManualKernelsTest {
 protected:
  void SetUp() override {
    ManualKernelsTest::SetUp();
    ASSERT_EQ(api_.cuStreamCreate(&old_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  }

  void ReleaseHeld() override {
    for (CUdeviceptr p : live_) EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuStreamDestroy_v2(old_), CUDA_SUCCESS);
  }

  // A block used by a kernel on old_ that still runs, freed, and allocated again: returns the
  // new allocation, which must be the same block, handed out with the kernel still pending.
  CUdeviceptr HandedOverBlock() {
    CUdeviceptr p = 0;
    EXPECT_EQ(api_.cuMemAlloc_v2(&p, kBlock), CUDA_SUCCESS);
    Launch(old_);
    EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
    std::atomic<bool> done{false};
    CUdeviceptr got = 0;
    std::thread worker([&] {
      EXPECT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
      EXPECT_EQ(api_.cuMemAlloc_v2(&got, kBlock), CUDA_SUCCESS);
      done = true;
    });
    const bool returned = Eventually([&] { return done.load(); });
    if (!returned) vramscope_fake_complete_all_events();  // unblock a host wait, then fail
    worker.join();
    EXPECT_TRUE(returned) << "the allocation waited on the host for the old kernel";
    EXPECT_EQ(got, p) << "the block was not handed out again";
    EXPECT_EQ(vramscope_fake_pending_kernels_on(old_), 1) << "the old kernel must still run";
    live_.push_back(got);
    return got;
  }

  CUstream old_ = nullptr;
  std::vector<CUdeviceptr> live_;
};

// A stream created after the handover: its first work waits. Fails if the wait is skipped.
TEST_F(GpuWaitTest, StreamCreatedAfterTheRoundWaitsBeforeItsFirstWork) {
  HandedOverBlock();
  CUstream fresh = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&fresh, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  Launch(fresh);
  EXPECT_EQ(vramscope_fake_unordered_at_last_work(fresh), 0)
      << "work on a new stream may touch the block while the old kernel runs";
  EXPECT_EQ(api_.cuStreamDestroy_v2(fresh), CUDA_SUCCESS);
}

// A stream that existed (and had work) before the round, and one wait per stream per round.
TEST_F(GpuWaitTest, ExistingStreamWaitsOncePerRound) {
  CUstream other = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  Launch(other);
  ASSERT_EQ(vramscope_fake_complete_kernels(other, -1), 1);
  HandedOverBlock();
  const std::uint64_t waits = Calls("cuStreamWaitEvent");
  Launch(other);
  EXPECT_EQ(vramscope_fake_unordered_at_last_work(other), 0);
  const std::uint64_t after_first = Calls("cuStreamWaitEvent");
  EXPECT_GE(after_first, waits + 1);
  Launch(other);
  Launch(other);
  EXPECT_EQ(Calls("cuStreamWaitEvent"), after_first) << "waited again for the same round";
  EXPECT_EQ(api_.cuStreamDestroy_v2(other), CUDA_SUCCESS);
}

// The legacy stream, a synchronous copy (queued on the legacy stream) and a synchronous memset.
TEST_F(GpuWaitTest, LegacyStreamAndSynchronousCopiesWait) {
  const CUdeviceptr p = HandedOverBlock();
  std::vector<unsigned char> bytes(4096, 7);
  ASSERT_EQ(api_.cuMemcpyHtoD_v2(p, bytes.data(), bytes.size()), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_unordered_at_last_work(CU_STREAM_LEGACY), 0)
      << "a synchronous copy wrote the block while the old kernel ran";
  ASSERT_EQ(api_.cuMemsetD8_v2(p, 0, bytes.size()), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_unordered_at_last_work(CU_STREAM_LEGACY), 0);
  Launch(nullptr);
  EXPECT_EQ(vramscope_fake_unordered_at_last_work(CU_STREAM_LEGACY), 0);
}

// The calling thread's per-thread default stream, through a _ptsz entry point.
TEST_F(GpuWaitTest, PerThreadStreamWaits) {
  HandedOverBlock();
  ASSERT_EQ(api_.cuLaunchKernel_ptsz(kKernel, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr),
            CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_unordered_at_last_work(CU_STREAM_PER_THREAD), 0);
}

// Another thread, on its own stream, uses the block it was given.
TEST_F(GpuWaitTest, AnotherThreadsStreamWaits) {
  HandedOverBlock();
  int unordered = -2;
  std::thread other([&] {
    EXPECT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    CUstream s = nullptr;
    ASSERT_EQ(api_.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    Launch(s);
    unordered = vramscope_fake_unordered_at_last_work(s);
    EXPECT_EQ(api_.cuStreamDestroy_v2(s), CUDA_SUCCESS);
  });
  other.join();
  EXPECT_EQ(unordered, 0);
}

// Capture: a stream begins capturing after the handover. The wait is queued before the capture
// begins (a wait inside it, on an event recorded outside, would invalidate it); the captured
// graph, launched on yet another stream, runs only after that stream waited too.
TEST_F(GpuWaitTest, CaptureBegunAfterTheRoundIsNotInvalidatedAndItsLaunchWaits) {
  HandedOverBlock();
  CUstream capturing = nullptr;
  CUstream launch = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&capturing, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuStreamCreate(&launch, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  const std::uint64_t waits = Calls("cuStreamWaitEvent");
  ASSERT_EQ(api_.cuStreamBeginCapture_v2(capturing, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  EXPECT_GT(Calls("cuStreamWaitEvent"), waits) << "the capturing stream did not wait first";
  CUgraph graph = nullptr;
  ASSERT_EQ(api_.cuStreamEndCapture(capturing, &graph), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_invalidated_captures(), 0);
  ASSERT_NE(graph, nullptr);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(api_.cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuGraphLaunch(exec, launch), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_unordered_at_last_work(launch), 0)
      << "a graph launch may touch the block while the old kernel runs";
  EXPECT_EQ(api_.cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuGraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamDestroy_v2(capturing), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamDestroy_v2(launch), CUDA_SUCCESS);
}

// A stream of another device (which may reach the block by peer access) waits too: events of
// another device's context are valid in cuStreamWaitEvent.
TEST_F(GpuWaitTest, StreamOfAnotherDeviceWaits) {
  HandedOverBlock();
  CUcontext other = nullptr;
  ASSERT_EQ(api_.cuDevicePrimaryCtxRetain(&other, 1), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuCtxSetCurrent(other), CUDA_SUCCESS);
  CUstream s = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  const std::uint64_t waits = Calls("cuStreamWaitEvent");
  Launch(s);
  EXPECT_GT(Calls("cuStreamWaitEvent"), waits) << "a stream of device 1 did not wait";
  EXPECT_EQ(api_.cuStreamDestroy_v2(s), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
}

// Four threads, each on its own non-blocking stream, allocate, use (a kernel) and free one size
// in a loop while a fifth completes kernels in stream order: blocks move between threads and
// streams, many of them handed over with their last kernel still running. Every launch must be
// ordered after the last kernel that used its block (checked by the fake at the launch).
TEST_F(GpuWaitTest, ThreadsOnTheirOwnStreamsNeverTouchABlockBeforeItsOldKernel) {
  vramscope_fake_set_blocking_sync(0);  // host waits (a full owed table) finish what they wait for
  constexpr int kThreads = 4;
  constexpr int kRounds = 300;
  struct Use {  // the test's own books: which kernel last used which block
    CUstream stream = nullptr;
    std::uint64_t kernel = 0;
  };
  std::vector<std::pair<CUdeviceptr, Use>> last_use;
  int violations = 0;
  int checked = 0;
  std::vector<CUstream> streams(kThreads);
  for (CUstream& s : streams)
    ASSERT_EQ(api_.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  const std::uint64_t handovers_before = Calls("cuStreamWaitEvent");
  ChurnOnOwnStreams(streams, kRounds, [&](int t, CUdeviceptr p) {
    ASSERT_EQ(api_.cuLaunchKernel(kKernel, 1, 1, 1, 1, 1, 1, 0, streams[t], nullptr, nullptr),
              CUDA_SUCCESS);
    const std::uint64_t kernel = vramscope_fake_last_kernel();
    bool found = false;
    for (auto& [address, use] : last_use) {
      if (address != p) continue;
      found = true;
      ++checked;
      if (vramscope_fake_kernel_unordered_at_last_work(streams[t], use.kernel) != 0) ++violations;
      use = {streams[t], kernel};
    }
    if (!found) last_use.push_back({p, {streams[t], kernel}});
  });
  EXPECT_EQ(violations, 0) << "of " << checked << " reuses";
  EXPECT_GT(Calls("cuStreamWaitEvent"), handovers_before) << "no block was handed over early";
  vramscope_fake_complete_all_events();
  for (CUstream s : streams) EXPECT_EQ(api_.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

// Blocks freed on two streams, each free followed by its own round, go over in one handover:
// all three serve allocations at once with no growth, and a new stream's first work waits for
// one event per stream (its newest, which follows the older kernels of that stream), ordered
// after every old kernel. Handing fences over one at a time made it wait once per round.
TEST_F(GpuWaitTest, QueuedRoundsGoOverAsOneRoundOfOneEventPerStream) {
  CUstream other = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUdeviceptr blocks[3] = {};
  for (CUdeviceptr& b : blocks) ASSERT_EQ(api_.cuMemAlloc_v2(&b, kBlock), CUDA_SUCCESS);
  const CUstream used_on[3] = {old_, other, old_};
  for (int i = 0; i < 3; ++i) {
    Launch(used_on[i]);
    const std::uint64_t records = Calls("cuEventRecord");
    ASSERT_EQ(api_.cuMemFree_v2(blocks[i]), CUDA_SUCCESS);
    // The helper's round for this free (a queued fence of its own).
    ASSERT_TRUE(Eventually([&] { return Calls("cuEventRecord") > records; }));
  }
  const std::uint64_t grows = Calls("cuMemSetAccess") + Calls("cuMemAlloc_v2");
  std::atomic<bool> done{false};
  CUdeviceptr got[3] = {};
  std::thread worker([&] {
    EXPECT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    for (CUdeviceptr& g : got) EXPECT_EQ(api_.cuMemAlloc_v2(&g, kBlock), CUDA_SUCCESS);
    done = true;
  });
  const bool returned = Eventually([&] { return done.load(); });
  if (!returned) vramscope_fake_complete_all_events();
  worker.join();
  ASSERT_TRUE(returned) << "an allocation waited on the host for an old kernel";
  for (CUdeviceptr g : got) {
    live_.push_back(g);
    EXPECT_TRUE(g == blocks[0] || g == blocks[1] || g == blocks[2]) << "not a freed block";
  }
  EXPECT_EQ(Calls("cuMemSetAccess") + Calls("cuMemAlloc_v2"), grows) << "the pool grew";
  EXPECT_EQ(vramscope_fake_pending_kernels_on(old_), 2);
  EXPECT_EQ(vramscope_fake_pending_kernels_on(other), 1);
  CUstream fresh = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&fresh, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  const std::uint64_t waits = Calls("cuStreamWaitEvent");
  Launch(fresh);
  EXPECT_EQ(vramscope_fake_unordered_at_last_work(fresh), 0)
      << "work on a new stream may touch a block while its old kernel runs";
  EXPECT_LE(Calls("cuStreamWaitEvent"), waits + 2) << "more than one wait per stream";
  EXPECT_EQ(api_.cuStreamDestroy_v2(fresh), CUDA_SUCCESS);
  vramscope_fake_complete_all_events();
  EXPECT_EQ(api_.cuStreamDestroy_v2(other), CUDA_SUCCESS);
}

// Once the old kernel finished, nothing is owed: new streams queue work without any wait.
TEST_F(GpuWaitTest, NothingOwedOnceTheRoundCompleted) {
  HandedOverBlock();
  ASSERT_EQ(vramscope_fake_complete_kernels(old_, -1), 1);
  CUstream fresh = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&fresh, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  const std::uint64_t waits = Calls("cuStreamWaitEvent");
  Launch(fresh);
  Launch(nullptr);
  EXPECT_EQ(Calls("cuStreamWaitEvent"), waits);
  EXPECT_EQ(api_.cuStreamDestroy_v2(fresh), CUDA_SUCCESS);
}

// The context goes away with a round owed: its events are gone, and the new context's streams
// never wait on them (the fake refuses a destroyed event; the shim must not even try).
TEST_F(GpuWaitTest, ContextResetForgetsItsOwedRounds) {
  HandedOverBlock();
  live_.clear();  // the reset frees the pool's memory
  vramscope_fake_set_blocking_sync(0);
  ASSERT_EQ(api_.cuDevicePrimaryCtxReset_v2(0), CUDA_SUCCESS);
  old_ = nullptr;
  ASSERT_EQ(api_.cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);  // the reset kept one retain
  ASSERT_EQ(api_.cuStreamCreate(&old_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  const std::uint64_t waits = Calls("cuStreamWaitEvent");
  const std::uint64_t syncs = Calls("cuEventSynchronize");
  Launch(old_);
  Launch(nullptr);
  EXPECT_EQ(Calls("cuStreamWaitEvent"), waits);
  EXPECT_EQ(Calls("cuEventSynchronize"), syncs);
}

// Below the host wait's lag bound (1/16 of the pool) but past the handover bound (1/256,
// VRAMSCOPE_FENCE_HANDOVER_FRACTION's default): the held block is handed over rather than the
// pool grown. With 640 MiB live, the 32 MiB freed block is under 1/16 of what the pool holds.
TEST_F(GpuWaitTest, BelowTheLagBoundTheOldestFenceIsStillHandedOver) {
  CUdeviceptr ballast = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&ballast, 640 * kMiB), CUDA_SUCCESS);
  live_.push_back(ballast);
  // A growth: one cuMemSetAccess per Map (one cuMemCreate per piece), or one cuMemAlloc.
  const std::uint64_t grows = Calls("cuMemSetAccess") + Calls("cuMemAlloc_v2");
  const CUdeviceptr p = HandedOverBlock();  // fails if the pool grew instead (another block)
  EXPECT_LE(Calls("cuMemSetAccess") + Calls("cuMemAlloc_v2"), grows + 1)
      << "the pool grew for the second 32 MiB";
  Launch(nullptr);
  EXPECT_EQ(vramscope_fake_unordered_at_last_work(CU_STREAM_LEGACY), 0);
  (void)p;
}

// Memory handed over while its old kernel runs goes back to the driver only once the GPU passed
// it, and without a host wait: the pool's soft cap unmaps the free 192 MiB block (between two
// live ones, so a 512 MiB request cannot use it) while the round is owed; the unmap waits for the
// round, not for a context synchronisation (which would hang here), and the new mapping takes
// the deferred pieces' memory. Fails if the unmap synchronises (the allocation never returns),
// happens under the running kernel, or the memory is created anew beside the deferred pieces.
TEST_F(GpuWaitTest, UnmapOfHandedOverMemoryWaitsForTheRoundNotTheHost) {
  CUdeviceptr held[4] = {};
  const size_t sizes[4] = {2 * kMiB, 192 * kMiB, 2 * kMiB, kBlock};
  for (int i = 0; i < 4; ++i) ASSERT_EQ(api_.cuMemAlloc_v2(&held[i], sizes[i]), CUDA_SUCCESS);
  live_.push_back(held[0]);
  live_.push_back(held[2]);
  Launch(old_);
  ASSERT_EQ(api_.cuMemFree_v2(held[1]), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemFree_v2(held[3]), CUDA_SUCCESS);
  const std::uint64_t unmaps = Calls("cuMemUnmap");
  const std::uint64_t retains = Calls("cuMemRetainAllocationHandle");
  const std::uint64_t under_work = vramscope_fake_unmaps_under_pending_work();
  std::atomic<bool> done{false};
  CUdeviceptr got[2] = {};
  std::thread worker([&] {
    EXPECT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuMemAlloc_v2(&got[0], kBlock), CUDA_SUCCESS);  // the handover
    EXPECT_EQ(api_.cuMemAlloc_v2(&got[1], 512 * kMiB), CUDA_SUCCESS);
    done = true;
  });
  const bool returned = Eventually([&] { return done.load(); });
  if (!returned) vramscope_fake_complete_all_events();
  worker.join();
  ASSERT_TRUE(returned) << "an allocation waited on the host for the old kernel";
  live_.push_back(got[0]);
  live_.push_back(got[1]);
  EXPECT_EQ(vramscope_fake_pending_kernels_on(old_), 1) << "the old kernel must still run";
  EXPECT_EQ(Calls("cuMemUnmap"), unmaps) << "memory went back under the old kernel";
  EXPECT_EQ(vramscope_fake_unmaps_under_pending_work(), under_work);
  // Its whole 64 MiB pieces went into the new mapping rather than new memory beside them.
  EXPECT_GT(Calls("cuMemRetainAllocationHandle"), retains) << "the memory was held twice";
  // Once the kernel is done, the helper retires the round and the deferred pieces go back.
  ASSERT_EQ(vramscope_fake_complete_kernels(old_, -1), 1);
  EXPECT_TRUE(Eventually([&] { return Calls("cuMemUnmap") > unmaps; }))
      << "the soft cap never gave the free block back";
}

// Many deferred unmaps: blocks of 2 MiB up to 80-320 MiB (mappings of several pieces) allocated
// and freed at random while the kernels that used them complete in batches, so the soft cap gives
// memory back under owed rounds again and again and new mappings meet deferred pieces of every
// kind (taken back in place, mapped again elsewhere, in the way). Every allocation must succeed.
// Host waits are allowed here (a Map in the way of a deferred piece synchronises). Fails, for
// one, if a Map maps the memory of a deferred piece lying inside the mapping it is making (that
// piece's address then stays mapped and the driver refuses the mapping), which the H200 found
// and this test finds too (the first case's 536th allocation).
TEST_F(GpuWaitTest, RandomChurnWithDeferredUnmapsNeverFailsAnAllocation) {
  vramscope_fake_set_blocking_sync(0);
  // (seed, largest block in 2 MiB granules)
  const std::pair<std::uint64_t, std::uint64_t> cases[] = {{1, 40}, {2, 80}, {4, 160}, {3, 160}};
  for (const auto& [seed, granules] : cases) {
    if (HasFailure()) break;
    std::uint64_t state = seed;
    auto next = [&state] {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      return state;
    };
    std::vector<std::pair<CUdeviceptr, size_t>> held;
    size_t live = 0;
    for (int i = 0; i < 2000 && !HasFailure(); ++i) {
      const size_t bytes = (1 + next() % granules) * 2 * kMiB;
      while (live + bytes > 448 * kMiB || (!held.empty() && next() % 3 == 0)) {
        const size_t at = next() % held.size();
        ASSERT_EQ(api_.cuMemFree_v2(held[at].first), CUDA_SUCCESS);
        live -= held[at].second;
        held[at] = held.back();
        held.pop_back();
      }
      CUdeviceptr p = 0;
      ASSERT_EQ(api_.cuMemAlloc_v2(&p, bytes), CUDA_SUCCESS)
          << "seed " << seed << ", allocation " << i;
      held.emplace_back(p, bytes);
      live += bytes;
      Launch(old_);
      if (next() % 8 == 0)
        (void)vramscope_fake_complete_kernels(old_, static_cast<int>(next() % 6));
    }
    vramscope_fake_complete_all_events();
    for (const auto& [p, bytes] : held) EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  }
}

// A fork child inherits no owed round: its calls never touch the parent's events.
TEST_F(GpuWaitTest, ForkChildOwesNothing) {
  HandedOverBlock();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const std::uint64_t waits = Calls("cuStreamWaitEvent");
    // The driver refuses everything in a child of an initialised process.
    const bool refused = api_.cuLaunchKernel(kKernel, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr,
                                             nullptr) != CUDA_SUCCESS;
    _exit(refused && Calls("cuStreamWaitEvent") == waits ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // The parent still owes: its next work waits.
  Launch(nullptr);
  EXPECT_EQ(vramscope_fake_unordered_at_last_work(CU_STREAM_LEGACY), 0);
}

}  // namespace
}  // namespace vramscope::fake
