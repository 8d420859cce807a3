// Behaviour of the real libvramscope.so over the fake driver (tests/fakes), in the mode named by
// VRAMSCOPE_MODE (pool, passthrough or strict; meson runs this file once per mode).
//
// The program links the fake (route R4, direct calls bound to the preloaded shim) and reads the
// fake's call counters to see which driver calls the shim made: the fake counts calls into its
// own entry points only, so a call served by the pool does not show up there.
#include <dirent.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <cuda.h>

#include "fake_cuda_control.h"
#include "routes.h"

namespace vramscope::fake {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

std::string ModeName() {
  const char* mode = getenv("VRAMSCOPE_MODE");
  return mode == nullptr || mode[0] == '\0' ? "pool" : mode;
}
bool Pooled() { return ModeName() != "passthrough"; }
bool Strict() { return ModeName() == "strict"; }
// Pool mode with the stream-aware event fences: the default; VRAMSCOPE_FENCE_EVENTS=0 (the
// shim_pool_devsync run) leaves the amortised device synchronisation alone.
bool EventFences() {
  const char* events = getenv("VRAMSCOPE_FENCE_EVENTS");
  return ModeName() == "pool" && (events == nullptr || std::string_view(events) != "0");
}

// Driver calls that take device memory for the pool (segments or VMM) or for the program.
std::uint64_t DriverAllocs() {
  return vramscope_fake_call_count("cuMemAlloc_v2") + vramscope_fake_call_count("cuMemCreate");
}
std::uint64_t Syncs() { return vramscope_fake_call_count("cuCtxSynchronize"); }

// Waits (bounded) until every thread of this process but the caller is asleep ('S' in
// /proc/self/task/TID/stat): the shim's fence helper blocked waiting for work, so every
// synchronisation requested so far has been made. A request wakes the helper before the call
// that made it returns, and the helper sleeps again only once no request is left. False when the
// deadline passed first.
bool WaitUntilOtherThreadsSleep() {
  const std::string self = std::to_string(gettid());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    bool asleep = true;
    DIR* tasks = opendir("/proc/self/task");
    if (tasks == nullptr) return false;
    while (const dirent* task = readdir(tasks)) {
      const std::string tid = task->d_name;
      if (tid == "." || tid == ".." || tid == self) continue;
      std::ifstream in("/proc/self/task/" + tid + "/stat");
      std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      // The state follows the command name, which is in parentheses and may hold anything.
      const std::size_t paren = stat.rfind(')');
      if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'S') {
        asleep = false;
      }
    }
    closedir(tasks);
    if (asleep) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
}

class ShimTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string error;
    ASSERT_TRUE(LoadDirect(&api_, &error)) << error;
  }

  void SetUp() override {
    ASSERT_NE(ModuleOf(reinterpret_cast<void*>(api_.cuMemAlloc_v2)).find("libvramscope"),
              std::string::npos)
        << "run with LD_PRELOAD=libvramscope.so";
    vramscope_fake_set_manual_events(0);
    vramscope_fake_set_blocking_sync(0);
    ASSERT_EQ(api_.cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  }

  void TearDown() override {
    vramscope_fake_complete_all_events();
    vramscope_fake_set_manual_events(0);
    vramscope_fake_set_blocking_sync(0);
    EXPECT_EQ(api_.cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
    // The last release destroys the primary context and its memory; the shim drops its pool.
    EXPECT_EQ(api_.cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
    vramscope_fake_set_capacity(0, size_t{1} << 30);
  }

  static DriverApi api_;
  CUcontext ctx_ = nullptr;
};

DriverApi ShimTest::api_;

TEST_F(ShimTest, PoolServesRepeatedAllocations) {
  const std::uint64_t before = DriverAllocs();
  for (int i = 0; i < 100; ++i) {
    CUdeviceptr p = 0;
    ASSERT_EQ(api_.cuMemAlloc_v2(&p, kMiB), CUDA_SUCCESS);
    memset(reinterpret_cast<void*>(p), i, kMiB);       // fake device memory is host memory
    ASSERT_EQ(api_.cuCtxSynchronize(), CUDA_SUCCESS);  // the application waits for its work
    ASSERT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  }
  if (Pooled()) {
    EXPECT_LE(DriverAllocs() - before, 2u);
  } else {
    EXPECT_EQ(DriverAllocs() - before, 100u);
  }
}

// Work queued before a free may still read the block: it is not handed out again until a
// synchronisation covers that work. The pool may synchronise on its own to reuse it; with
// blocking synchronisation on, that synchronisation really waits:
//
//   main                              worker
//   alloc a, record event (pending)
//   free a
//                                     alloc b: either elsewhere (no wait), or the shim
//                                     synchronises first and blocks
//   sees the sync call arrive
//   completes the event       ---->   sync returns, b may reuse a: no event pending any more
TEST_F(ShimTest, FreedBlockIsNotReusedWhileItsFenceIsPending) {
  if (!Pooled()) GTEST_SKIP() << "passthrough: the driver's own free";
  vramscope_fake_set_manual_events(1);
  CUstream stream = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUevent work = nullptr;
  ASSERT_EQ(api_.cuEventCreate(&work, 0), CUDA_SUCCESS);
  // The stream's first work ends ordered reuse (interposer/shim/ordered.h, pool mode), which
  // marks that point with an event of its own: let it complete first.
  ASSERT_EQ(api_.cuEventRecord(work, stream), CUDA_SUCCESS);
  vramscope_fake_complete_all_events();
  CUdeviceptr a = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&a, 4 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuEventRecord(work, stream), CUDA_SUCCESS);  // "a kernel using a", in flight
  ASSERT_EQ(vramscope_fake_pending_events(), 1);
  const std::uint64_t syncs = Syncs();
  ASSERT_EQ(api_.cuMemFree_v2(a), CUDA_SUCCESS);
  CUdeviceptr b = 0;
  if (Strict()) {
    // strict: the free waited for the device, like the driver's; a is reusable at once.
    EXPECT_EQ(Syncs() - syncs, 1u);
    EXPECT_EQ(vramscope_fake_pending_events(), 0);
    const std::uint64_t allocs = DriverAllocs();
    ASSERT_EQ(api_.cuMemAlloc_v2(&b, 4 * kMiB), CUDA_SUCCESS);
    EXPECT_EQ(DriverAllocs(), allocs);
  } else {
    EXPECT_EQ(Syncs(), syncs);  // no synchronisation per free
    EXPECT_EQ(vramscope_fake_pending_events(), 1);
    vramscope_fake_set_blocking_sync(1);
    std::atomic<bool> done{false};
    int pending_at_return = -1;
    std::thread worker([&] {
      EXPECT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
      EXPECT_EQ(api_.cuMemAlloc_v2(&b, 4 * kMiB), CUDA_SUCCESS);
      pending_at_return = vramscope_fake_pending_events();
      done = true;
    });
    while (!done) {
      if (Syncs() != syncs) vramscope_fake_complete_all_events();
      std::this_thread::yield();
    }
    worker.join();
    vramscope_fake_set_blocking_sync(0);
    const bool overlaps = !(b + 4 * kMiB <= a || a + 4 * kMiB <= b);
    if (overlaps) {
      EXPECT_EQ(pending_at_return, 0) << "a was reused while its fence was pending";
    }
    // The application's own synchronisation completes any fence: a (if b did not take it) is
    // reusable without a driver call.
    vramscope_fake_complete_all_events();
    ASSERT_EQ(api_.cuCtxSynchronize(), CUDA_SUCCESS);
    const std::uint64_t allocs = DriverAllocs();
    CUdeviceptr c = 0;
    ASSERT_EQ(api_.cuMemAlloc_v2(&c, 4 * kMiB), CUDA_SUCCESS);
    if (!overlaps) {
      EXPECT_EQ(DriverAllocs(), allocs);
    }
    EXPECT_EQ(api_.cuMemFree_v2(c), CUDA_SUCCESS);
  }
  EXPECT_EQ(api_.cuMemFree_v2(b), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuEventDestroy_v2(work), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamDestroy_v2(stream), CUDA_SUCCESS);
}

// Blocking synchronisation: the shim's wait really waits for queued work to finish.
//
//   main                         worker
//   record event (pending)
//                                cuMemFree_v2(a) -> shim's cuCtxSynchronize blocks
//   sees the sync call arrive
//   completes the event   ---->  sync returns, free returns: no event pending any more
// cudaDeviceSynchronize of a CUDA 13 runtime calls cuCtxSynchronize_v2(ctx) (fetched at 13000):
// it waits for the whole context as well, so it completes every fence issued before it and the
// freed block is reused at once, without a synchronisation of the shim's own.
TEST_F(ShimTest, ContextSynchronizeV2CompletesFences) {
  if (!Pooled() || Strict()) GTEST_SKIP() << "pool mode only: its frees leave fences pending";
  using SyncV2 = CUresult (*)(CUcontext);
  const auto sync_v2 = reinterpret_cast<SyncV2>(dlsym(RTLD_DEFAULT, "cuCtxSynchronize_v2"));
  ASSERT_NE(sync_v2, nullptr);
  ASSERT_NE(ModuleOf(reinterpret_cast<void*>(sync_v2)).find("libvramscope"), std::string::npos);
  vramscope_fake_set_manual_events(1);
  CUstream stream = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUevent work = nullptr;
  ASSERT_EQ(api_.cuEventCreate(&work, 0), CUDA_SUCCESS);
  CUdeviceptr a = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&a, 3 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuEventRecord(work, stream), CUDA_SUCCESS);  // work on a, in flight
  ASSERT_EQ(api_.cuMemFree_v2(a), CUDA_SUCCESS);
  vramscope_fake_complete_all_events();  // the work finishes; the application then waits
  const std::uint64_t shim_syncs = Syncs();
  ASSERT_EQ(sync_v2(ctx_), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_call_count("cuCtxSynchronize_v2"), 1u);
  EXPECT_EQ(sync_v2(reinterpret_cast<CUcontext>(0x1)), CUDA_ERROR_INVALID_CONTEXT);
  const std::uint64_t allocs = DriverAllocs();
  CUdeviceptr b = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&b, 3 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(b, a);  // the fence was completed by the application's synchronisation
  EXPECT_EQ(DriverAllocs(), allocs);
  EXPECT_EQ(Syncs(), shim_syncs);
  EXPECT_EQ(api_.cuMemFree_v2(b), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuEventDestroy_v2(work), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamDestroy_v2(stream), CUDA_SUCCESS);
}

