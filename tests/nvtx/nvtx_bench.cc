// Host-side costs of NVTX attribution and allocation sites through the preloaded shim over the
// fake driver, with a ring (the bench opens the shim's ring file and hands the slots back every
// 256 iterations, as a drain would, so records are written, not dropped):
//   BM_NvtxPushPop        nvtxRangePushA + nvtxRangePop through NVTX_INJECTION64_PATH
//   BM_AllocFree          4 KiB cuMemAlloc_v2 + cuMemFree_v2; run with VRAMSCOPE_STACKS=1
//                         (the nvtx_bench_stacks entry) for the cost of unwinding a known site
// Not a test: `meson test -C build --benchmark --suite bench nvtx_bench nvtx_bench_stacks`.
#include <benchmark/benchmark.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include <cuda.h>
#include <nvtx3/nvToolsExt.h>

#include "vramscope/ring.h"

namespace {

std::string g_ring_dir;
vramscope_ring_header* g_header = nullptr;

bool InitOnce() {
  static const bool ok = [] {
    CUcontext ctx = nullptr;
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
      return false;
    }
    // The shim opens its ring at its first memory hook: map its header to play the reader.
    CUdeviceptr p = 0;
    if (cuMemAlloc_v2(&p, 4096) != CUDA_SUCCESS || cuMemFree_v2(p) != CUDA_SUCCESS) return false;
    DIR* dir = opendir(g_ring_dir.c_str());
    if (dir == nullptr) return false;
    std::string path;
    while (dirent* entry = readdir(dir)) {
      const std::string name = entry->d_name;
      if (name.size() > 5 && name.substr(name.size() - 5) == ".ring")
        path = g_ring_dir + "/" + name;
    }
    closedir(dir);
    if (path.empty()) return false;
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return false;
    void* map =
        mmap(nullptr, VRAMSCOPE_RING_HEADER_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return false;
    g_header = static_cast<vramscope_ring_header*>(map);
    return true;
  }();
  return ok;
}

// The reader's part: every slot written so far is consumed.
void Drain() {
  __atomic_store_n(&g_header->tail, __atomic_load_n(&g_header->head, __ATOMIC_ACQUIRE),
                   __ATOMIC_RELEASE);
}

void BM_NvtxPushPop(benchmark::State& state) {
  if (!InitOnce()) {
    state.SkipWithError("no driver or no ring");
    return;
  }
  std::size_t i = 0;
  for (auto _ : state) {
    nvtxRangePushA("bench_range");
    nvtxRangePop();
    if ((++i & 255) == 0) Drain();
  }
  state.counters["dropped"] = static_cast<double>(g_header->records_dropped);
}
BENCHMARK(BM_NvtxPushPop);

void BM_AllocFree(benchmark::State& state) {
  if (!InitOnce()) {
    state.SkipWithError("no driver or no ring");
    return;
  }
  std::size_t i = 0;
  for (auto _ : state) {
    CUdeviceptr p = 0;
    if (cuMemAlloc_v2(&p, 4096) != CUDA_SUCCESS || cuMemFree_v2(p) != CUDA_SUCCESS) {
      state.SkipWithError("allocation failed");
      break;
    }
    if ((++i & 255) == 0) Drain();
  }
  state.counters["dropped"] = static_cast<double>(g_header->records_dropped);
}
BENCHMARK(BM_AllocFree);

}  // namespace

int main(int argc, char** argv) {
  char pattern[] = "/tmp/vramscope-nvtx-bench.XXXXXX";
  if (mkdtemp(pattern) == nullptr) return 1;
  g_ring_dir = pattern;
  setenv("VRAMSCOPE_RING_DIR", pattern, 1);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  // The ring file and its directory.
  if (DIR* dir = opendir(pattern)) {
    while (dirent* entry = readdir(dir)) {
      if (entry->d_name[0] != '.') unlink((g_ring_dir + "/" + entry->d_name).c_str());
    }
    closedir(dir);
  }
  rmdir(pattern);
  return 0;
}
