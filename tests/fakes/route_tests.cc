// API-level checks of the driver, run over one route (see route_tests.h).
#include "route_tests.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <string.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <cuda.h>

namespace vramscope::fake {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

const char* const kDefaultExpectedSymbols[] = {
    "cuGetProcAddress_v11030",
    "cuGetProcAddress_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemHostAlloc",
    "cuMemAllocHost_v2",
    "cuMemFreeHost",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuDevicePrimaryCtxRelease_v2",
    "cuDevicePrimaryCtxReset_v2",
    "cuCtxDestroy_v2",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuArrayCreate_v2",
    "cuArray3DCreate_v2",
    "cuMipmappedArrayCreate",
    "cuArrayDestroy",
    "cuMipmappedArrayDestroy",
    "cuGraphAddMemAllocNode",
    "cuGraphAddNode_v12020",
    "cuGraphAddNode_v2",
    "cuGraphInstantiate_v10000",
    "cuGraphInstantiate_v2",
    "cuGraphInstantiateWithFlags",
    "cuGraphInstantiateWithParams",
    "cuGraphInstantiateWithParams_ptsz",
    "cuGraphUpload",
    "cuGraphUpload_ptsz",
    "cuGraphLaunch",
    "cuGraphLaunch_ptsz",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
    "cuDeviceGraphMemTrim",
};

std::vector<std::string> ExpectedSymbols() {
  std::vector<std::string> out;
  const char* env = getenv("VRAMSCOPE_EXPECT_SYMBOLS");
  if (env == nullptr || *env == '\0') {
    for (const char* s : kDefaultExpectedSymbols) out.emplace_back(s);
    return out;
  }
  std::stringstream in(env);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

class RouteTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string error;
    loaded_ = LoadRouteUnderTest(&api_, &error);
    load_error_ = error;
  }

