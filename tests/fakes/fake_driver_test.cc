// Tests of the fake driver itself: the behaviour it promises in fake_state.h / the .cc file
// comments and the control API of fake_cuda_control.h. Links the fake directly and resets it
// before every test.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "fake_cuda_control.h"
#include "fake_cuda_decls.h"
#include "routes.h"

namespace vramscope::fake {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

void* Sym(const char* exact) { return dlsym(RTLD_DEFAULT, exact); }

template <typename F>
void* ToVoid(F f) {
  void* p;
  memcpy(&p, &f, sizeof(p));
  return p;
}

class FakeDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    vramscope_fake_reset();
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  }
  void TearDown() override { vramscope_fake_reset(); }

  CUcontext ctx_ = nullptr;
};

TEST(FakeDriverInit, CallsBeforeCuInitAreRejected) {
  vramscope_fake_reset();
  int n = 0;
  EXPECT_EQ(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc_v2(&p, 1), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(cuMemFree_v2(0), CUDA_ERROR_NOT_INITIALIZED);
  // These work before cuInit, as the runtime relies on.
  EXPECT_EQ(cuDriverGetVersion(&n), CUDA_SUCCESS);
  EXPECT_EQ(n, 13000);
  void* fn = nullptr;
  EXPECT_EQ(cuGetProcAddress_v2("cuInit", &fn, 12000, 0, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(fn, Sym("cuInit"));
  EXPECT_EQ(cuInit(1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuInit(0), CUDA_SUCCESS);
  EXPECT_EQ(cuDeviceGetCount(&n), CUDA_SUCCESS);
  EXPECT_EQ(n, 2);
  vramscope_fake_reset();
}

TEST_F(FakeDriverTest, CountsCallsPerExactName) {
  EXPECT_EQ(vramscope_fake_call_count("cuInit"), 1u);
  CUdeviceptr p[3];
  for (CUdeviceptr& q : p) ASSERT_EQ(cuMemAlloc_v2(&q, kMiB), CUDA_SUCCESS);
  for (CUdeviceptr q : p) ASSERT_EQ(cuMemFree_v2(q), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_call_count("cuMemAlloc_v2"), 3u);
  EXPECT_EQ(vramscope_fake_call_count("cuMemFree_v2"), 3u);
  EXPECT_EQ(vramscope_fake_call_count("cuMemAlloc"), 0u);
  EXPECT_EQ(vramscope_fake_call_count("nonsense"), 0u);
  EXPECT_EQ(cuStreamSynchronize_ptsz(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_call_count("cuStreamSynchronize_ptsz"), 1u);
  EXPECT_EQ(vramscope_fake_call_count("cuStreamSynchronize"), 0u);
  // cuInit, retain, set current, 3 + 3, 1 sync.
  EXPECT_EQ(vramscope_fake_total_calls(), 10u);
}

TEST_F(FakeDriverTest, LiveCountersFollowAllocations) {
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 3 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_live_bytes(0), 3 * kMiB);
  EXPECT_EQ(vramscope_fake_live_allocations(0), 1);
  EXPECT_EQ(vramscope_fake_live_allocations(1), 0);
  void* h = nullptr;
  ASSERT_EQ(cuMemHostAlloc(&h, kMiB, 0), CUDA_SUCCESS);
  CUdeviceptr m = 0;
  ASSERT_EQ(cuMemAllocManaged(&m, kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_live_host_allocations(), 2);
  EXPECT_EQ(vramscope_fake_live_bytes(0), 3 * kMiB);  // host and managed are not charged
  EXPECT_EQ(cuMemFreeHost(h), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(m), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_live_bytes(0), 0u);
  EXPECT_EQ(vramscope_fake_live_allocations(0), 0);
  EXPECT_EQ(vramscope_fake_live_host_allocations(), 0);
  EXPECT_EQ(vramscope_fake_live_bytes(16), static_cast<size_t>(-1));  // past the 16 devices
}

TEST_F(FakeDriverTest, CapacityIsSettable) {
  ASSERT_EQ(vramscope_fake_set_capacity(0, 8 * kMiB), 0);
  size_t free = 0;
  size_t total = 0;
  ASSERT_EQ(cuMemGetInfo_v2(&free, &total), CUDA_SUCCESS);
  EXPECT_EQ(total, 8 * kMiB);
  EXPECT_EQ(free, 8 * kMiB);
  CUdeviceptr p = 0;
  CUdeviceptr q = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 6 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc_v2(&q, 3 * kMiB), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_EQ(cuMemGetInfo_v2(&free, &total), CUDA_SUCCESS);
  EXPECT_EQ(free, 2 * kMiB);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_set_capacity(16, kMiB), -1);  // past the 16 devices
}

TEST_F(FakeDriverTest, ProcAddressSelectsVersionAndStreamFlavour) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
  // The runtime's probe.
  EXPECT_EQ(cuGetProcAddress_v2("", &fn, 0, 0, &st), CUDA_SUCCESS);
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(vramscope_fake_lookup_count(""), 1u);

  struct Case {
    const char* symbol;
    int version;
    cuuint64_t flags;
    const char* exact;
  };
  const Case cases[] = {
      {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"},
      {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
      {"cuGetProcAddress", 13000, 0, "cuGetProcAddress_v2"},
      {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2"},
      {"cuMemAlloc", 12000, 2, "cuMemAlloc_v2"},  // no per-thread variant: the legacy one
      {"cuMemAllocAsync", 11020, 0, "cuMemAllocAsync"},
      {"cuMemAllocAsync", 11020, 1, "cuMemAllocAsync"},
      {"cuMemAllocAsync", 12000, 2, "cuMemAllocAsync_ptsz"},
      {"cuMemFreeAsync", 12000, 2, "cuMemFreeAsync_ptsz"},
      {"cuMemAllocFromPoolAsync", 12000, 2, "cuMemAllocFromPoolAsync_ptsz"},
      {"cuStreamSynchronize", 12000, 2, "cuStreamSynchronize_ptsz"},
      {"cuStreamQuery", 12000, 2, "cuStreamQuery_ptsz"},
      {"cuEventRecord", 12000, 2, "cuEventRecord_ptsz"},
      {"cuStreamIsCapturing", 12000, 2, "cuStreamIsCapturing_ptsz"},
      {"cuStreamGetCaptureInfo", 12030, 2, "cuStreamGetCaptureInfo_v3_ptsz"},
      {"cuStreamGetCaptureInfo", 13000, 0, "cuStreamGetCaptureInfo_v3"},
      {"cuStreamBeginCapture", 12000, 2, "cuStreamBeginCapture_v2_ptsz"},
      {"cuMemcpyHtoD", 12000, 2, "cuMemcpyHtoD_v2_ptds"},
      {"cuMemcpyHtoD", 12000, 0, "cuMemcpyHtoD_v2"},
      {"cuDeviceGetUuid", 11030, 0, "cuDeviceGetUuid"},
      {"cuDeviceGetUuid", 11040, 0, "cuDeviceGetUuid_v2"},
      {"cuDevicePrimaryCtxRelease", 10000, 0, "cuDevicePrimaryCtxRelease"},
      {"cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2"},
      {"cuEventElapsedTime", 12000, 0, "cuEventElapsedTime"},
      {"cuEventElapsedTime", 12080, 0, "cuEventElapsedTime_v2"},
      {"cuIpcOpenMemHandle", 11000, 0, "cuIpcOpenMemHandle_v2"},
      {"cuStreamBeginCapture", 10000, 0, "cuStreamBeginCapture"},
      {"cuStreamBeginCapture", 10000, 2, "cuStreamBeginCapture_ptsz"},
      {"cuStreamGetCaptureInfo", 10010, 2, "cuStreamGetCaptureInfo_ptsz"},
      {"cuStreamGetCaptureInfo", 12000, 0, "cuStreamGetCaptureInfo_v2"},
      {"cuStreamGetCaptureInfo", 12000, 2, "cuStreamGetCaptureInfo_v2_ptsz"},
      {"cuCtxCreate", 11000, 0, "cuCtxCreate_v2"},
      {"cuCtxCreate", 12000, 0, "cuCtxCreate_v3"},
      {"cuCtxCreate", 12050, 0, "cuCtxCreate_v4"},
  };
  for (const Case& c : cases) {
    fn = nullptr;
    st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    EXPECT_EQ(cuGetProcAddress_v2(c.symbol, &fn, c.version, c.flags, &st), CUDA_SUCCESS)
        << c.symbol;
    EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SUCCESS) << c.symbol;
    EXPECT_EQ(fn, Sym(c.exact)) << c.symbol << " v" << c.version << " flags " << c.flags
                                << " should be " << c.exact;
    // The 4-argument ABI serves the same table.
    void* fn4 = nullptr;
    EXPECT_EQ(vramscope_fake_cuGetProcAddress_v11030(c.symbol, &fn4, c.version, c.flags),
              CUDA_SUCCESS);
    EXPECT_EQ(fn4, fn) << c.symbol;
  }
  EXPECT_EQ(vramscope_fake_lookup_count("cuGetProcAddress"), 6u);

  // Known symbol, version too old for any variant the fake implements.
  EXPECT_EQ(cuGetProcAddress_v2("cuMemAlloc", &fn, 3010, 0, &st), CUDA_SUCCESS);
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  // Invalid arguments.
  EXPECT_EQ(cuGetProcAddress_v2("cuMemAlloc", &fn, 13010, 0, &st), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuGetProcAddress_v2("cuMemAlloc", &fn, 12000, 4, &st), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuGetProcAddress_v2("cuMemAlloc", nullptr, 12000, 0, &st), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuGetProcAddress_v2(nullptr, &fn, 12000, 0, &st), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(FakeDriverTest, EveryRouteYieldsTheSamePointers) {
  DriverApi direct;
  DriverApi by_dlsym;
  DriverApi by_gpa;
  std::string error;
  ASSERT_TRUE(LoadDirect(&direct, &error)) << error;
  ASSERT_TRUE(LoadByDlsym(&by_dlsym, &error)) << error;
  ASSERT_TRUE(LoadByProcAddress(&by_gpa, &error)) << error;
  for (const EntryPoint& e : EntryPoints()) {
    void* expected = Sym(e.exported);
    ASSERT_NE(expected, nullptr) << e.exported;
    EXPECT_EQ(Get(by_dlsym, e), expected) << e.member;
    EXPECT_EQ(Get(by_gpa, e), expected) << e.member;
    EXPECT_NE(ModuleOf(Get(direct, e)), "") << e.member;
  }
  // Asked at the runtime's own version, every entry that no newer ABI superseded is the same.
  for (const EntryPoint& e : EntryPoints()) {
    if (strcmp(e.member, "cuGetProcAddress_v11030") == 0 ||
        strcmp(e.member, "cuCtxSynchronize") == 0 ||           // cuCtxSynchronize_v2 at 13000
        strcmp(e.member, "cuGraphAddNode_v12020") == 0 ||      // cuGraphAddNode_v2 at 12030
        strcmp(e.member, "cuGraphInstantiate_v10000") == 0 ||  // cuGraphInstantiate_v2 at 11000
        strncmp(e.member, "cuStreamGetCaptureInfo_v2", 25) == 0) {
      continue;
    }
    void* fn = nullptr;
    cuuint64_t flags = e.per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
    EXPECT_EQ(cuGetProcAddress_v2(e.symbol, &fn, 13000, flags, nullptr), CUDA_SUCCESS);
    EXPECT_EQ(fn, Sym(e.exported)) << e.member;
  }
  // LoadByProcAddress: the probe, cuGetProcAddress twice, one lookup per other entry; then the
  // loop above: one lookup per entry not skipped (cuGetProcAddress_v11030, cuCtxSynchronize, the
  // two superseded graph ABIs and the cuStreamGetCaptureInfo_v2 pair).
  const size_t n = EntryPoints().size();
  EXPECT_EQ(vramscope_fake_lookup_count(""), 1u);
  EXPECT_EQ(vramscope_fake_lookup_count("cuGetProcAddress"), 2u + 1u);
  EXPECT_EQ(vramscope_fake_lookup_count("cuMemAllocAsync"), 2u + 2u);  // legacy + ptsz, twice
  EXPECT_EQ(vramscope_fake_call_count("cuGetProcAddress_v2"), (1 + 2 + (n - 2)) + (n - 6));
}

TEST_F(FakeDriverTest, ControlApiIsReachableByDlsym) {
  FakeControl control;
  std::string error;
  ASSERT_TRUE(LoadFakeControl(&control, &error)) << error;
  EXPECT_EQ(ToVoid(control.call_count), ToVoid(&vramscope_fake_call_count));
  EXPECT_EQ(control.call_count("cuInit"), 1u);
}

TEST_F(FakeDriverTest, ManualEventsStayPendingUntilCompleted) {
  vramscope_fake_set_manual_events(1);
  CUstream s = nullptr;
  ASSERT_EQ(cuStreamCreate(&s, 0), CUDA_SUCCESS);
  CUevent a = nullptr;
  CUevent b = nullptr;
  ASSERT_EQ(cuEventCreate(&a, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&b, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(a), CUDA_SUCCESS);  // never recorded
  ASSERT_EQ(cuEventRecord(a, s), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(b, s), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_pending_events(), 2);
  EXPECT_EQ(cuEventQuery(a), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
  float ms = 0;
  EXPECT_EQ(cuEventElapsedTime_v2(&ms, a, b), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(vramscope_fake_complete_next_event(), 1);  // the oldest: a
  EXPECT_EQ(cuEventQuery(a), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(b), CUDA_ERROR_NOT_READY);
  // A host wait completes the work it covers (blocking sync is off).
  EXPECT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(b), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_pending_events(), 0);
  EXPECT_EQ(cuEventElapsedTime_v2(&ms, a, b), CUDA_SUCCESS);
  EXPECT_GE(ms, 0.0f);

  ASSERT_EQ(cuEventRecord(a, s), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord_ptsz(b, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);  // other stream: b stays pending
  EXPECT_EQ(cuEventQuery(b), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(b), CUDA_SUCCESS);

  ASSERT_EQ(cuEventRecord(a, s), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_complete_all_events(), 1);
  EXPECT_EQ(vramscope_fake_complete_next_event(), 0);
  EXPECT_EQ(cuEventDestroy_v2(a), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy_v2(b), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, AutomaticEventsCompleteOnRecord) {
  CUevent e = nullptr;
  ASSERT_EQ(cuEventCreate(&e, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(e, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_pending_events(), 0);
  EXPECT_EQ(cuEventQuery(e), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy_v2(e), CUDA_SUCCESS);
}

// Blocking sync: the waiter blocks until the test completes the event.
//
//   waiter:  cuEventSynchronize(e) ----- blocked --------------------> returns
//   test:            sees the call counted, checks waiter not done, completes e, joins
TEST_F(FakeDriverTest, BlockingSyncWaitsForTheTest) {
  vramscope_fake_set_manual_events(1);
  vramscope_fake_set_blocking_sync(1);
  CUevent e = nullptr;
  ASSERT_EQ(cuEventCreate(&e, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(e, nullptr), CUDA_SUCCESS);
  std::atomic<bool> done{false};
  CUresult result = CUDA_ERROR_UNKNOWN;
  std::thread waiter([&] {
    result = cuEventSynchronize(e);
    done = true;
  });
  while (vramscope_fake_call_count("cuEventSynchronize") == 0) std::this_thread::yield();
  EXPECT_FALSE(done.load());
  EXPECT_EQ(vramscope_fake_pending_events(), 1);
  EXPECT_EQ(vramscope_fake_complete_all_events(), 1);
  waiter.join();
  EXPECT_TRUE(done.load());
  EXPECT_EQ(result, CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy_v2(e), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, StreamOrderedPoolCachesUntilSynchronization) {
  CUstream s = nullptr;
  ASSERT_EQ(cuStreamCreate(&s, 0), CUDA_SUCCESS);
  CUdeviceptr a = 0;
  ASSERT_EQ(cuMemAllocAsync(&a, 8 * kMiB, s), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_live_bytes(0), 8 * kMiB);
  EXPECT_EQ(vramscope_fake_live_allocations(0), 1);
  ASSERT_EQ(cuMemFreeAsync(a, s), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_live_allocations(0), 0);
  EXPECT_EQ(vramscope_fake_pool_cached_bytes(0), 8 * kMiB);
  EXPECT_EQ(vramscope_fake_live_bytes(0), 8 * kMiB);  // still reserved by the pool
  // Reuse from the pool's cache charges nothing new.
  ASSERT_EQ(cuMemAllocAsync(&a, 4 * kMiB, s), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_live_bytes(0), 8 * kMiB);
  EXPECT_EQ(vramscope_fake_pool_cached_bytes(0), 4 * kMiB);
  ASSERT_EQ(cuMemFreeAsync(a, s), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_pool_cached_bytes(0), 0u);
  EXPECT_EQ(vramscope_fake_live_bytes(0), 0u);

  // With a release threshold the pool keeps that much across synchronization.
  CUmemoryPool pool = nullptr;
  ASSERT_EQ(cuDeviceGetDefaultMemPool(&pool, 0), CUDA_SUCCESS);
  cuuint64_t threshold = 16 * kMiB;
  ASSERT_EQ(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold),
            CUDA_SUCCESS);
  ASSERT_EQ(cuMemAllocFromPoolAsync(&a, 8 * kMiB, pool, s), CUDA_SUCCESS);
  ASSERT_EQ(cuMemFreeAsync(a, s), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_pool_cached_bytes(0), 8 * kMiB);
  cuuint64_t reserved = 0;
  ASSERT_EQ(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
            CUDA_SUCCESS);
  EXPECT_EQ(reserved, 8 * kMiB);
  ASSERT_EQ(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_live_bytes(0), 0u);
  // cuMemFreeAsync only takes stream-ordered memory.
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, kMiB), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeAsync(p, s), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, CaptureRulesFollowTheThreadMode) {
  CUstream s = nullptr;
  ASSERT_EQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUstream other = nullptr;
  ASSERT_EQ(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  CUgraph g = nullptr;
  auto begin_on_other_thread = [&](CUstreamCaptureMode mode) {
    std::thread t([&] { EXPECT_EQ(cuStreamBeginCapture_v2(s, mode), CUDA_SUCCESS); });
    t.join();
  };

  // Another thread's GLOBAL capture forbids this GLOBAL-mode thread's cuMemAlloc ...
  begin_on_other_thread(CU_STREAM_CAPTURE_MODE_GLOBAL);
  EXPECT_EQ(vramscope_fake_active_captures(), 1);
  EXPECT_EQ(cuMemAlloc_v2(&p, kMiB), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(vramscope_fake_invalidated_captures(), 1);
  EXPECT_EQ(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(vramscope_fake_active_captures(), 0);

  // ... but not a THREAD_LOCAL-mode thread's ...
  begin_on_other_thread(CU_STREAM_CAPTURE_MODE_GLOBAL);
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
  ASSERT_EQ(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc_v2(&p, kMiB), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  ASSERT_EQ(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_invalidated_captures(), 0);
  // ... and syncing the capturing stream itself fails whatever the mode.
  EXPECT_EQ(cuStreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

  // A RELAXED capture elsewhere forbids nothing.
  begin_on_other_thread(CU_STREAM_CAPTURE_MODE_RELAXED);
  EXPECT_EQ(cuMemAlloc_v2(&p, kMiB), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamSynchronize(other), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(g), CUDA_SUCCESS);

  // The thread's own GLOBAL capture: syncing another stream, querying an event, freeing, are
  // all unsafe and invalidate it.
  CUevent e = nullptr;
  ASSERT_EQ(cuEventCreate(&e, 0), CUDA_SUCCESS);
  const char* unsafe[] = {"sync other stream", "event query", "free", "ctx sync"};
  for (const char* what : unsafe) {
    ASSERT_EQ(cuMemAlloc_v2(&p, kMiB), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CUresult r = CUDA_SUCCESS;
    if (strcmp(what, "sync other stream") == 0) r = cuStreamSynchronize(other);
    if (strcmp(what, "event query") == 0) r = cuEventQuery(e);
    if (strcmp(what, "free") == 0) r = cuMemFree_v2(p);
    if (strcmp(what, "ctx sync") == 0) r = cuCtxSynchronize();
    EXPECT_EQ(r, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) << what;
    EXPECT_EQ(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) << what;
    EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  }
  // cuMemAllocAsync on the capturing stream is legal and graph-owned (not charged).
  ASSERT_EQ(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAllocAsync(&p, 64 * kMiB, s), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_live_bytes(0), 0u);
  EXPECT_EQ(cuMemFreeAsync(p, s), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(g), CUDA_SUCCESS);
  // The legacy stream cannot be captured; a stream cannot be captured twice.
  EXPECT_EQ(cuStreamBeginCapture_v2(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL),
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  ASSERT_EQ(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_ERROR_ILLEGAL_STATE);
  EXPECT_EQ(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(g), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy_v2(e), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy_v2(other), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, LastPrimaryReleaseDestroysTheContextsMemory) {
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 4 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_live_bytes(0), 0u);
  EXPECT_EQ(vramscope_fake_live_allocations(0), 0);
  // Still current on this thread, but inactive.
  EXPECT_EQ(cuMemAlloc_v2(&p, kMiB), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuDevicePrimaryCtxRelease_v2(0), CUDA_ERROR_INVALID_CONTEXT);
  unsigned int flags = 0;
  int active = 1;
  EXPECT_EQ(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(active, 0);
  CUcontext again = nullptr;
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&again, 0), CUDA_SUCCESS);
  EXPECT_EQ(again, ctx_);  // the same handle
  EXPECT_EQ(cuMemAlloc_v2(&p, kMiB), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, NonPrimaryContextsOwnTheirMemory) {
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuCtxCreate_v4(&ctx, nullptr, 0, 1), CUDA_SUCCESS);
  CUcontext current = nullptr;
  ASSERT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, ctx);  // created current
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 2 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_live_bytes(1), 2 * kMiB);
  ASSERT_EQ(cuCtxDestroy_v2(ctx), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_live_bytes(1), 0u);
  ASSERT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, ctx_);  // popped back to the primary context
  // Another thread cannot make the destroyed context current.
  CUresult late = CUDA_SUCCESS;
  std::thread t([&] { late = cuCtxSetCurrent(ctx); });
  t.join();
  EXPECT_EQ(late, CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuCtxDestroy_v2(ctx), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuCtxDestroy_v2(ctx_), CUDA_ERROR_INVALID_CONTEXT);  // primary: not this way
  EXPECT_EQ(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
  CUcontext old_abi = nullptr;
  ASSERT_EQ(cuCtxCreate_v2(&old_abi, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxDestroy_v2(old_abi), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, OldCaptureAbisShareTheCaptureState) {
  CUstream s = nullptr;
  ASSERT_EQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(vramscope_fake_cuStreamBeginCapture_v10000(s), CUDA_SUCCESS);  // GLOBAL
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  EXPECT_EQ(vramscope_fake_cuStreamGetCaptureInfo_v10010(s, &status, &id), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  size_t deps = 1;
  EXPECT_EQ(cuStreamGetCaptureInfo_v2(s, &status, &id, nullptr, nullptr, &deps), CUDA_SUCCESS);
  EXPECT_EQ(deps, 0u);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc_v2(&p, kMiB), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(cuStreamGetCaptureInfo_v2_ptsz(s, &status, &id, nullptr, nullptr, nullptr),
            CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CUgraph g = nullptr;
  EXPECT_EQ(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, VmmAccountingAndReservations) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 1;
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(cuMemCreate(&h, 4 * kMiB, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_live_bytes(1), 4 * kMiB);
  EXPECT_EQ(vramscope_fake_live_allocations(1), 1);
  CUdeviceptr va = 0;
  // A reservation as large as PyTorch's expandable segments make (~total memory) is cheap.
  ASSERT_EQ(cuMemAddressReserve(&va, size_t{128} << 30, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(va % (2 * kMiB), 0u);
  EXPECT_EQ(vramscope_fake_live_reservations(), 1);
  ASSERT_EQ(cuMemMap(va, 2 * kMiB, 0, h, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemMap(va + 2 * kMiB, 2 * kMiB, 2 * kMiB, h, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemMap(va, 2 * kMiB, 0, h, 0), CUDA_ERROR_ALREADY_MAPPED);
  EXPECT_EQ(vramscope_fake_live_mappings(), 2);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(cuMemSetAccess(va, 4 * kMiB, &access, 1), CUDA_SUCCESS);  // spans both mappings
  EXPECT_EQ(vramscope_fake_access_devices(va + 3 * kMiB), 1u << 1);   // recorded per mapping
  EXPECT_EQ(vramscope_fake_access_devices(va + 4 * kMiB), 0u);        // not mapped
  memset(reinterpret_cast<void*>(va), 0x11, 4 * kMiB);
  EXPECT_EQ(cuMemAddressFree(va, size_t{128} << 30), CUDA_ERROR_INVALID_VALUE);  // still mapped
  EXPECT_EQ(cuMemUnmap(va, kMiB), CUDA_ERROR_INVALID_VALUE);  // must cover whole mappings
  ASSERT_EQ(cuMemUnmap(va, 4 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_live_bytes(1), 4 * kMiB);  // not released yet
  // Remapped, the physical memory still holds the data.
  ASSERT_EQ(cuMemMap(va + 8 * kMiB, 4 * kMiB, 0, h, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemSetAccess(va + 8 * kMiB, 4 * kMiB, &access, 1), CUDA_SUCCESS);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(va + 8 * kMiB)[4 * kMiB - 1], 0x11);
  ASSERT_EQ(cuMemRelease(h), CUDA_SUCCESS);
  EXPECT_EQ(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuMemUnmap(va + 8 * kMiB, 4 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_live_bytes(1), 0u);
  EXPECT_EQ(vramscope_fake_live_allocations(1), 0);
  ASSERT_EQ(cuMemAddressFree(va, size_t{128} << 30), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_live_reservations(), 0);
  // Over capacity.
  ASSERT_EQ(vramscope_fake_set_capacity(1, 4 * kMiB), 0);
  EXPECT_EQ(cuMemCreate(&h, 6 * kMiB, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
}

TEST_F(FakeDriverTest, MappedMemoryFaultsBeforeSetAccess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(cuMemCreate(&h, 2 * kMiB, &prop, 0), CUDA_SUCCESS);
  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemAddressReserve(&va, 2 * kMiB, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemMap(va, 2 * kMiB, 0, h, 0), CUDA_SUCCESS);
  EXPECT_DEATH(*reinterpret_cast<volatile char*>(va) = 1, "");
  unsigned char b = 0;
  EXPECT_EQ(cuMemcpyDtoH_v2(&b, va, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemUnmap(va, 2 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(cuMemRelease(h), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAddressFree(va, 2 * kMiB), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, ForkChildOfAnInitialisedProcessCannotUseTheDriver) {
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, kMiB), CUDA_SUCCESS);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: only async-signal-safe-ish work, report through the exit code.
    CUdeviceptr q = 0;
    int code = 0;
    if (vramscope_fake_forked_after_init() != 1) code |= 1;
    if (cuInit(0) != CUDA_ERROR_NOT_INITIALIZED) code |= 2;
    if (cuMemAlloc_v2(&q, kMiB) != CUDA_ERROR_NOT_INITIALIZED) code |= 4;
    if (cuMemFree_v2(p) != CUDA_ERROR_NOT_INITIALIZED) code |= 8;
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(vramscope_fake_forked_after_init(), 0);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);  // the parent is unaffected
}

TEST_F(FakeDriverTest, ConcurrentAllocationsAreConsistent) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 500;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (cuCtxSetCurrent(ctx_) != CUDA_SUCCESS) ++failures;
      for (int i = 0; i < kRounds; ++i) {
        CUdeviceptr p = 0;
        if (cuMemAlloc_v2(&p, 4096 * static_cast<size_t>(t + 1)) != CUDA_SUCCESS) ++failures;
        if (cuMemFree_v2(p) != CUDA_SUCCESS) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(vramscope_fake_call_count("cuMemAlloc_v2"), uint64_t{kThreads * kRounds});
  EXPECT_EQ(vramscope_fake_live_allocations(0), 0);
  EXPECT_EQ(vramscope_fake_live_bytes(0), 0u);
}

TEST_F(FakeDriverTest, PointerAttributesOfUnknownPointers) {
  static int host_variable;
  auto ptr = reinterpret_cast<CUdeviceptr>(&host_variable);
  int ordinal = 0;
  EXPECT_EQ(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr),
            CUDA_ERROR_INVALID_VALUE);
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  unsigned int type = 7;
  void* data[] = {&type, &ordinal};
  EXPECT_EQ(cuPointerGetAttributes(2, attrs, data, ptr), CUDA_SUCCESS);
  EXPECT_EQ(type, 0u);
  EXPECT_EQ(ordinal, -2);
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, kMiB), CUDA_SUCCESS);
  unsigned long long id1 = 0;
  unsigned long long id2 = 0;
  EXPECT_EQ(cuPointerGetAttribute(&id1, CU_POINTER_ATTRIBUTE_BUFFER_ID, p + 10), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc_v2(&p, kMiB), CUDA_SUCCESS);
  EXPECT_EQ(cuPointerGetAttribute(&id2, CU_POINTER_ATTRIBUTE_BUFFER_ID, p), CUDA_SUCCESS);
  EXPECT_NE(id1, id2);  // never reused
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
}

// Every pair of distinct devices is peer-capable; grown to 16 devices, the last one's memory
// records access granted to all of them.
TEST_F(FakeDriverTest, PeersAndAccessOfSixteenDevices) {
  int can = -1;
  ASSERT_EQ(cuDeviceCanAccessPeer(&can, 0, 1), CUDA_SUCCESS);
  EXPECT_EQ(can, 1);
  ASSERT_EQ(cuDeviceCanAccessPeer(&can, 1, 1), CUDA_SUCCESS);
  EXPECT_EQ(can, 0);
  EXPECT_EQ(cuDeviceCanAccessPeer(&can, 0, 2), CUDA_ERROR_INVALID_DEVICE);
  ASSERT_EQ(vramscope_fake_set_device_count(16), 0);
  EXPECT_EQ(vramscope_fake_set_device_count(17), -1);
  ASSERT_EQ(cuDeviceCanAccessPeer(&can, 0, 15), CUDA_SUCCESS);
  EXPECT_EQ(can, 1);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 15;
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(cuMemCreate(&h, 2 * kMiB, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_live_bytes(15), 2 * kMiB);
  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemAddressReserve(&va, 2 * kMiB, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemMap(va, 2 * kMiB, 0, h, 0), CUDA_SUCCESS);
  CUmemAccessDesc access[16] = {};
  for (int d = 0; d < 16; ++d) {
    access[d].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[d].location.id = d;
    access[d].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  ASSERT_EQ(cuMemSetAccess(va, 2 * kMiB, access, 16), CUDA_SUCCESS);
  EXPECT_EQ(vramscope_fake_access_devices(va), 0xffffu);
  ASSERT_EQ(cuMemSetAccess(va, 2 * kMiB, access + 15, 1), CUDA_SUCCESS);  // replaced, not added
  EXPECT_EQ(vramscope_fake_access_devices(va), 1u << 15);
  ASSERT_EQ(cuMemUnmap(va, 2 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cuMemRelease(h), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAddressFree(va, 2 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(vramscope_fake_set_device_count(2), 0);
}

// Run by a separate meson test with VRAMSCOPE_FAKE_DEVICES=1 and VRAMSCOPE_FAKE_CAPACITY set.
TEST(FakeEnv, DeviceCountAndCapacityComeFromTheEnvironment) {
  const char* devices = getenv("VRAMSCOPE_FAKE_DEVICES");
  const char* capacity = getenv("VRAMSCOPE_FAKE_CAPACITY");
  if (devices == nullptr || capacity == nullptr) GTEST_SKIP() << "environment not set";
  vramscope_fake_reset();
  ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  int n = 0;
  ASSERT_EQ(cuDeviceGetCount(&n), CUDA_SUCCESS);
  EXPECT_EQ(n, atoi(devices));
  size_t total = 0;
  ASSERT_EQ(cuDeviceTotalMem_v2(&total, 0), CUDA_SUCCESS);
  EXPECT_EQ(total, strtoull(capacity, nullptr, 0));
  CUdevice d = 0;
  EXPECT_EQ(cuDeviceGet(&d, n), CUDA_ERROR_INVALID_DEVICE);
  vramscope_fake_reset();
}

}  // namespace
}  // namespace vramscope::fake
