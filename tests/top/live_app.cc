// A CUDA program for the `vramscope run --live` tests, over the fake driver (tests/fakes): with
// the shim preloaded it allocates 8, 16 and 32 MiB on device 0 (56 MiB), says so on stdout,
// then waits until STOPFILE exists (at most 120 s), frees everything and exits 0.
//
//   top_live_app STOPFILE
#include <stdio.h>
#include <unistd.h>

#include <cuda.h>

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: top_live_app STOPFILE\n");
    return 64;
  }
  CUcontext ctx = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
      cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    fprintf(stderr, "top_live_app: no CUDA context\n");
    return 10;
  }
  const size_t mib = size_t{1} << 20;
  const size_t sizes[3] = {8 * mib, 16 * mib, 32 * mib};
  CUdeviceptr blocks[3] = {};
  for (int i = 0; i < 3; ++i) {
    if (cuMemAlloc_v2(&blocks[i], sizes[i]) != CUDA_SUCCESS) {
      fprintf(stderr, "top_live_app: allocation %d failed\n", i);
      return 11;
    }
  }
  printf("live app: allocated 56 MiB\n");
  fflush(stdout);
  // The test ends the program when it has seen what it wanted; 120 s bounds a forgotten one.
  for (int i = 0; i < 2400 && access(argv[1], F_OK) != 0; ++i) usleep(50000);
  for (CUdeviceptr block : blocks) cuMemFree_v2(block);
  return 0;
}