TEST_F(ShimTest, FenceWaitBlocksUntilQueuedWorkCompletes) {
  if (!Strict()) GTEST_SKIP() << "strict mode synchronises on every free";
  vramscope_fake_set_manual_events(1);
  vramscope_fake_set_blocking_sync(1);
  CUstream stream = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUevent work = nullptr;
  ASSERT_EQ(api_.cuEventCreate(&work, 0), CUDA_SUCCESS);
  CUdeviceptr a = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&a, kMiB), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuEventRecord(work, stream), CUDA_SUCCESS);
  const std::uint64_t syncs = Syncs();
  std::atomic<int> pending_after_free{-1};
  std::thread worker([&] {
    EXPECT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuMemFree_v2(a), CUDA_SUCCESS);
    pending_after_free = vramscope_fake_pending_events();
  });
  while (Syncs() == syncs) std::this_thread::yield();
  EXPECT_EQ(pending_after_free.load(), -1);
  EXPECT_EQ(vramscope_fake_complete_all_events(), 1);
  worker.join();
  EXPECT_EQ(pending_after_free.load(), 0);
  vramscope_fake_set_blocking_sync(0);
  EXPECT_EQ(api_.cuEventDestroy_v2(work), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamDestroy_v2(stream), CUDA_SUCCESS);
}

