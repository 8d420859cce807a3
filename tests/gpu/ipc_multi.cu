// CUDA IPC between processes, the same under no shim, the shim's pool and passthrough
// (tests/gpu/run_all.sh step 11). Prints one result line (compared across the three runs) and
// timing lines (reported).
//
//   ipc_multi simple N   simpleIPC-like: the parent forks N children before touching CUDA,
//                        exports one buffer (inside a pooled segment: a small block comes first),
//                        each child opens it, writes its slice with a kernel, closes; the parent
//                        verifies every word. Times: the first cudaIpcGetMemHandle, each child's
//                        first open, the median of 20 later open+close pairs.
//   ipc_multi stress N   the exporter frees the exported buffer and reallocates and checks blocks
//                        of the same size N times while the importer keeps writing into the
//                        buffer with kernels: every word the exporter reads back must be its own
//                        (corrupted=0), and the importer's buffer holds the importer's pattern.
//   ipc_multi grow       the time of 64 x 32 MiB cudaMalloc calls (pool growth: cuMemCreate with
//                        or without a shareable handle type; compare VRAMSCOPE_IPC=0).
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#define CK(call)                                                                 \
  do {                                                                           \
    cudaError_t e_ = (call);                                                     \
    if (e_ != cudaSuccess) {                                                     \
      fprintf(stderr, "%d: %s:%d %s: %s\n", getpid(), __FILE__, __LINE__, #call, \
              cudaGetErrorString(e_));                                           \
      exit(3);                                                                   \
    }                                                                            \
  } while (0)

static double Us(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}
static auto Now() { return std::chrono::steady_clock::now(); }

static void WriteAll(int fd, const void* p, size_t n) {
  if (write(fd, p, n) != static_cast<ssize_t>(n)) exit(4);
}
static void ReadAll(int fd, void* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, static_cast<char*>(p) + got, n - got);
    if (r <= 0) exit(5);
    got += static_cast<size_t>(r);
  }
}

__global__ void FillWords(unsigned* p, size_t n, unsigned base) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = base + static_cast<unsigned>(i);
  }
}
__global__ void FillConst(unsigned* p, size_t n, unsigned v) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = v;
  }
}
__global__ void CountNot(const unsigned* p, size_t n, unsigned v, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    mine += p[i] != v;
  }
  if (mine) atomicAdd(bad, mine);
}

