// A small CUDA program for summary_test: a few pooled allocations and one of each passthrough
// kind, then a normal exit (the shim prints its VRAMSCOPE_SUMMARY line from its atexit handler).
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

namespace {

// Looks up entry points the shim does not wrap, twice each, by dlsym and by cuGetProcAddress:
// with VRAMSCOPE_LOG=debug the shim names each once.
void LookUpUnwrapped() {
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return;
  for (int i = 0; i < 2; ++i) {
    (void)dlsym(handle, "cuDeviceGetName");
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status{};
    (void)cuGetProcAddress_v2("cuCtxGetDevice", &fn, 12000, 0, &status);
  }
}

CUdeviceptr g_late = 0;

// Registered before the first CUDA call, so it runs after the shim's own exit handler: a free
// during teardown (static destructors do this) must still answer as the driver would.
void LateFree() {
  if (g_late != 0) fprintf(stderr, "summary_helper: late free rc=%d\n", cuMemFree_v2(g_late));
}

}  // namespace

int main(int argc, char** argv) {
  atexit(LateFree);
  if (argc > 1 && strcmp(argv[1], "--lookups") == 0) LookUpUnwrapped();
  constexpr size_t kMiB = size_t{1} << 20;
  CUcontext ctx = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
      cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    fprintf(stderr, "summary_helper: no driver\n");
    return 1;
  }
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  CUdeviceptr c = 0;
  if (cuMemAlloc_v2(&a, 3 * kMiB) != CUDA_SUCCESS || cuMemAlloc_v2(&b, kMiB) != CUDA_SUCCESS ||
      cuMemFree_v2(a) != CUDA_SUCCESS || cuMemAlloc_v2(&c, 2 * kMiB) != CUDA_SUCCESS ||
      cuMemFree_v2(b) != CUDA_SUCCESS) {
    return 2;
  }
  CUdeviceptr pitched = 0;
  size_t pitch = 0;
  CUdeviceptr managed = 0;
  void* host = nullptr;
  if (cuMemAllocPitch_v2(&pitched, &pitch, 1000, 100, 4) != CUDA_SUCCESS ||
      cuMemAllocManaged(&managed, kMiB, CU_MEM_ATTACH_GLOBAL) != CUDA_SUCCESS ||
      cuMemHostAlloc(&host, 4096, 0) != CUDA_SUCCESS || cuMemFree_v2(pitched) != CUDA_SUCCESS ||
      cuMemFreeHost(host) != CUDA_SUCCESS) {
    return 3;
  }
  if (cuMemAlloc_v2(&g_late, 4096) != CUDA_SUCCESS) return 4;
  return 0;  // c, g_late and managed stay live: the summary shows them as current bytes
}