  void SetUp() override {
    ASSERT_TRUE(loaded_) << load_error_;
    ASSERT_EQ(api_.cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  }

  void TearDown() override {
    if (ctx_ != nullptr) {
      EXPECT_EQ(api_.cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
      EXPECT_EQ(api_.cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
    }
  }

  static size_t FreeBytes() {
    size_t free = 0;
    size_t total = 0;
    EXPECT_EQ(api_.cuMemGetInfo_v2(&free, &total), CUDA_SUCCESS);
    return free;
  }

  static DriverApi api_;
  static bool loaded_;
  static std::string load_error_;
  CUcontext ctx_ = nullptr;
};

DriverApi RouteTest::api_;
bool RouteTest::loaded_ = false;
std::string RouteTest::load_error_;

TEST_F(RouteTest, EveryEntryPointIsLoaded) {
  for (const EntryPoint& e : EntryPoints()) {
    EXPECT_NE(Get(api_, e), nullptr) << e.member;
  }
}

TEST_F(RouteTest, MemoryEntryPointsLiveInTheExpectedModule) {
  const char* env = getenv("VRAMSCOPE_EXPECT_MODULE");
  std::string module = env != nullptr && *env != '\0' ? env : "libcuda.so.1";
  for (const std::string& name : ExpectedSymbols()) {
    const EntryPoint* entry = nullptr;
    for (const EntryPoint& e : EntryPoints()) {
      if (name == e.member) entry = &e;
    }
    ASSERT_NE(entry, nullptr) << "VRAMSCOPE_EXPECT_SYMBOLS names an unknown member " << name;
    std::string where = ModuleOf(Get(api_, *entry));
    EXPECT_NE(where.find(module), std::string::npos)
        << name << " resolved into '" << where << "', expected a module containing '" << module
        << "'";
  }
}

TEST_F(RouteTest, DriverAndDevices) {
  int version = 0;
  EXPECT_EQ(api_.cuDriverGetVersion(&version), CUDA_SUCCESS);
  EXPECT_GE(version, 13000);
  int count = 0;
  ASSERT_EQ(api_.cuDeviceGetCount(&count), CUDA_SUCCESS);
  ASSERT_EQ(count, 2);
  CUuuid uuids[2];
  for (int i = 0; i < count; ++i) {
    CUdevice dev = -1;
    ASSERT_EQ(api_.cuDeviceGet(&dev, i), CUDA_SUCCESS);
    EXPECT_EQ(dev, i);
    char name[64] = {};
    EXPECT_EQ(api_.cuDeviceGetName(name, sizeof(name), dev), CUDA_SUCCESS);
    EXPECT_GT(strlen(name), 0u);
    EXPECT_EQ(api_.cuDeviceGetUuid_v2(&uuids[i], dev), CUDA_SUCCESS);
    size_t total = 0;
    EXPECT_EQ(api_.cuDeviceTotalMem_v2(&total, dev), CUDA_SUCCESS);
    EXPECT_GT(total, 0u);
    int major = 0;
    EXPECT_EQ(api_.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
              CUDA_SUCCESS);
    EXPECT_GE(major, 7);
  }
  EXPECT_NE(memcmp(uuids[0].bytes, uuids[1].bytes, sizeof(uuids[0].bytes)), 0);
  CUdevice bad = 0;
  EXPECT_EQ(api_.cuDeviceGet(&bad, count), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(RouteTest, ErrorStringsAndExportTable) {
  const char* s = nullptr;
  EXPECT_EQ(api_.cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s), CUDA_SUCCESS);
  EXPECT_STREQ(s, "CUDA_ERROR_OUT_OF_MEMORY");
  EXPECT_EQ(api_.cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &s), CUDA_SUCCESS);
  ASSERT_NE(s, nullptr);
  const void* table = nullptr;
  CUuuid id{};
  EXPECT_EQ(api_.cuGetExportTable(&table, &id), CUDA_ERROR_NOT_SUPPORTED);
}

TEST_F(RouteTest, ContextStack) {
  CUcontext current = nullptr;
  EXPECT_EQ(api_.cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, ctx_);
  CUcontext ctx1 = nullptr;
  ASSERT_EQ(api_.cuDevicePrimaryCtxRetain(&ctx1, 1), CUDA_SUCCESS);
  EXPECT_NE(ctx1, ctx_);
  ASSERT_EQ(api_.cuCtxPushCurrent_v2(ctx1), CUDA_SUCCESS);
  CUdevice dev = -1;
  EXPECT_EQ(api_.cuCtxGetDevice(&dev), CUDA_SUCCESS);
  EXPECT_EQ(dev, 1);
  CUcontext popped = nullptr;
  EXPECT_EQ(api_.cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);
  EXPECT_EQ(popped, ctx1);
  EXPECT_EQ(api_.cuCtxGetDevice(&dev), CUDA_SUCCESS);
  EXPECT_EQ(dev, 0);
  EXPECT_EQ(api_.cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
}

TEST_F(RouteTest, AllocCopyFree) {
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, kMiB), CUDA_SUCCESS);
  ASSERT_NE(p, 0u);
  std::vector<unsigned char> in(kMiB), out(kMiB);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 7);
  EXPECT_EQ(api_.cuMemcpyHtoD_v2(p, in.data(), in.size()), CUDA_SUCCESS);
  CUdeviceptr q = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&q, kMiB), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemcpyDtoD_v2(q, p, kMiB), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemcpyDtoH_v2(out.data(), q, out.size()), CUDA_SUCCESS);
  EXPECT_EQ(in, out);
  EXPECT_EQ(api_.cuMemsetD8_v2(q, 0xab, 16), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemcpyDtoH_v2(out.data(), q, 16), CUDA_SUCCESS);
  EXPECT_EQ(out[0], 0xab);
  EXPECT_EQ(out[15], 0xab);

  CUdeviceptr base = 0;
  size_t size = 0;
  EXPECT_EQ(api_.cuMemGetAddressRange_v2(&base, &size, p + 4096), CUDA_SUCCESS);
  EXPECT_EQ(base, p);
  EXPECT_EQ(size, kMiB);
  int ordinal = -1;
  EXPECT_EQ(api_.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p),
            CUDA_SUCCESS);
  EXPECT_EQ(ordinal, 0);

  EXPECT_EQ(api_.cuMemFree_v2(p + 16), CUDA_ERROR_INVALID_VALUE);  // not a base
  EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(q), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(0), CUDA_SUCCESS);  // cudaFree(0)
  EXPECT_EQ(api_.cuMemAlloc_v2(&p, 0), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RouteTest, FreeOfUnknownPointerIsInvalidValue) {
  static int not_device_memory;
  EXPECT_EQ(api_.cuMemFree_v2(reinterpret_cast<CUdeviceptr>(&not_device_memory)),
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RouteTest, MemGetInfoTracksAllocations) {
  size_t free0 = 0;
  size_t total = 0;
  ASSERT_EQ(api_.cuMemGetInfo_v2(&free0, &total), CUDA_SUCCESS);
  EXPECT_LE(free0, total);
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, 64 * kMiB), CUDA_SUCCESS);
  EXPECT_LE(FreeBytes(), free0 - 64 * kMiB);
  ASSERT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), free0);
}