// Pool mode synchronises once per batch of frees, not once per free.
TEST_F(ShimTest, FenceSynchronisationIsAmortised) {
  if (EventFences()) GTEST_SKIP() << "device-synchronisation rule (shim_pool_devsync)";
  const std::uint64_t syncs = Syncs();
  const std::uint64_t allocs = DriverAllocs();
  constexpr int kFrees = 1100;  // just over one batch (VRAMSCOPE_FENCE_BATCH_FREES=1024)
  for (int i = 0; i < kFrees; ++i) {
    CUdeviceptr p = 0;
    ASSERT_EQ(api_.cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  }
  if (Strict()) {
    EXPECT_EQ(Syncs() - syncs, static_cast<std::uint64_t>(kFrees));
  } else if (Pooled()) {
    // The free that fills the batch asks the shim's fence thread, which synchronises soon after.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (Syncs() == syncs && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    EXPECT_GE(Syncs() - syncs, 1u);
    EXPECT_LE(Syncs() - syncs, 2u);
    EXPECT_LT(DriverAllocs() - allocs, static_cast<std::uint64_t>(kFrees));
  } else {
    EXPECT_EQ(Syncs(), syncs);
    EXPECT_EQ(DriverAllocs() - allocs, static_cast<std::uint64_t>(kFrees));
  }
}

// The fence helper watches for requests (VRAMSCOPE_FENCE_SPIN_US, 50 us) after each
// synchronisation, then sleeps; a request made just as it switches must not be lost (a lost one
// leaves the pool's request flag set, and no later free would ever reach the helper). Four
// threads free in bursts with pauses around the watch window. Then, after a synchronisation of
// the test's own (which resets the batch counts), 700 frees of 4 KiB: past half the reuse
// threshold (2 MiB pending, so the helper is asked) but short of every inline synchronisation
// (the full 4 MiB, or four batches of frees), so only the helper can synchronise.
TEST_F(ShimTest, FenceHelperLosesNoRequestAcrossItsWatchWindow) {
  if (!Pooled() || Strict()) GTEST_SKIP() << "pool mode only";
  if (EventFences()) GTEST_SKIP() << "device-synchronisation rule (shim_pool_devsync)";
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      if (api_.cuCtxSetCurrent(ctx_) != CUDA_SUCCESS) {
        failed = true;
        return;
      }
      std::mt19937 rng(static_cast<unsigned>(t));
      for (int round = 0; round < 60 && !failed; ++round) {
        for (int i = 0; i < 300; ++i) {
          CUdeviceptr p = 0;
          if (api_.cuMemAlloc_v2(&p, 4096) != CUDA_SUCCESS ||
              api_.cuMemFree_v2(p) != CUDA_SUCCESS) {
            failed = true;
            return;
          }
        }
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 120));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_FALSE(failed);
  ASSERT_EQ(api_.cuCtxSynchronize(), CUDA_SUCCESS);
  const std::uint64_t before = Syncs();
  for (int i = 0; i < 700; ++i) {
    CUdeviceptr p = 0;
    ASSERT_EQ(api_.cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (Syncs() == before && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GE(Syncs() - before, 1u) << "the request never reached the fence helper";
}

// thrust's sort + reduce loop at 1 Mi keys: a 4.15 MiB temporary and a 41.5 KiB one, each
// allocated and freed every iteration (sizes seen on the H200 with `vramscope run --stacks`).
// Half the small request's reuse threshold (10.6 MB) is pending after two large frees; a reuse
// synchronisation also waits for as many frees as a quarter of that threshold holds small
// blocks (64), so the loop asks the helper every few dozen iterations, not every second one
// (on the H200: 246-249 synchronisations per 500 iterations before that rule, 16 after).
// Over the fake driver: 12 synchronisations with that rule, 100 without it (measured with the
// rule's few-frees test disabled). Ordered reuse serves this one-stream loop without any fence
// and event fences never ask for a synchronisation here, so the check runs in shim_pool_sync
// (VRAMSCOPE_ORDERED=0), where it can fail.
TEST_F(ShimTest, SmallRequestsBetweenLargeFreesDoNotSynchroniseEveryIteration) {
  if (!Pooled() || Strict()) GTEST_SKIP() << "pool mode only";
  const char* ordered = getenv("VRAMSCOPE_ORDERED");
  if (EventFences() || ordered == nullptr || std::string_view(ordered) != "0") {
    GTEST_SKIP() << "no reuse synchronisation to count with ordered reuse or event fences on: "
                    "see the shim_pool_sync run";
  }
  ASSERT_EQ(api_.cuCtxSynchronize(), CUDA_SUCCESS);
  const std::uint64_t before = Syncs();
  constexpr int kIterations = 200;
  for (int i = 0; i < kIterations; ++i) {
    CUdeviceptr large = 0;
    CUdeviceptr small = 0;
    ASSERT_EQ(api_.cuMemAlloc_v2(&large, 4351590), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuMemFree_v2(large), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuMemAlloc_v2(&small, 42496), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuMemFree_v2(small), CUDA_SUCCESS);
    // The GPU keeps up: the helper has served whatever this iteration asked before the next
    // one, so the count below is the requests the rule made, however fast this machine is.
    ASSERT_TRUE(WaitUntilOtherThreadsSleep()) << "the fence helper never went back to sleep";
  }
  EXPECT_LT(Syncs() - before, static_cast<std::uint64_t>(kIterations / 8))
      << "synchronisations in " << kIterations << " iterations";
}

TEST_F(ShimTest, OutOfMemoryFlushesTheCacheAndRetries) {
  ASSERT_EQ(vramscope_fake_set_capacity(0, 64 * kMiB), 0);
  CUdeviceptr a = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&a, 40 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemFree_v2(a), CUDA_SUCCESS);  // cached (and its fence pending) in pool mode
  CUdeviceptr b = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&b, 48 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemFree_v2(b), CUDA_SUCCESS);
  // A passthrough kind: the driver's OOM makes the shim give its idle memory back.
  CUdeviceptr pitched = 0;
  size_t pitch = 0;
  ASSERT_EQ(api_.cuMemAllocPitch_v2(&pitched, &pitch, 4096, 12 * 1024, 4), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(pitched), CUDA_SUCCESS);
  // Beyond capacity: the driver's error.
  EXPECT_EQ(api_.cuMemAlloc_v2(&b, 65 * kMiB), CUDA_ERROR_OUT_OF_MEMORY);
}

// Graph memory and arrays are passthrough kinds too: when the driver runs out of memory mapping a
// graph's memory or making an array while the pool holds idle memory, the shim gives it back and
// the call is retried.
TEST_F(ShimTest, GraphAndArrayOutOfMemoryFlushesTheCacheAndRetries) {
  ASSERT_EQ(vramscope_fake_set_capacity(0, 64 * kMiB), 0);
  CUdeviceptr a = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&a, 40 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemFree_v2(a), CUDA_SUCCESS);  // cached (and its fence pending) in pool mode
  CUgraph graph = nullptr;
  ASSERT_EQ(cuGraphCreate(&graph, 0), CUDA_SUCCESS);
  CUgraphNode node = nullptr;
  CUDA_MEM_ALLOC_NODE_PARAMS params{};
  params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  params.bytesize = 40 * kMiB;
  ASSERT_EQ(cuGraphAddMemAllocNode(&node, graph, nullptr, 0, &params), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  EXPECT_EQ(cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_graph_reserved_bytes(0), 40 * kMiB);
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemAlloc_v2(&a, 40 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemFree_v2(a), CUDA_SUCCESS);
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  desc.Width = 2560;  // 2560 x 1024 x 4 floats: 40 MiB
  desc.Height = 1024;
  desc.Depth = 4;
  desc.Format = CU_AD_FORMAT_FLOAT;
  desc.NumChannels = 1;
  CUarray array = nullptr;
  EXPECT_EQ(cuArray3DCreate_v2(&array, &desc), CUDA_SUCCESS);
  EXPECT_EQ(cuArrayDestroy(array), CUDA_SUCCESS);
  // Beyond capacity: the driver's error.
  desc.Depth = 8;
  EXPECT_EQ(cuArray3DCreate_v2(&array, &desc), CUDA_ERROR_OUT_OF_MEMORY);
}

TEST_F(ShimTest, ForkChildStartsClean) {
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, kMiB), CUDA_SUCCESS);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The driver refuses every call in the child of an initialised process; so must the shim
    // (no pool survives the fork to serve or free anything).
    CUdeviceptr q = 0;
    int failures = 0;
    if (api_.cuMemAlloc_v2(&q, kMiB) != CUDA_ERROR_NOT_INITIALIZED) failures |= 1;
    if (api_.cuMemFree_v2(p) != CUDA_ERROR_NOT_INITIALIZED) failures |= 2;
    size_t free = 0;
    size_t total = 0;
    if (api_.cuMemGetInfo_v2(&free, &total) != CUDA_ERROR_NOT_INITIALIZED) failures |= 4;
    _exit(failures);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);  // the parent's pool is intact
}

