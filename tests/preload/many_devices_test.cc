// The real libvramscope.so over the fake driver reporting 16 devices (VRAMSCOPE_FAKE_DEVICES=16,
// the shim's kMaxDevices): pooled memory on the last device works, and every device gets access
// to it, as cuMemAlloc memory is reachable from any peer once the application enables peer
// access. The fake records each cuMemSetAccess's devices (vramscope_fake_access_devices).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include <cuda.h>

#include "fake_cuda_control.h"
#include "routes.h"

namespace vramscope::fake {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr int kDevices = 16;

class ManyDevicesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string error;
    ASSERT_TRUE(LoadDirect(&api_, &error)) << error;
  }

  void SetUp() override {
    ASSERT_NE(ModuleOf(reinterpret_cast<void*>(api_.cuMemAlloc_v2)).find("libvramscope"),
              std::string::npos)
        << "run with LD_PRELOAD=libvramscope.so";
    ASSERT_EQ(api_.cuInit(0), CUDA_SUCCESS);
    int count = 0;
    ASSERT_EQ(api_.cuDeviceGetCount(&count), CUDA_SUCCESS);
    ASSERT_EQ(count, kDevices) << "run with VRAMSCOPE_FAKE_DEVICES=16";
  }

  static DriverApi api_;
};

DriverApi ManyDevicesTest::api_;

TEST_F(ManyDevicesTest, PooledMemoryOnTheLastDeviceIsReachableFromEveryPeer) {
  const int last = kDevices - 1;
  CUcontext ctx = nullptr;
  ASSERT_EQ(api_.cuDevicePrimaryCtxRetain(&ctx, last), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  const std::uint64_t creates_before = vramscope_fake_call_count("cuMemCreate");
  CUdeviceptr p = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&p, 3 * kMiB), CUDA_SUCCESS);
  // The pool took VMM memory for it (the case where access has to be granted per device).
  EXPECT_GT(vramscope_fake_call_count("cuMemCreate"), creates_before);
  int ordinal = -1;
  EXPECT_EQ(api_.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p),
            CUDA_SUCCESS);
  EXPECT_EQ(ordinal, last);
  std::memset(reinterpret_cast<void*>(p), 0x5a, 3 * kMiB);  // mapped and writable
  const std::uint32_t every_device = (std::uint32_t{1} << kDevices) - 1;
  EXPECT_EQ(vramscope_fake_access_devices(p), every_device)
      << "devices granted access to pooled memory on cuda:" << last << ": 0x" << std::hex
      << vramscope_fake_access_devices(p);
  EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuDevicePrimaryCtxRelease_v2(last), CUDA_SUCCESS);
}

// Every device's pool works, each granting access to all the others.
TEST_F(ManyDevicesTest, EveryDeviceAllocatesAndSharesWithAllOthers) {
  const std::uint32_t every_device = (std::uint32_t{1} << kDevices) - 1;
  for (int device = 0; device < kDevices; ++device) {
    SCOPED_TRACE(device);
    CUcontext ctx = nullptr;
    ASSERT_EQ(api_.cuDevicePrimaryCtxRetain(&ctx, device), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    CUdeviceptr p = 0;
    ASSERT_EQ(api_.cuMemAlloc_v2(&p, kMiB), CUDA_SUCCESS);
    EXPECT_EQ(vramscope_fake_access_devices(p), every_device);
    EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuDevicePrimaryCtxRelease_v2(device), CUDA_SUCCESS);
  }
}

}  // namespace
}  // namespace vramscope::fake
