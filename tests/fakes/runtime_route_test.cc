// Route R1 with the real CUDA runtime: libcudart.so.13 from the toolkit, loaded with dlopen,
// initialising against the fake driver. Skipped when the runtime library cannot be loaded.
//
// The runtime reaches the driver only through cuGetProcAddress_v2 (docs/driver-notes.md);
// this test checks that the fake sees exactly that sequence. The runtime then asks for private
// driver tables with cuGetExportTable, which the fake does not have, so its first call fails
// (cudaErrorNotSupported): the runtime's own allocations cannot be run over the fake. The
// route helpers (routes.h) replay the sequence for the rest.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <string.h>

#include <cuda.h>

#include "fake_cuda_control.h"

namespace vramscope::fake {
namespace {

TEST(RuntimeRoute, RuntimeInitialisesThroughGetProcAddressOnly) {
  vramscope_fake_reset();
  void* cudart = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
  if (cudart == nullptr) GTEST_SKIP() << "libcudart.so.13 not found: " << dlerror();
  using GetDeviceCount = int (*)(int*);
  void* sym = dlsym(cudart, "cudaGetDeviceCount");
  ASSERT_NE(sym, nullptr);
  GetDeviceCount get_device_count;
  static_assert(sizeof(get_device_count) == sizeof(sym));
  memcpy(&get_device_count, &sym, sizeof(sym));
  int count = -1;
  int result = get_device_count(&count);
  RecordProperty("cudaGetDeviceCount", result);

  // The empty-name probe, then cuGetProcAddress itself at 11030 and 12000.
  EXPECT_EQ(vramscope_fake_lookup_count(""), 1u);
  EXPECT_EQ(vramscope_fake_lookup_count("cuGetProcAddress"), 2u);
  // Hundreds of lookups, all through the 5-argument entry point.
  EXPECT_GT(vramscope_fake_call_count("cuGetProcAddress_v2"), 100u);
  EXPECT_EQ(vramscope_fake_call_count("cuGetProcAddress"), 0u);
  // Stream-taking functions twice (legacy and per-thread), the others once.
  EXPECT_EQ(vramscope_fake_lookup_count("cuMemAlloc"), 1u);
  EXPECT_EQ(vramscope_fake_lookup_count("cuMemFree"), 1u);
  EXPECT_EQ(vramscope_fake_lookup_count("cuMemGetInfo"), 1u);
  EXPECT_EQ(vramscope_fake_lookup_count("cuMemAllocAsync"), 2u);
  EXPECT_EQ(vramscope_fake_lookup_count("cuMemFreeAsync"), 2u);
  EXPECT_EQ(vramscope_fake_lookup_count("cuStreamSynchronize"), 2u);
  // Then it initialises the driver and asks for its private tables.
  EXPECT_EQ(vramscope_fake_call_count("cuInit"), 1u);
  EXPECT_GE(vramscope_fake_call_count("cuGetExportTable"), 1u);
  // Nothing was allocated on the way.
  EXPECT_EQ(vramscope_fake_call_count("cuMemAlloc_v2"), 0u);
  EXPECT_EQ(vramscope_fake_live_bytes(0), 0u);
}

}  // namespace
}  // namespace vramscope::fake