// Several threads allocate, write, check and free concurrently; a block handed to two owners
// at once would show up as a corrupted pattern.
TEST_F(ShimTest, ManyThreads) {
  constexpr int kThreads = 8;
  // The fake driver is slow to allocate (host memory, one mutex): fewer rounds without the pool.
  const int kIterations = Pooled() ? 1500 : 200;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (api_.cuCtxSetCurrent(ctx_) != CUDA_SUCCESS) failures++;
      std::mt19937 rng(t);
      std::vector<std::pair<CUdeviceptr, size_t>> live;
      for (int i = 0; i < kIterations; ++i) {
        const size_t size = 1 + rng() % (256 * 1024);
        CUdeviceptr p = 0;
        if (api_.cuMemAlloc_v2(&p, size) != CUDA_SUCCESS) {
          failures++;
          continue;
        }
        memset(reinterpret_cast<void*>(p), t + 1, size);
        live.emplace_back(p, size);
        if (live.size() > 8 || i == kIterations - 1) {
          while (!live.empty()) {
            auto [q, n] = live.back();
            live.pop_back();
            const auto* bytes = reinterpret_cast<const unsigned char*>(q);
            if (bytes[0] != t + 1 || bytes[n / 2] != t + 1 || bytes[n - 1] != t + 1) failures++;
            if (api_.cuMemFree_v2(q) != CUDA_SUCCESS) failures++;
          }
        }
      }
      (void)api_.cuCtxSetCurrent(nullptr);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

// Frees are routed by address, whatever the calling thread's current device (or none).
TEST_F(ShimTest, TwoDevicesFreeFromAnotherThread) {
  CUcontext ctx1 = nullptr;
  ASSERT_EQ(api_.cuDevicePrimaryCtxRetain(&ctx1, 1), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuCtxPushCurrent_v2(ctx1), CUDA_SUCCESS);
  CUdeviceptr on1 = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&on1, 3 * kMiB), CUDA_SUCCESS);
  int ordinal = -1;
  EXPECT_EQ(api_.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, on1),
            CUDA_SUCCESS);
  EXPECT_EQ(ordinal, 1);
  CUcontext popped = nullptr;
  ASSERT_EQ(api_.cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);
  CUdeviceptr on0 = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&on0, 3 * kMiB), CUDA_SUCCESS);
  CUresult free_on1 = CUDA_ERROR_UNKNOWN;
  CUresult free_on0 = CUDA_ERROR_UNKNOWN;
  std::thread device0([&] {
    (void)api_.cuCtxSetCurrent(ctx_);
    free_on1 = api_.cuMemFree_v2(on1);
  });
  device0.join();
  std::thread no_context([&] { free_on0 = api_.cuMemFree_v2(on0); });
  no_context.join();
  EXPECT_EQ(free_on1, CUDA_SUCCESS);
  EXPECT_EQ(free_on0, CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(on1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
}

TEST_F(ShimTest, NoContextAllocationIsTheDriversError) {
  CUresult result = CUDA_SUCCESS;
  std::thread t([&] {
    CUdeviceptr p = 0;
    result = api_.cuMemAlloc_v2(&p, kMiB);
  });
  t.join();
  EXPECT_EQ(result, CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(ShimTest, BadFreesAreInvalidValue) {
  static int not_device_memory;
  EXPECT_EQ(api_.cuMemFree_v2(reinterpret_cast<CUdeviceptr>(&not_device_memory)),
            CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, kMiB), CUDA_SUCCESS);
  CUdeviceptr keep = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&keep, kMiB), CUDA_SUCCESS);  // keeps the pool's memory alive
  EXPECT_EQ(api_.cuMemFree_v2(p + 256), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);  // double free
  EXPECT_EQ(api_.cuMemFree_v2(keep), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(0), CUDA_SUCCESS);
}