TEST_F(RouteTest, OutOfMemoryBeyondCapacity) {
  size_t free = 0;
  size_t total = 0;
  ASSERT_EQ(api_.cuMemGetInfo_v2(&free, &total), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  EXPECT_EQ(api_.cuMemAlloc_v2(&p, total + kMiB), CUDA_ERROR_OUT_OF_MEMORY);
  // Filling the device: the allocation that no longer fits fails, the others are usable.
  std::vector<CUdeviceptr> blocks;
  const size_t chunk = total / 4;
  CUresult r = CUDA_SUCCESS;
  while ((r = api_.cuMemAlloc_v2(&p, chunk)) == CUDA_SUCCESS) {
    blocks.push_back(p);
    ASSERT_LE(blocks.size(), 5u);
  }
  EXPECT_EQ(r, CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_GE(blocks.size(), 3u);
  for (CUdeviceptr b : blocks) EXPECT_EQ(api_.cuMemFree_v2(b), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, chunk), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
}

TEST_F(RouteTest, NoCurrentContextOnAFreshThread) {
  CUresult alloc = CUDA_SUCCESS;
  CUresult device = CUDA_SUCCESS;
  CUresult info = CUDA_SUCCESS;
  std::thread t([&] {
    CUdeviceptr p = 0;
    alloc = api_.cuMemAlloc_v2(&p, kMiB);
    CUdevice dev = 0;
    device = api_.cuCtxGetDevice(&dev);
    size_t free = 0;
    size_t total = 0;
    info = api_.cuMemGetInfo_v2(&free, &total);
  });
  t.join();
  EXPECT_EQ(alloc, CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(device, CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(info, CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(RouteTest, SecondDeviceHasItsOwnMemory) {
  CUcontext ctx1 = nullptr;
  ASSERT_EQ(api_.cuDevicePrimaryCtxRetain(&ctx1, 1), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuCtxPushCurrent_v2(ctx1), CUDA_SUCCESS);
  size_t free1 = FreeBytes();
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, 32 * kMiB), CUDA_SUCCESS);
  int ordinal = -1;
  EXPECT_EQ(api_.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p),
            CUDA_SUCCESS);
  EXPECT_EQ(ordinal, 1);
  EXPECT_LE(FreeBytes(), free1 - 32 * kMiB);
  CUcontext popped = nullptr;
  ASSERT_EQ(api_.cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);
  // Freed under device 0's context: frees go by address.
  EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
}

TEST_F(RouteTest, PitchedManagedAndHostMemory) {
  CUdeviceptr p = 0;
  size_t pitch = 0;
  ASSERT_EQ(api_.cuMemAllocPitch_v2(&p, &pitch, 1000, 100, 4), CUDA_SUCCESS);
  EXPECT_GE(pitch, 1000u);
  EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);

  ASSERT_EQ(api_.cuMemAllocManaged(&p, kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  bool managed = false;
  EXPECT_EQ(api_.cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p), CUDA_SUCCESS);
  EXPECT_TRUE(managed);
  reinterpret_cast<char*>(p)[0] = 1;  // host-accessible
  EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);

  void* h = nullptr;
  ASSERT_EQ(api_.cuMemHostAlloc(&h, kMiB, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
  unsigned int type = 0;
  EXPECT_EQ(api_.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                       reinterpret_cast<CUdeviceptr>(h)),
            CUDA_SUCCESS);
  EXPECT_EQ(type, static_cast<unsigned int>(CU_MEMORYTYPE_HOST));
  EXPECT_EQ(api_.cuMemFreeHost(h), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemAllocHost_v2(&h, 4096), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFreeHost(h), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFreeHost(h), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RouteTest, HostRegistration) {
  std::vector<char> buffer(64 * 1024);
  ASSERT_EQ(api_.cuMemHostRegister_v2(buffer.data(), buffer.size(), 0), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemHostRegister_v2(buffer.data() + 16, 16, 0),
            CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  CUdeviceptr d = 0;
  EXPECT_EQ(api_.cuMemHostGetDevicePointer_v2(&d, buffer.data() + 8, 0), CUDA_SUCCESS);
  EXPECT_EQ(d, reinterpret_cast<CUdeviceptr>(buffer.data() + 8));
  EXPECT_EQ(api_.cuMemFree_v2(reinterpret_cast<CUdeviceptr>(buffer.data())),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuMemHostUnregister(buffer.data()), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemHostUnregister(buffer.data()), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

TEST_F(RouteTest, DestroyedContextTakesItsMemory) {
  CUcontext ctx = nullptr;
  ASSERT_EQ(api_.cuCtxCreate_v4(&ctx, nullptr, 0, 1), CUDA_SUCCESS);  // made current
  size_t free0 = FreeBytes();
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, 8 * kMiB), CUDA_SUCCESS);
  EXPECT_LE(FreeBytes(), free0 - 8 * kMiB);
  ASSERT_EQ(api_.cuCtxDestroy_v2(ctx), CUDA_SUCCESS);
  CUcontext current = nullptr;
  ASSERT_EQ(api_.cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, ctx_);  // popped
  CUcontext ctx1 = nullptr;
  ASSERT_EQ(api_.cuDevicePrimaryCtxRetain(&ctx1, 1), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuCtxPushCurrent_v2(ctx1), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), free0);  // device 1's memory is back
  EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
  CUcontext popped = nullptr;
  ASSERT_EQ(api_.cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
}

TEST_F(RouteTest, StreamsAndEvents) {
  CUstream s = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUstream prio = nullptr;
  ASSERT_EQ(api_.cuStreamCreateWithPriority(&prio, 0, -1), CUDA_SUCCESS);
  CUevent start = nullptr;
  CUevent end = nullptr;
  ASSERT_EQ(api_.cuEventCreate(&start, 0), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuEventCreate(&end, 0), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuEventRecord(start, s), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamWaitEvent(prio, start, 0), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuEventRecord_ptsz(end, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuEventSynchronize(end), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuEventQuery(end), CUDA_SUCCESS);
  float ms = -1;
  EXPECT_EQ(api_.cuEventElapsedTime_v2(&ms, start, end), CUDA_SUCCESS);
  EXPECT_GE(ms, 0.0f);
  EXPECT_EQ(api_.cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamSynchronize_ptsz(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamQuery(s), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamQuery_ptsz(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamWaitEvent_ptsz(nullptr, start, 0), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuCtxSynchronize(), CUDA_SUCCESS);

  CUevent untimed = nullptr;
  ASSERT_EQ(api_.cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuEventRecord(untimed, s), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuEventElapsedTime_v2(&ms, start, untimed), CUDA_ERROR_INVALID_HANDLE);

  EXPECT_EQ(api_.cuEventDestroy_v2(untimed), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuEventDestroy_v2(start), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuEventDestroy_v2(end), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamDestroy_v2(prio), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

TEST_F(RouteTest, StreamOrderedAllocation) {
  CUstream s = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&s, 0), CUDA_SUCCESS);
  CUmemoryPool pool = nullptr;
  ASSERT_EQ(api_.cuDeviceGetDefaultMemPool(&pool, 0), CUDA_SUCCESS);
  size_t free0 = FreeBytes();

  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  CUdeviceptr c = 0;
  CUdeviceptr d = 0;
  ASSERT_EQ(api_.cuMemAllocAsync(&a, 8 * kMiB, s), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemAllocAsync_ptsz(&b, 8 * kMiB, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemAllocFromPoolAsync(&c, 8 * kMiB, pool, s), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemAllocFromPoolAsync_ptsz(&d, 8 * kMiB, pool, nullptr), CUDA_SUCCESS);
  EXPECT_LE(FreeBytes(), free0 - 32 * kMiB);
  EXPECT_EQ(api_.cuMemsetD8_v2(a, 1, 8 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFreeAsync(a, s), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFreeAsync_ptsz(b, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFreeAsync(c, s), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFreeAsync_ptsz(d, nullptr), CUDA_SUCCESS);
  // The pool releases freed memory at a synchronization point (release threshold 0).
  EXPECT_EQ(api_.cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), free0);
  EXPECT_EQ(api_.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

TEST_F(RouteTest, GlobalCaptureRejectsSynchronousAllocation) {
  CUstream s = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  EXPECT_EQ(api_.cuStreamIsCapturing(s, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUdeviceptr p = 0;
  EXPECT_EQ(api_.cuMemAlloc_v2(&p, kMiB), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(api_.cuStreamIsCapturing(s, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CUgraph graph = nullptr;
  EXPECT_EQ(api_.cuStreamEndCapture(s, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(graph, nullptr);
  EXPECT_EQ(api_.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

TEST_F(RouteTest, RelaxedModeAllowsAllocationDuringCapture) {
  CUstream s = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuStreamBeginCapture_v2_ptsz(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  // PyTorch's cudaMallocMaybeCapturing: relaxed mode around the allocation.
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  ASSERT_EQ(api_.cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
  EXPECT_EQ(mode, CU_STREAM_CAPTURE_MODE_GLOBAL);
  CUdeviceptr p = 0;
  EXPECT_EQ(api_.cuMemAlloc_v2(&p, kMiB), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
  EXPECT_EQ(mode, CU_STREAM_CAPTURE_MODE_RELAXED);
  // Stream-ordered allocation on the capturing stream is captured (graph-owned memory).
  CUdeviceptr g = 0;
  EXPECT_EQ(api_.cuMemAllocAsync(&g, kMiB, s), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFreeAsync(g, s), CUDA_SUCCESS);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  EXPECT_EQ(api_.cuStreamGetCaptureInfo_v3(s, &status, &id, nullptr, nullptr, nullptr, nullptr),
            CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(
      api_.cuStreamGetCaptureInfo_v3_ptsz(s, &status, &id, nullptr, nullptr, nullptr, nullptr),
      CUDA_SUCCESS);
  size_t deps = 1;
  EXPECT_EQ(api_.cuStreamGetCaptureInfo_v2(s, &status, &id, nullptr, nullptr, &deps), CUDA_SUCCESS);
  EXPECT_EQ(deps, 0u);
  EXPECT_EQ(api_.cuStreamGetCaptureInfo_v2_ptsz(s, &status, &id, nullptr, nullptr, nullptr),
            CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamIsCapturing_ptsz(s, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUgraph graph = nullptr;
  EXPECT_EQ(api_.cuStreamEndCapture_ptsz(s, &graph), CUDA_SUCCESS);
  EXPECT_NE(graph, nullptr);
  EXPECT_EQ(api_.cuGraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

std::uint64_t GraphReserved(const DriverApi& api, CUdevice device) {
  cuuint64_t value = 0;
  EXPECT_EQ(
      api.cuDeviceGetGraphMemAttribute(device, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &value),
      CUDA_SUCCESS);
  return value;
}

CUDA_MEM_ALLOC_NODE_PARAMS MemAllocParams(int device, size_t bytes) {
  CUDA_MEM_ALLOC_NODE_PARAMS params{};
  params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  params.poolProps.location.id = device;
  params.bytesize = bytes;
  return params;
}

// Graph memory comes from the device's graph pool when a graph with mem-alloc nodes is
// instantiated (fake model: each exec maps the sum of its nodes); destroying the exec keeps it
// cached, cuDeviceGraphMemTrim gives it back; launch and upload map again after a trim.
TEST_F(RouteTest, GraphMemoryNodesUseTheGraphPool) {
  const size_t free0 = FreeBytes();
  CUgraph graph = nullptr;
  ASSERT_EQ(api_.cuGraphCreate(&graph, 0), CUDA_SUCCESS);
  CUgraphNode node = nullptr;
  CUDA_MEM_ALLOC_NODE_PARAMS a = MemAllocParams(0, 4 * kMiB);
  ASSERT_EQ(api_.cuGraphAddMemAllocNode(&node, graph, nullptr, 0, &a), CUDA_SUCCESS);
  EXPECT_NE(a.dptr, 0u);
  CUgraphNodeParams b{};
  b.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
  b.alloc.poolProps = MemAllocParams(0, 0).poolProps;
  b.alloc.bytesize = 2 * kMiB;
  ASSERT_EQ(api_.cuGraphAddNode_v2(&node, graph, nullptr, nullptr, 0, &b), CUDA_SUCCESS);
  b.alloc.bytesize = kMiB;
  ASSERT_EQ(api_.cuGraphAddNode_v12020(&node, graph, nullptr, 0, &b), CUDA_SUCCESS);
  CUgraphNodeParams empty{};
  empty.type = CU_GRAPH_NODE_TYPE_EMPTY;
  ASSERT_EQ(api_.cuGraphAddNode_v2(&node, graph, nullptr, nullptr, 0, &empty), CUDA_SUCCESS);
  EXPECT_EQ(GraphReserved(api_, 0), 0u);  // nothing until instantiation
  EXPECT_EQ(FreeBytes(), free0);

  CUgraphExec exec = nullptr;
  ASSERT_EQ(api_.cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  EXPECT_EQ(GraphReserved(api_, 0), 7 * kMiB);
  EXPECT_EQ(FreeBytes(), free0 - 7 * kMiB);
  CUstream s = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuGraphLaunch(exec, s), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuGraphLaunch_ptsz(exec, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuGraphUpload(exec, s), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuGraphUpload_ptsz(exec, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(GraphReserved(api_, 0), 7 * kMiB);
  // Trim while instantiated: released, and mapped again by the next launch.
  EXPECT_EQ(api_.cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
  EXPECT_EQ(GraphReserved(api_, 0), 0u);
  EXPECT_EQ(api_.cuGraphLaunch(exec, s), CUDA_SUCCESS);
  EXPECT_EQ(GraphReserved(api_, 0), 7 * kMiB);
  // A destroyed exec's memory stays cached for the next one.
  EXPECT_EQ(api_.cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(GraphReserved(api_, 0), 7 * kMiB);
  CUgraphExec execs[4] = {};
  ASSERT_EQ(api_.cuGraphInstantiate_v10000(&execs[0], graph, nullptr, nullptr, 0), CUDA_SUCCESS);
  EXPECT_EQ(GraphReserved(api_, 0), 7 * kMiB);
  ASSERT_EQ(api_.cuGraphInstantiate_v2(&execs[1], graph, nullptr, nullptr, 0), CUDA_SUCCESS);
  CUDA_GRAPH_INSTANTIATE_PARAMS params{};
  ASSERT_EQ(api_.cuGraphInstantiateWithParams(&execs[2], graph, &params), CUDA_SUCCESS);
  EXPECT_EQ(params.result_out, CUDA_GRAPH_INSTANTIATE_SUCCESS);
  ASSERT_EQ(api_.cuGraphInstantiateWithParams_ptsz(&execs[3], graph, &params), CUDA_SUCCESS);
  EXPECT_EQ(GraphReserved(api_, 0), 28 * kMiB);
  for (CUgraphExec e : execs) EXPECT_EQ(api_.cuGraphExecDestroy(e), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuGraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
  EXPECT_EQ(GraphReserved(api_, 0), 0u);
  EXPECT_EQ(FreeBytes(), free0);

  // Errors come back as the driver's.
  EXPECT_EQ(api_.cuGraphLaunch(execs[0], s), CUDA_ERROR_INVALID_VALUE);  // destroyed
  EXPECT_EQ(api_.cuGraphExecDestroy(execs[0]), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuDeviceGraphMemTrim(7), CUDA_ERROR_INVALID_DEVICE);
  ASSERT_EQ(api_.cuGraphCreate(&graph, 0), CUDA_SUCCESS);
  CUDA_MEM_ALLOC_NODE_PARAMS zero = MemAllocParams(0, 0);
  EXPECT_EQ(api_.cuGraphAddMemAllocNode(&node, graph, nullptr, 0, &zero), CUDA_ERROR_INVALID_VALUE);
  CUgraphNodeParams kernel{};
  kernel.type = CU_GRAPH_NODE_TYPE_KERNEL;
  EXPECT_EQ(api_.cuGraphAddNode_v2(&node, graph, nullptr, nullptr, 0, &kernel),
            CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(api_.cuGraphDestroy(graph), CUDA_SUCCESS);

  // cuMemAllocAsync on a capturing stream makes a mem-alloc node of the captured graph.
  ASSERT_EQ(api_.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUdeviceptr g = 0;
  ASSERT_EQ(api_.cuMemAllocAsync(&g, 3 * kMiB, s), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemFreeAsync(g, s), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuStreamEndCapture(s, &graph), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  EXPECT_EQ(GraphReserved(api_, 0), 3 * kMiB);
  EXPECT_EQ(api_.cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuGraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), free0);
  EXPECT_EQ(api_.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

TEST_F(RouteTest, ArraysTakeDeviceMemoryUntilDestroyed) {
  const size_t free0 = FreeBytes();
  CUDA_ARRAY_DESCRIPTOR desc{};
  desc.Width = 1000;
  desc.Height = 100;
  desc.Format = CU_AD_FORMAT_FLOAT;
  desc.NumChannels = 1;
  CUarray a2d = nullptr;
  ASSERT_EQ(api_.cuArrayCreate_v2(&a2d, &desc), CUDA_SUCCESS);
  CUDA_ARRAY_MEMORY_REQUIREMENTS needs{};
  ASSERT_EQ(api_.cuArrayGetMemoryRequirements(&needs, a2d, 0), CUDA_SUCCESS);
  EXPECT_GE(needs.size, 1000u * 100 * 4);
  EXPECT_EQ(FreeBytes(), free0 - needs.size);
  CUDA_ARRAY3D_DESCRIPTOR desc3{};
  desc3.Width = 64;
  desc3.Height = 64;
  desc3.Depth = 64;
  desc3.Format = CU_AD_FORMAT_UNSIGNED_INT8;
  desc3.NumChannels = 4;
  CUarray a3d = nullptr;
  ASSERT_EQ(api_.cuArray3DCreate_v2(&a3d, &desc3), CUDA_SUCCESS);
  CUmipmappedArray mip = nullptr;
  ASSERT_EQ(api_.cuMipmappedArrayCreate(&mip, &desc3, 4), CUDA_SUCCESS);
  EXPECT_LT(FreeBytes(), free0 - needs.size - 64 * 64 * 64 * 4);
  EXPECT_EQ(api_.cuArrayDestroy(a2d), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuArrayDestroy(a3d), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMipmappedArrayDestroy(mip), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), free0);
  // Errors come back as the driver's: a destroyed handle, a bad descriptor.
  EXPECT_EQ(api_.cuArrayDestroy(a2d), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(api_.cuMipmappedArrayDestroy(mip), CUDA_ERROR_INVALID_HANDLE);
  desc.Width = 0;
  EXPECT_EQ(api_.cuArrayCreate_v2(&a2d, &desc), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(FreeBytes(), free0);
}

TEST_F(RouteTest, VirtualMemoryManagement) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  ASSERT_EQ(api_.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_SUCCESS);
  EXPECT_EQ(gran, 2 * kMiB);
  size_t free0 = FreeBytes();

  CUdeviceptr va = 0;
  ASSERT_EQ(api_.cuMemAddressReserve(&va, 4 * gran, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), free0);  // address space costs no memory
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(api_.cuMemCreate(&h, 2 * gran, &prop, 0), CUDA_SUCCESS);
  EXPECT_LE(FreeBytes(), free0 - 2 * gran);
  ASSERT_EQ(api_.cuMemMap(va + gran, 2 * gran, 0, h, 0), CUDA_SUCCESS);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(api_.cuMemSetAccess(va + gran, 2 * gran, &access, 1), CUDA_SUCCESS);

  // Written through the mapped pointer, read back through the driver.
  auto* host = reinterpret_cast<unsigned char*>(va + gran);
  host[0] = 0x5a;
  host[2 * gran - 1] = 0xa5;
  unsigned char b[2] = {};
  EXPECT_EQ(api_.cuMemcpyDtoH_v2(&b[0], va + gran, 1), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemcpyDtoH_v2(&b[1], va + 3 * gran - 1, 1), CUDA_SUCCESS);
  EXPECT_EQ(b[0], 0x5a);
  EXPECT_EQ(b[1], 0xa5);
  CUdeviceptr base = 0;
  size_t size = 0;
  EXPECT_EQ(api_.cuMemGetAddressRange_v2(&base, &size, va + gran + 100), CUDA_SUCCESS);
  EXPECT_EQ(base, va + gran);
  EXPECT_EQ(size, 2 * gran);

  // Released while mapped: the memory lives until the last unmap.
  EXPECT_EQ(api_.cuMemRelease(h), CUDA_SUCCESS);
  EXPECT_LE(FreeBytes(), free0 - 2 * gran);
  EXPECT_EQ(host[0], 0x5a);
  EXPECT_EQ(api_.cuMemUnmap(va + gran, 2 * gran), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), free0);
  EXPECT_EQ(api_.cuMemAddressFree(va, 4 * gran), CUDA_SUCCESS);

  // Sizes must be multiples of the granularity.
  EXPECT_EQ(api_.cuMemCreate(&h, gran + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RouteTest, IpcHandleNamesTheWholeAllocation) {
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, kMiB), CUDA_SUCCESS);
  CUipcMemHandle h1{};
  CUipcMemHandle h2{};
  ASSERT_EQ(api_.cuIpcGetMemHandle(&h1, p), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuIpcGetMemHandle(&h2, p + 4096), CUDA_SUCCESS);
  EXPECT_EQ(memcmp(&h1, &h2, sizeof(h1)), 0);
  CUdeviceptr opened = 0;
  ASSERT_EQ(api_.cuIpcOpenMemHandle_v2(&opened, h2, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
            CUDA_SUCCESS);
  EXPECT_EQ(opened, p);
  EXPECT_EQ(api_.cuIpcCloseMemHandle(opened), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
}

TEST_F(RouteTest, PrimaryContextResetFreesItsMemory) {
  size_t free0 = FreeBytes();
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, 16 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuDevicePrimaryCtxReset_v2(0), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), free0);
  EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);  // gone with the context
}

TEST_F(RouteTest, GetProcAddressServesBothAbis) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  ASSERT_EQ(api_.cuGetProcAddress_v2("cuMemAlloc", &fn, 12000, 0, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  ASSERT_NE(fn, nullptr);
  void* fn4 = nullptr;
  ASSERT_EQ(api_.cuGetProcAddress_v11030("cuMemAlloc", &fn4, 11030, 0), CUDA_SUCCESS);
  EXPECT_EQ(fn4, fn);
  // A pointer obtained this way allocates like the table's.
  PFN_cuMemAlloc_v3020 alloc;
  memcpy(&alloc, &fn, sizeof(fn));
  CUdeviceptr p = 0;
  ASSERT_EQ(alloc(&p, kMiB), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuGetProcAddress_v2("cuNoSuchFunction", &fn, 12000, 0, &status), CUDA_SUCCESS);
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
}

}  // namespace
}  // namespace vramscope::fake
