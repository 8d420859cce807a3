// A CUDA program with figures known in advance, for ring_run_test: run under `vramscope run`
// (or with the shim preloaded), over the fake driver. Writes what the driver really held for it
// (the fake's charged bytes, sampled after every call) to OUT as `key=value` lines.
//
//   ring_app basic OUT   pooled 1000, 3000 and 1 MiB + 1 bytes, all freed, then 5000 bytes
//                        leaked; exits 3 (the report must carry the status)
//   ring_app kinds OUT   one pooled block, one pitched (1000 x 10), one managed (64 KiB), one
//                        pinned host (4 KiB), all freed; exits 0
//   ring_app oom OUT     device 0 limited to 64 MiB: 40 MiB pooled, then 100 MiB refused (a
//                        capacity OOM), the 40 MiB freed; exits 0
//   ring_app fork OUT    a hooked call before cuInit (the shim and its ring start), then fork:
//                        the child allocates 4096 and 8192, frees the first and exits 0; the
//                        parent waits, allocates 1 MiB, frees it and exits 0
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include <cuda.h>

#include "fake_cuda_control.h"

namespace {

size_t g_peak_driver = 0;

void Sample() { g_peak_driver = std::max(g_peak_driver, vramscope_fake_live_bytes(0)); }

bool Start() {
  CUcontext ctx = nullptr;
  return cuInit(0) == CUDA_SUCCESS && cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS &&
         cuCtxSetCurrent(ctx) == CUDA_SUCCESS;
}

bool Alloc(CUdeviceptr* p, size_t bytes) {
  const bool ok = cuMemAlloc_v2(p, bytes) == CUDA_SUCCESS;
  Sample();
  return ok;
}

bool Free(CUdeviceptr p) {
  const bool ok = cuMemFree_v2(p) == CUDA_SUCCESS;
  Sample();
  return ok;
}

void WriteOut(const char* path) {
  FILE* out = fopen(path, "w");
  if (out == nullptr) return;
  fprintf(out, "peak_driver_bytes=%zu\n", g_peak_driver);
  fclose(out);
}

int Basic(const char* out) {
  if (!Start()) return 10;
  const size_t sizes[3] = {1000, 3000, (size_t{1} << 20) + 1};
  CUdeviceptr p[3] = {};
  for (int i = 0; i < 3; ++i) {
    if (!Alloc(&p[i], sizes[i])) return 11;
  }
  for (int i = 0; i < 3; ++i) {
    if (!Free(p[i])) return 12;
  }
  CUdeviceptr leak = 0;
  if (!Alloc(&leak, 5000)) return 13;
  WriteOut(out);
  return 3;
}

int Kinds(const char* out) {
  if (!Start()) return 10;
  CUdeviceptr pooled = 0;
  CUdeviceptr pitched = 0;
  size_t pitch = 0;
  CUdeviceptr managed = 0;
  void* host = nullptr;
  if (!Alloc(&pooled, 4096)) return 11;
  if (cuMemAllocPitch_v2(&pitched, &pitch, 1000, 10, 4) != CUDA_SUCCESS) return 12;
  Sample();
  if (cuMemAllocManaged(&managed, 65536, CU_MEM_ATTACH_GLOBAL) != CUDA_SUCCESS) return 13;
  Sample();
  if (cuMemHostAlloc(&host, 4096, 0) != CUDA_SUCCESS) return 14;
  if (!Free(pooled) || !Free(pitched) || !Free(managed) || cuMemFreeHost(host) != CUDA_SUCCESS) {
    return 15;
  }
  WriteOut(out);
  FILE* f = fopen(out, "a");
  if (f != nullptr) {
    fprintf(f, "pitch=%zu\n", pitch);
    fclose(f);
  }
  return 0;
}

int Oom(const char* out) {
  if (!Start() || vramscope_fake_set_capacity(0, size_t{64} << 20) != 0) return 10;
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  if (!Alloc(&a, size_t{40} << 20)) return 11;
  if (cuMemAlloc_v2(&b, size_t{100} << 20) != CUDA_ERROR_OUT_OF_MEMORY) return 12;
  if (!Free(a)) return 13;
  WriteOut(out);
  return 0;
}

int Fork(const char* out) {
  size_t free_bytes = 0;
  size_t total = 0;
  // Before cuInit: the driver refuses, but the shim is initialised (and opens its ring).
  (void)cuMemGetInfo_v2(&free_bytes, &total);
  const pid_t pid = fork();
  if (pid < 0) return 20;
  if (pid == 0) {
    CUdeviceptr a = 0;
    CUdeviceptr b = 0;
    if (!Start() || !Alloc(&a, 4096) || !Alloc(&b, 8192) || !Free(a)) exit(21);
    exit(0);  // exit, not _exit: the exit handlers mark the ring exited
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return 22;
  }
  CUdeviceptr p = 0;
  if (!Start() || !Alloc(&p, size_t{1} << 20) || !Free(p)) return 23;
  WriteOut(out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: ring_app basic|kinds|oom|fork OUT\n");
    return 2;
  }
  if (strcmp(argv[1], "basic") == 0) return Basic(argv[2]);
  if (strcmp(argv[1], "kinds") == 0) return Kinds(argv[2]);
  if (strcmp(argv[1], "oom") == 0) return Oom(argv[2]);
  if (strcmp(argv[1], "fork") == 0) return Fork(argv[2]);
  return 2;
}