// The shim's own driver calls (pool growth, the fence synchronisation) during a global capture
// must not invalidate it; the application allocates in relaxed mode, as PyTorch does.
TEST_F(ShimTest, CaptureIsNotInvalidatedByTheShim) {
  CUstream stream = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  std::thread other([&] {
    // Another thread, relaxed: grows the pool and frees enough to want a synchronisation.
    (void)api_.cuCtxSetCurrent(ctx_);
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    EXPECT_EQ(api_.cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
    for (int i = 0; i < 300; ++i) {
      CUdeviceptr p = 0;
      EXPECT_EQ(api_.cuMemAlloc_v2(&p, (i % 7 + 1) * kMiB / 4), CUDA_SUCCESS);
      EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
    }
    EXPECT_EQ(api_.cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
  });
  other.join();
  EXPECT_EQ(vramscope_fake_invalidated_captures(), 0);
  CUgraph graph = nullptr;
  EXPECT_EQ(api_.cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
  EXPECT_NE(graph, nullptr);
  if (graph != nullptr) {
    EXPECT_EQ(api_.cuGraphDestroy(graph), CUDA_SUCCESS);
  }
  EXPECT_EQ(api_.cuStreamDestroy_v2(stream), CUDA_SUCCESS);
}

// A prohibited allocation during a global capture keeps the driver's answer.
TEST_F(ShimTest, ProhibitedAllocationDuringCaptureIsTheDriversError) {
  CUstream stream = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  EXPECT_EQ(api_.cuMemAlloc_v2(&p, kMiB), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph graph = nullptr;
  EXPECT_EQ(api_.cuStreamEndCapture(stream, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(api_.cuStreamDestroy_v2(stream), CUDA_SUCCESS);
}

TEST_F(ShimTest, MemGetInfoCountsIdleCacheAsFree) {
  size_t free0 = 0;
  size_t total = 0;
  ASSERT_EQ(api_.cuMemGetInfo_v2(&free0, &total), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, 64 * kMiB), CUDA_SUCCESS);
  size_t free1 = 0;
  ASSERT_EQ(api_.cuMemGetInfo_v2(&free1, &total), CUDA_SUCCESS);
  EXPECT_LE(free1, free0 - 64 * kMiB);
  ASSERT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  size_t free2 = 0;
  ASSERT_EQ(api_.cuMemGetInfo_v2(&free2, &total), CUDA_SUCCESS);
  EXPECT_EQ(free2, free0);
  if (Pooled()) {
    EXPECT_GE(vramscope_fake_live_bytes(0), 64 * kMiB);  // still held by the pool
  } else {
    EXPECT_EQ(vramscope_fake_live_bytes(0), 0u);
  }
}

// Address-range queries describe the application's allocation, not the pool's segment.
TEST_F(ShimTest, AddressRangeDescribesTheBlock) {
  CUdeviceptr small = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&small, 1000), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, 3000), CUDA_SUCCESS);
  CUdeviceptr base = 0;
  size_t size = 0;
  EXPECT_EQ(api_.cuMemGetAddressRange_v2(&base, &size, p + 100), CUDA_SUCCESS);
  EXPECT_EQ(base, p);
  EXPECT_EQ(size, 3000u);
  CUpointer_attribute attributes[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                      CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  CUdeviceptr start = 0;
  size_t range = 0;
  int ordinal = -1;
  void* data[] = {&start, &range, &ordinal};
  EXPECT_EQ(api_.cuPointerGetAttributes(3, attributes, data, p + 10), CUDA_SUCCESS);
  EXPECT_EQ(start, p);
  EXPECT_EQ(range, 3000u);
  EXPECT_EQ(ordinal, 0);
  start = 0;
  EXPECT_EQ(api_.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 10),
            CUDA_SUCCESS);
  EXPECT_EQ(start, p);
  EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(small), CUDA_SUCCESS);
}

// An IPC handle of pooled memory resolves to the very same block: at the same address (a legacy
// handle of a block that starts its cuMemAlloc segment), or, for a VMM pool, a vramscope handle
// opened (here in the exporting process itself) at a second mapping of the block's bytes.
// Never another block's memory. Cross-process IPC: ipc_test.cc.
TEST_F(ShimTest, IpcOfPooledMemoryNeverResolvesElsewhere) {
  CUdeviceptr first = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&first, 1000), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, 1000), CUDA_SUCCESS);
  for (CUdeviceptr q : {first, p}) {
    memset(reinterpret_cast<void*>(q), q == first ? 0x11 : 0x22, 1000);
    CUipcMemHandle handle{};
    const CUresult result = api_.cuIpcGetMemHandle(&handle, q);
    ASSERT_EQ(result, CUDA_SUCCESS);
    CUdeviceptr opened = 0;
    ASSERT_EQ(api_.cuIpcOpenMemHandle_v2(&opened, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
              CUDA_SUCCESS);
    if (!Pooled()) {
      EXPECT_EQ(opened, q);
    }
    const auto* bytes = reinterpret_cast<const unsigned char*>(opened);
    EXPECT_EQ(bytes[0], q == first ? 0x11 : 0x22);
    EXPECT_EQ(bytes[999], q == first ? 0x11 : 0x22);
    EXPECT_EQ(api_.cuIpcCloseMemHandle(opened), CUDA_SUCCESS);
  }
  EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(first), CUDA_SUCCESS);
}