static int Simple(int children) {
  const size_t slice_words = (size_t{3} << 20) + 123;  // 12 MiB + : slices cross granules
  const size_t words = slice_words * children;
  std::vector<int> to_child(children), from_child(children);
  std::vector<pid_t> pids;
  for (int c = 0; c < children; ++c) {
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) return 6;
    const pid_t pid = fork();
    if (pid == 0) {
      close(down[1]);
      close(up[0]);
      cudaIpcMemHandle_t h;
      ReadAll(down[0], &h, sizeof(h));
      CK(cudaSetDevice(0));
      CK(cudaFree(nullptr));
      void* p = nullptr;
      auto t0 = Now();
      CK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
      const double first_open = Us(t0, Now());
      FillWords<<<256, 256>>>(static_cast<unsigned*>(p) + c * slice_words, slice_words,
                              0x10000000u * (c + 1));
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      t0 = Now();
      CK(cudaIpcCloseMemHandle(p));
      const double first_close = Us(t0, Now());
      std::vector<double> pairs;
      for (int i = 0; i < 20; ++i) {
        t0 = Now();
        CK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
        CK(cudaIpcCloseMemHandle(p));
        pairs.push_back(Us(t0, Now()));
      }
      std::sort(pairs.begin(), pairs.end());
      double times[3] = {first_open, first_close, pairs[pairs.size() / 2]};
      WriteAll(up[1], times, sizeof(times));
      _exit(0);
    }
    close(down[0]);
    close(up[1]);
    to_child[c] = down[1];
    from_child[c] = up[0];
    pids.push_back(pid);
  }
  CK(cudaSetDevice(0));
  void* small = nullptr;
  CK(cudaMalloc(&small, 1000));
  unsigned* buf = nullptr;
  CK(cudaMalloc(&buf, words * sizeof(unsigned)));
  CK(cudaMemset(buf, 0, words * sizeof(unsigned)));
  CK(cudaDeviceSynchronize());
  cudaIpcMemHandle_t h;
  auto t0 = Now();
  CK(cudaIpcGetMemHandle(&h, buf));
  const double export_us = Us(t0, Now());
  for (int c = 0; c < children; ++c) WriteAll(to_child[c], &h, sizeof(h));
  double open_us = 0, close_us = 0, pair_us = 0;
  for (int c = 0; c < children; ++c) {
    double times[3];
    ReadAll(from_child[c], times, sizeof(times));
    open_us = std::max(open_us, times[0]);
    close_us = std::max(close_us, times[1]);
    pair_us = std::max(pair_us, times[2]);
  }
  int failed_children = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed_children += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::vector<unsigned> host(words);
  CK(cudaMemcpy(host.data(), buf, words * sizeof(unsigned), cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (int c = 0; c < children; ++c) {
    for (size_t i = 0; i < slice_words; ++i) {
      bad += host[c * slice_words + i] != 0x10000000u * (c + 1) + static_cast<unsigned>(i);
    }
  }
  CK(cudaFree(buf));
  CK(cudaFree(small));
  printf("simple children=%d words=%zu bad=%zu failed_children=%d\n", children, words, bad,
         failed_children);
  fprintf(stderr, "timing export_us=%.1f first_open_us=%.1f first_close_us=%.1f pair_us=%.1f\n",
          export_us, open_us, close_us, pair_us);
  return bad == 0 && failed_children == 0 ? 0 : 1;
}

static int Stress(int rounds) {
  const size_t words = size_t{2} << 20;  // 8 MiB
  const unsigned kImporter = 0xA5A5A5A5u;
  int down[2], up[2];
  if (pipe(down) != 0 || pipe(up) != 0) return 6;
  const pid_t pid = fork();
  if (pid == 0) {
    close(down[1]);
    close(up[0]);
    cudaIpcMemHandle_t h;
    ReadAll(down[0], &h, sizeof(h));
    CK(cudaSetDevice(0));
    void* p = nullptr;
    CK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
    char go = 1;
    WriteAll(up[1], &go, 1);
    // Keep writing until the exporter says stop (its rounds run meanwhile).
    fcntl(down[0], F_SETFL, O_NONBLOCK);
    long launches = 0;
    for (;;) {
      FillConst<<<128, 256>>>(static_cast<unsigned*>(p), words, kImporter);
      ++launches;
      if (launches % 8 == 0) {
        CK(cudaDeviceSynchronize());
        char stop = 0;
        if (read(down[0], &stop, 1) == 1) break;
      }
    }
    CK(cudaDeviceSynchronize());
    unsigned long long* bad = nullptr;
    CK(cudaMalloc(&bad, sizeof(*bad)));
    CK(cudaMemset(bad, 0, sizeof(*bad)));
    CountNot<<<128, 256>>>(static_cast<unsigned*>(p), words, kImporter, bad);
    unsigned long long own_bad = 0;
    CK(cudaMemcpy(&own_bad, bad, sizeof(own_bad), cudaMemcpyDeviceToHost));
    CK(cudaIpcCloseMemHandle(p));
    WriteAll(up[1], &own_bad, sizeof(own_bad));
    _exit(0);
  }
  close(down[0]);
  close(up[1]);
  CK(cudaSetDevice(0));
  unsigned* buf = nullptr;
  CK(cudaMalloc(&buf, words * sizeof(unsigned)));
  cudaIpcMemHandle_t h;
  CK(cudaIpcGetMemHandle(&h, buf));
  WriteAll(down[1], &h, sizeof(h));
  char go = 0;
  ReadAll(up[0], &go, 1);
  CK(cudaFree(buf));  // the importer still writes into it
  unsigned long long* bad = nullptr;
  CK(cudaMalloc(&bad, sizeof(*bad)));
  CK(cudaMemset(bad, 0, sizeof(*bad)));
  std::vector<unsigned*> held;
  for (int r = 0; r < rounds; ++r) {
    unsigned* q = nullptr;
    CK(cudaMalloc(&q, words * sizeof(unsigned)));
    const unsigned mine = 0x1000u + static_cast<unsigned>(r);
    FillConst<<<128, 256>>>(q, words, mine);
    CK(cudaDeviceSynchronize());
    CountNot<<<128, 256>>>(q, words, mine, bad);
    CK(cudaDeviceSynchronize());
    if (r % 4 == 0) {
      held.push_back(q);  // some stay allocated, so later rounds take other addresses too
    } else {
      CK(cudaFree(q));
    }
  }
  unsigned long long corrupted = 0;
  CK(cudaMemcpy(&corrupted, bad, sizeof(corrupted), cudaMemcpyDeviceToHost));
  char stop = 1;
  WriteAll(down[1], &stop, 1);
  unsigned long long importer_bad = ~0ull;
  ReadAll(up[0], &importer_bad, sizeof(importer_bad));
  int status = 0;
  waitpid(pid, &status, 0);
  for (unsigned* q : held) CK(cudaFree(q));
  printf("stress rounds=%d corrupted=%llu importer_bad=%llu importer_status=%d\n", rounds,
         corrupted, importer_bad, WIFEXITED(status) ? WEXITSTATUS(status) : 128);
  return corrupted == 0 && importer_bad == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0
                                                                                              : 1;
}

static int Grow() {
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  std::vector<void*> blocks(64);
  auto t0 = Now();
  for (void*& p : blocks) CK(cudaMalloc(&p, size_t{32} << 20));
  const double grow_us = Us(t0, Now());
  for (void* p : blocks) CK(cudaFree(p));
  printf("grow blocks=64\n");
  fprintf(stderr, "timing grow_ms=%.2f\n", grow_us / 1000);
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 2 && strcmp(argv[1], "simple") == 0) return Simple(argc > 2 ? atoi(argv[2]) : 4);
  if (argc >= 2 && strcmp(argv[1], "stress") == 0) return Stress(argc > 2 ? atoi(argv[2]) : 200);
  if (argc >= 2 && strcmp(argv[1], "grow") == 0) return Grow();
  fprintf(stderr, "usage: ipc_multi simple N | stress ROUNDS | grow\n");
  return 2;
}
