// A CUDA program for cupti_run_test, over the fake driver: memory the shim pools and memory it
// passes through (stream-ordered), so CUPTI's driver view has both. Writes what the driver
// really held (the fake's charged bytes, sampled after every call) to OUT as `key=value` lines.
//
//   cupti_app basic OUT   pooled 1 MiB, 3 MiB and 40 MiB + 1, the first two freed; 8 MiB
//                         stream-ordered, freed; 40 MiB + 1 freed; exits 0
#include <stdio.h>
#include <string.h>

#include <algorithm>

#include <cuda.h>

#include "fake_cuda_control.h"

namespace {

size_t g_peak_driver = 0;

void Sample() { g_peak_driver = std::max(g_peak_driver, vramscope_fake_live_bytes(0)); }

int Basic(const char* out) {
  CUcontext ctx = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
      cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    return 10;
  }
  const size_t sizes[3] = {size_t{1} << 20, size_t{3} << 20, (size_t{40} << 20) + 1};
  CUdeviceptr p[3] = {};
  for (int i = 0; i < 3; ++i) {
    if (cuMemAlloc_v2(&p[i], sizes[i]) != CUDA_SUCCESS) return 11;
    Sample();
  }
  for (int i = 0; i < 2; ++i) {
    if (cuMemFree_v2(p[i]) != CUDA_SUCCESS) return 12;
    Sample();
  }
  CUstream stream = nullptr;
  CUdeviceptr async = 0;
  if (cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
      cuMemAllocAsync(&async, size_t{8} << 20, stream) != CUDA_SUCCESS) {
    return 13;
  }
  Sample();
  if (cuMemFreeAsync(async, stream) != CUDA_SUCCESS ||
      cuStreamSynchronize(stream) != CUDA_SUCCESS) {
    return 14;
  }
  Sample();
  if (cuMemFree_v2(p[2]) != CUDA_SUCCESS) return 15;
  Sample();
  FILE* f = fopen(out, "w");
  if (f == nullptr) return 16;
  fprintf(f, "peak_driver_bytes=%zu\n", g_peak_driver);
  fclose(f);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || strcmp(argv[1], "basic") != 0) {
    fprintf(stderr, "usage: cupti_app basic OUT\n");
    return 2;
  }
  return Basic(argv[2]);
}