TEST_F(ShimTest, ContextResetDropsThePool) {
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, 8 * kMiB), CUDA_SUCCESS);
  CUdeviceptr q = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&q, 8 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemFree_v2(q), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuDevicePrimaryCtxReset_v2(0), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_live_bytes(0), 0u);
  EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);  // gone with the context
  // The context stays usable; pooling starts again with fresh memory.
  const std::uint64_t allocs = DriverAllocs();
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, 8 * kMiB), CUDA_SUCCESS);
  EXPECT_GT(DriverAllocs(), allocs);
  memset(reinterpret_cast<void*>(p), 1, 8 * kMiB);
  EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
}

TEST_F(ShimTest, DlsymKeepsTheCallersScope) {
  // RTLD_NEXT from this executable: the next object is the preloaded shim itself. Resolved
  // relative to the shim instead, it would be the driver's function.
  void* next = dlsym(RTLD_NEXT, "cuMemAlloc_v2");
  EXPECT_NE(ModuleOf(next).find("libvramscope"), std::string::npos) << ModuleOf(next);
  void* next_dlsym = dlsym(RTLD_NEXT, "dlsym");
  EXPECT_NE(ModuleOf(next_dlsym).find("libvramscope"), std::string::npos);
  void* by_default = dlsym(RTLD_DEFAULT, "cuMemFree_v2");
  EXPECT_NE(ModuleOf(by_default).find("libvramscope"), std::string::npos);
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr);
  // Hooked: the shim's wrapper. Not hooked: the driver's own function, unchanged.
  EXPECT_NE(ModuleOf(dlsym(handle, "cuMemAlloc_v2")).find("libvramscope"), std::string::npos);
  EXPECT_NE(ModuleOf(dlsym(handle, "cuDeviceGetName")).find("libcuda.so.1"), std::string::npos);
  EXPECT_EQ(dlsym(handle, "cuNoSuchFunction"), nullptr);
  EXPECT_NE(ModuleOf(dlsym(handle, "vramscope_fake_reset")).find("libcuda.so.1"),
            std::string::npos);
  dlclose(handle);
}

}  // namespace
}  // namespace vramscope::fake
