// CUDA IPC of pooled memory between real processes (interposer/shim/ipc.h), the real shim over
// the fake driver, whose VMM shareable handles are memfds: bytes written by one process are
// read by the other. Every test forks its processes from a parent that never touches the
// driver (a fork child of a process that initialised CUDA cannot use it), and passes handles
// and go-aheads through pipes; one importer is a fresh exec of this binary.
#include "ipc.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <spawn.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <cuda.h>

#include "routes.h"

extern char** environ;

namespace vramscope::fake {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
using vramscope::interposer::IpcHandleCheck;
using vramscope::interposer::IpcWireHandle;

struct Pipe {
  int r = -1;
  int w = -1;
  Pipe() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) == 0) {
      r = fds[0];
      w = fds[1];
    }
  }
};

bool Send(int fd, const void* data, size_t n) {
  return write(fd, data, n) == static_cast<ssize_t>(n);
}
bool Recv(int fd, void* data, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = read(fd, static_cast<char*>(data) + got, n - got);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}
void Token(int fd) {
  const char c = 'k';
  (void)Send(fd, &c, 1);
}
bool Await(int fd) {
  char c = 0;
  return Recv(fd, &c, 1) && c == 'k';
}

// A child process running `body`; its exit code is body's result (and 99 on a failed check).
pid_t Child(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(60);  // a peer that failed leaves this one waiting: end it rather than hang the test
    _exit(body());
  }
  return pid;
}
int Join(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

#define CHECK_OR(cond, code)                                                                \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      fprintf(stderr, "child %d: %s:%d: %s failed\n", getpid(), __FILE__, __LINE__, #cond); \
      return code;                                                                          \
    }                                                                                       \
  } while (0)

// Loads the driver by `route` and makes device 0's primary context current.
bool Init(DriverApi* api, const std::string& route) {
  std::string error;
  const bool loaded = route == "dlsym"         ? LoadByDlsym(api, &error)
                      : route == "procaddress" ? LoadByProcAddress(api, &error)
                                               : LoadDirect(api, &error);
  if (!loaded || api->cuInit(0) != CUDA_SUCCESS) return false;
  CUcontext ctx = nullptr;
  return api->cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS &&
         api->cuCtxSetCurrent(ctx) == CUDA_SUCCESS;
}

unsigned char Pattern(size_t i, unsigned seed) {
  return static_cast<unsigned char>((i * 131 + seed) ^ (i >> 12));
}
void Fill(CUdeviceptr p, size_t n, unsigned seed) {
  auto* b = reinterpret_cast<unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) b[i] = Pattern(i, seed);
}
bool Holds(CUdeviceptr p, size_t n, unsigned seed) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    if (b[i] != Pattern(i, seed)) return false;
  }
  return true;
}

// The exporter side of most tests: allocates a small block first (so the exported block starts
// inside its chunk) and a block of `bytes` spanning several 2 MiB granules, fills it, exports it.
struct Exported {
  CUdeviceptr small = 0;
  CUdeviceptr block = 0;
  CUipcMemHandle handle{};
};
bool Export(DriverApi& api, size_t bytes, unsigned seed, Exported* out) {
  if (api.cuMemAlloc_v2(&out->small, 1000) != CUDA_SUCCESS ||
      api.cuMemAlloc_v2(&out->block, bytes) != CUDA_SUCCESS) {
    return false;
  }
  Fill(out->block, bytes, seed);
  return api.cuIpcGetMemHandle(&out->handle, out->block) == CUDA_SUCCESS;
}

const size_t kBlock = 5 * kMiB + 1000;  // three granules at least, not granule-aligned

// The physical allocations (pool Map chunks) the export of `handle` lists, read from the
// exporter's own table (so only in the exporting process); 0 if unreadable.
std::uint32_t ChunksOf(const CUipcMemHandle& handle) {
  const auto* h = reinterpret_cast<const IpcWireHandle*>(handle.reserved);
  void* p =
      mmap(nullptr, sizeof(vramscope::interposer::IpcTable), PROT_READ, MAP_SHARED, h->table_fd, 0);
  if (p == MAP_FAILED) return 0;
  const std::uint32_t count =
      static_cast<const vramscope::interposer::IpcTable*>(p)->slots[h->slot].chunk_count;
  munmap(p, sizeof(vramscope::interposer::IpcTable));
  return count;
}

class IpcTest : public ::testing::TestWithParam<std::string> {};

// Exact bytes both ways, at offsets inside a multi-granule block; the same address for a
// second open; close twice for two opens; the handle re-exported is the same handle.
TEST_P(IpcTest, BytesBothWaysOpenTwiceAndClose) {
  const std::string route = GetParam();
  Pipe to_importer;
  Pipe to_exporter;
  const pid_t exporter = Child([&]() -> int {
    DriverApi api;
    CHECK_OR(Init(&api, route), 10);
    Exported e;
    CHECK_OR(Export(api, kBlock, 7, &e), 11);
    CHECK_OR(e.block != e.small, 12);
    // The block starts in the chunk the small block's growth mapped and goes on into the next:
    // offsets inside a block that spans physical allocations.
    CHECK_OR(ChunksOf(e.handle) >= 2, 22);
    CUipcMemHandle again{};
    CHECK_OR(api.cuIpcGetMemHandle(&again, e.block + 4096) == CUDA_SUCCESS, 13);
    CHECK_OR(memcmp(&again, &e.handle, sizeof(again)) == 0, 14);  // interior pointer: same block
    CHECK_OR(Send(to_importer.w, &e.handle, sizeof(e.handle)), 15);
    CHECK_OR(Await(to_exporter.r), 16);
    // The importer wrote the second half.
    CHECK_OR(Holds(e.block, kBlock / 2, 7), 17);
    CHECK_OR(Holds(e.block + kBlock / 2, kBlock - kBlock / 2, 9), 18);
    Token(to_importer.w);
    CHECK_OR(Await(to_exporter.r), 19);  // importer closed
    CHECK_OR(api.cuMemFree_v2(e.block) == CUDA_SUCCESS, 20);
    CHECK_OR(api.cuMemFree_v2(e.small) == CUDA_SUCCESS, 21);
    return 0;
  });
  const pid_t importer = Child([&]() -> int {
    DriverApi api;
    CHECK_OR(Init(&api, route), 30);
    CUipcMemHandle handle{};
    CHECK_OR(Recv(to_importer.r, &handle, sizeof(handle)), 31);
    CUdeviceptr p = 0;
    CUdeviceptr q = 0;
    CHECK_OR(
        api.cuIpcOpenMemHandle_v2(&p, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS,
        32);
    CHECK_OR(
        api.cuIpcOpenMemHandle_v2(&q, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS,
        33);
    CHECK_OR(p == q, 34);
    CHECK_OR(Holds(p, kBlock, 7), 35);
    Fill(p + kBlock / 2, kBlock - kBlock / 2, 9);
    Token(to_exporter.w);
    CHECK_OR(Await(to_importer.r), 36);
    CHECK_OR(api.cuIpcCloseMemHandle(p) == CUDA_SUCCESS, 37);
    CHECK_OR(Holds(q, kBlock / 2, 7), 38);  // still open once
    CHECK_OR(api.cuIpcCloseMemHandle(q) == CUDA_SUCCESS, 39);
    CHECK_OR(api.cuIpcCloseMemHandle(q) != CUDA_SUCCESS, 40);  // closed: not ours any more
    Token(to_exporter.w);
    return 0;
  });
  EXPECT_EQ(Join(exporter), 0);
  EXPECT_EQ(Join(importer), 0);
}

// The pre-11.0 name cuIpcOpenMemHandle (same arguments), as an old binary, a ctypes program
// (dlsym) or cuGetProcAddress with an old version finds it: the shim's too.
TEST(IpcRoutes, PreElevenNameByDlsymAndProcAddress) {
  Pipe to_importer;
  Pipe to_exporter;
  const pid_t exporter = Child([&]() -> int {
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 10);
    Exported e;
    CHECK_OR(Export(api, kBlock, 101, &e), 11);
    CHECK_OR(Send(to_importer.w, &e.handle, sizeof(e.handle)), 12);
    CHECK_OR(Await(to_exporter.r), 13);
    return 0;
  });
  const pid_t importer = Child([&]() -> int {
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 30);
    using OpenFn = CUresult (*)(CUdeviceptr*, CUipcMemHandle, unsigned int);
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK_OR(lib != nullptr, 31);
    auto by_dlsym = reinterpret_cast<OpenFn>(dlsym(lib, "cuIpcOpenMemHandle"));
    void* found = nullptr;
    CHECK_OR(
        api.cuGetProcAddress_v2("cuIpcOpenMemHandle", &found, 4010, 0, nullptr) == CUDA_SUCCESS,
        32);
    auto by_proc = reinterpret_cast<OpenFn>(found);
    CHECK_OR(by_dlsym != nullptr && by_proc != nullptr, 33);
    CHECK_OR(ModuleOf(reinterpret_cast<void*>(by_dlsym)).find("libvramscope") != std::string::npos,
             34);
    CHECK_OR(ModuleOf(reinterpret_cast<void*>(by_proc)).find("libvramscope") != std::string::npos,
             35);
    CUipcMemHandle handle{};
    CHECK_OR(Recv(to_importer.r, &handle, sizeof(handle)), 36);
    CUdeviceptr p = 0;
    CUdeviceptr q = 0;
    CHECK_OR(by_dlsym(&p, handle, 0) == CUDA_SUCCESS, 37);
    CHECK_OR(by_proc(&q, handle, 0) == CUDA_SUCCESS && q == p, 38);
    CHECK_OR(Holds(p, kBlock, 101), 39);
    CHECK_OR(api.cuIpcCloseMemHandle(p) == CUDA_SUCCESS, 40);
    CHECK_OR(api.cuIpcCloseMemHandle(q) == CUDA_SUCCESS, 41);
    Token(to_exporter.w);
    return 0;
  });
  EXPECT_EQ(Join(exporter), 0);
  EXPECT_EQ(Join(importer), 0);
}

// simpleIPC's shape: several importing processes at once, each writing its own slice of one
// exported block; the exporter sees every slice.
TEST(IpcMany, ThreeImportersWriteTheirSlices) {
  constexpr int kImporters = 3;
  const size_t slice = kBlock / kImporters;
  Pipe to_importer[kImporters];
  Pipe to_exporter;
  const pid_t exporter = Child([&]() -> int {
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 10);
    Exported e;
    CHECK_OR(Export(api, kBlock, 81, &e), 11);
    for (auto& pipe : to_importer) CHECK_OR(Send(pipe.w, &e.handle, sizeof(e.handle)), 12);
    for (int i = 0; i < kImporters; ++i) CHECK_OR(Await(to_exporter.r), 13);
    for (int i = 0; i < kImporters; ++i) {
      CHECK_OR(Holds(e.block + i * slice, slice, 90 + i), 14);
    }
    CHECK_OR(api.cuMemFree_v2(e.block) == CUDA_SUCCESS, 15);
    return 0;
  });
  pid_t importers[kImporters];
  for (int i = 0; i < kImporters; ++i) {
    importers[i] = Child([&, i]() -> int {
      DriverApi api;
      CHECK_OR(Init(&api, "direct"), 30);
      CUipcMemHandle handle{};
      CHECK_OR(Recv(to_importer[i].r, &handle, sizeof(handle)), 31);
      CUdeviceptr p = 0;
      CHECK_OR(api.cuIpcOpenMemHandle_v2(&p, handle, 0) == CUDA_SUCCESS, 32);
      Fill(p + i * slice, slice, 90 + i);
      CHECK_OR(api.cuIpcCloseMemHandle(p) == CUDA_SUCCESS, 33);
      Token(to_exporter.w);
      return 0;
    });
  }
  for (pid_t pid : importers) EXPECT_EQ(Join(pid), 0);
  EXPECT_EQ(Join(exporter), 0);
}

// A block larger than one physical piece (VRAMSCOPE_VMM_PIECE, 64 MiB by default): the pool's
// Map holds several handles, the export lists each, and the importer sees and writes the whole
// block through them.
TEST(IpcMany, BlockOfSeveralPiecesRoundTrips) {
  constexpr size_t kBig = 200 * kMiB + 1000;
  Pipe to_importer;
  Pipe to_exporter;
  const pid_t exporter = Child([&]() -> int {
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 10);
    Exported e;
    CHECK_OR(Export(api, kBig, 61, &e), 11);
    CHECK_OR(ChunksOf(e.handle) >= 3, 12);  // 200 MiB over 64 MiB pieces
    CHECK_OR(Send(to_importer.w, &e.handle, sizeof(e.handle)), 13);
    CHECK_OR(Await(to_exporter.r), 14);
    CHECK_OR(Holds(e.block, kBig, 62), 15);
    CHECK_OR(api.cuMemFree_v2(e.block) == CUDA_SUCCESS, 16);
    return 0;
  });
  const pid_t importer = Child([&]() -> int {
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 30);
    CUipcMemHandle handle{};
    CHECK_OR(Recv(to_importer.r, &handle, sizeof(handle)), 31);
    CUdeviceptr p = 0;
    CHECK_OR(api.cuIpcOpenMemHandle_v2(&p, handle, 0) == CUDA_SUCCESS, 32);
    CHECK_OR(Holds(p, kBig, 61), 33);
    Fill(p, kBig, 62);
    CHECK_OR(api.cuIpcCloseMemHandle(p) == CUDA_SUCCESS, 34);
    Token(to_exporter.w);
    return 0;
  });
  EXPECT_EQ(Join(importer), 0);
  EXPECT_EQ(Join(exporter), 0);
}

INSTANTIATE_TEST_SUITE_P(Routes, IpcTest, ::testing::Values("direct", "dlsym", "procaddress"));

// The exporter frees the block while the importer holds it: the pool hands it to nobody (the
// importer's bytes survive the exporter's reallocations), the handle opens no more, and once
// the importer closed the memory is the pool's again.
TEST(IpcLifetime, ExporterFreesBeforeTheImporterCloses) {
  Pipe to_importer;
  Pipe to_exporter;
  const pid_t exporter = Child([&]() -> int {
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 10);
    Exported e;
    CHECK_OR(Export(api, kBlock, 3, &e), 11);
    CHECK_OR(Send(to_importer.w, &e.handle, sizeof(e.handle)), 12);
    CHECK_OR(Await(to_exporter.r), 13);  // opened
    CHECK_OR(api.cuMemFree_v2(e.block) == CUDA_SUCCESS, 14);
    CHECK_OR(api.cuMemFree_v2(e.block) == CUDA_ERROR_INVALID_VALUE, 15);  // a double free
    // Churn: none of these may land on the importer's block.
    std::vector<CUdeviceptr> blocks;
    for (int i = 0; i < 16; ++i) {
      CUdeviceptr p = 0;
      CHECK_OR(api.cuMemAlloc_v2(&p, kBlock) == CUDA_SUCCESS, 16);
      CHECK_OR(p + kBlock <= e.block || p >= e.block + kBlock, 17);
      memset(reinterpret_cast<void*>(p), 0, kBlock);
      blocks.push_back(p);
    }
    for (CUdeviceptr p : blocks) CHECK_OR(api.cuMemFree_v2(p) == CUDA_SUCCESS, 18);
    Token(to_importer.w);
    CHECK_OR(Await(to_exporter.r), 19);  // the importer closed
    // The deferred free went through: a free polls it, then the block is allocatable again.
    CUdeviceptr poke = 0;
    CHECK_OR(api.cuMemAlloc_v2(&poke, 512) == CUDA_SUCCESS, 20);
    CHECK_OR(api.cuMemFree_v2(poke) == CUDA_SUCCESS, 21);
    bool reused = false;
    for (int i = 0; i < 32 && !reused; ++i) {
      CUdeviceptr p = 0;
      CHECK_OR(api.cuCtxSynchronize() == CUDA_SUCCESS, 22);
      CHECK_OR(api.cuMemAlloc_v2(&p, kBlock) == CUDA_SUCCESS, 23);
      reused = p == e.block;
    }
    CHECK_OR(reused, 24);
    return 0;
  });
  const pid_t importer = Child([&]() -> int {
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 30);
    CUipcMemHandle handle{};
    CHECK_OR(Recv(to_importer.r, &handle, sizeof(handle)), 31);
    CUdeviceptr p = 0;
    CHECK_OR(api.cuIpcOpenMemHandle_v2(&p, handle, 0) == CUDA_SUCCESS, 32);
    Fill(p, kBlock, 5);
    Token(to_exporter.w);
    CHECK_OR(Await(to_importer.r), 33);  // the exporter freed and churned
    CHECK_OR(Holds(p, kBlock, 5), 34);
    CUdeviceptr again = 0;
    // Opened already here: the same mapping, whatever the exporter did.
    CHECK_OR(api.cuIpcOpenMemHandle_v2(&again, handle, 0) == CUDA_SUCCESS && again == p, 35);
    CHECK_OR(api.cuIpcCloseMemHandle(again) == CUDA_SUCCESS, 36);
    CHECK_OR(api.cuIpcCloseMemHandle(p) == CUDA_SUCCESS, 37);
    // Freed by its owner: a new open is refused.
    CHECK_OR(api.cuIpcOpenMemHandle_v2(&again, handle, 0) == CUDA_ERROR_INVALID_HANDLE, 38);
    Token(to_exporter.w);
    return 0;
  });
  EXPECT_EQ(Join(exporter), 0);
  EXPECT_EQ(Join(importer), 0);
}

// An importer killed while it holds the block: the exporter's free does not wait for it (its
// holder entry names a process that is gone), so the block is the pool's again.
TEST(IpcLifetime, ImporterKilledWhileHoldingTheBlock) {
  Pipe to_importer;
  Pipe to_exporter;
  Pipe importer_gone;
  const pid_t exporter = Child([&]() -> int {
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 10);
    Exported e;
    CHECK_OR(Export(api, kBlock, 71, &e), 11);
    CHECK_OR(Send(to_importer.w, &e.handle, sizeof(e.handle)), 12);
    CHECK_OR(Await(importer_gone.r), 13);  // opened, then killed
    CHECK_OR(api.cuMemFree_v2(e.block) == CUDA_SUCCESS, 14);
    bool reused = false;
    for (int i = 0; i < 32 && !reused; ++i) {
      CUdeviceptr p = 0;
      CHECK_OR(api.cuCtxSynchronize() == CUDA_SUCCESS, 15);
      CHECK_OR(api.cuMemAlloc_v2(&p, kBlock) == CUDA_SUCCESS, 16);
      reused = p == e.block;
    }
    CHECK_OR(reused, 17);
    return 0;
  });
  const pid_t importer = Child([&]() -> int {
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 30);
    CUipcMemHandle handle{};
    CHECK_OR(Recv(to_importer.r, &handle, sizeof(handle)), 31);
    CUdeviceptr p = 0;
    CHECK_OR(api.cuIpcOpenMemHandle_v2(&p, handle, 0) == CUDA_SUCCESS, 32);
    Token(to_exporter.w);
    pause();  // killed here, holding the block
    return 33;
  });
  ASSERT_TRUE(Await(to_exporter.r));
  kill(importer, SIGKILL);
  EXPECT_EQ(Join(importer), 128 + SIGKILL);
  Token(importer_gone.w);
  EXPECT_EQ(Join(exporter), 0);
}

// The exporter exits (reaped by the parent) while the importer holds the block: the importer's
// bytes live on (its imported handle keeps the memory), and the handle is stale for new opens.
TEST(IpcLifetime, ExporterExitsFirst) {
  Pipe to_importer;
  Pipe to_exporter;
  Pipe exporter_gone;
  const pid_t exporter = Child([&]() -> int {
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 10);
    Exported e;
    CHECK_OR(Export(api, kBlock, 13, &e), 11);
    CHECK_OR(Send(to_importer.w, &e.handle, sizeof(e.handle)), 12);
    CHECK_OR(Await(to_exporter.r), 13);
    return 0;
  });
  const pid_t importer = Child([&]() -> int {
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 30);
    CUipcMemHandle handle{};
    CHECK_OR(Recv(to_importer.r, &handle, sizeof(handle)), 31);
    CUdeviceptr p = 0;
    CHECK_OR(api.cuIpcOpenMemHandle_v2(&p, handle, 0) == CUDA_SUCCESS, 32);
    Token(to_exporter.w);
    CHECK_OR(Await(exporter_gone.r), 33);
    CHECK_OR(Holds(p, kBlock, 13), 34);
    Fill(p, kBlock, 14);
    CHECK_OR(Holds(p, kBlock, 14), 35);
    // A second process-level open needs the exporter: stale now.
    CUipcMemHandle forged = handle;
    auto* h = reinterpret_cast<IpcWireHandle*>(forged.reserved);
    h->nonce ^= 1;
    h->check = IpcHandleCheck(*h);
    CUdeviceptr q = 0;
    CHECK_OR(api.cuIpcOpenMemHandle_v2(&q, forged, 0) == CUDA_ERROR_INVALID_HANDLE, 36);
    CHECK_OR(api.cuIpcCloseMemHandle(p) == CUDA_SUCCESS, 37);
    CHECK_OR(api.cuIpcOpenMemHandle_v2(&q, handle, 0) == CUDA_ERROR_INVALID_HANDLE, 38);
    return 0;
  });
  EXPECT_EQ(Join(exporter), 0);
  Token(exporter_gone.w);
  EXPECT_EQ(Join(importer), 0);
}

// pidfd_getfd refused (a seccomp filter: what Yama's ptrace rules do to a child importing its
// parent's memory), no pidfds at all (an old kernel, a container's seccomp profile), or switched
// off: the exporter's SCM_RIGHTS service answers instead, for every open.
void RefusePidfds(bool open_too) {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_pidfd_getfd, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K,
               static_cast<__u32>(open_too ? SYS_pidfd_open : SYS_pidfd_getfd), 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  (void)prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  (void)prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program);
}

enum class Refuse { kGetfd, kPidfds, kSetting };

void FallbackRoundTrip(Refuse refuse) {
  Pipe to_importer;
  Pipe to_exporter;
  const pid_t exporter = Child([&]() -> int {
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 10);
    Exported e;
    CHECK_OR(Export(api, kBlock, 21, &e), 11);
    // A second block: the importer's second open from this exporter takes the same way.
    CUdeviceptr second = 0;
    CHECK_OR(api.cuMemAlloc_v2(&second, 3 * kMiB) == CUDA_SUCCESS, 15);
    Fill(second, 3 * kMiB, 23);
    CUipcMemHandle second_handle{};
    CHECK_OR(api.cuIpcGetMemHandle(&second_handle, second) == CUDA_SUCCESS, 16);
    CHECK_OR(Send(to_importer.w, &e.handle, sizeof(e.handle)), 12);
    CHECK_OR(Send(to_importer.w, &second_handle, sizeof(second_handle)), 17);
    CHECK_OR(Await(to_exporter.r), 13);
    CHECK_OR(Holds(e.block, kBlock, 22), 14);
    CHECK_OR(Holds(second, 3 * kMiB, 24), 18);
    return 0;
  });
  const pid_t importer = Child([&]() -> int {
    if (refuse != Refuse::kSetting) {
      RefusePidfds(refuse == Refuse::kPidfds);
      const int probe = static_cast<int>(syscall(SYS_pidfd_getfd, -1, 0, 0));
      CHECK_OR(probe < 0 && errno == EPERM, 28);  // the filter is in place
      const int opened = static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0));
      CHECK_OR((opened < 0) == (refuse == Refuse::kPidfds), 29);
      if (opened >= 0) close(opened);
    } else {
      setenv("VRAMSCOPE_IPC_PIDFD", "0", 1);
    }
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 30);
    CUipcMemHandle handle{};
    CUipcMemHandle second_handle{};
    CHECK_OR(Recv(to_importer.r, &handle, sizeof(handle)), 31);
    CHECK_OR(Recv(to_importer.r, &second_handle, sizeof(second_handle)), 35);
    CUdeviceptr p = 0;
    CHECK_OR(api.cuIpcOpenMemHandle_v2(&p, handle, 0) == CUDA_SUCCESS, 32);
    CHECK_OR(Holds(p, kBlock, 21), 33);
    Fill(p, kBlock, 22);
    CUdeviceptr q = 0;
    CHECK_OR(api.cuIpcOpenMemHandle_v2(&q, second_handle, 0) == CUDA_SUCCESS, 36);
    CHECK_OR(Holds(q, 3 * kMiB, 23), 37);
    Fill(q, 3 * kMiB, 24);
    CHECK_OR(api.cuIpcCloseMemHandle(p) == CUDA_SUCCESS, 34);
    CHECK_OR(api.cuIpcCloseMemHandle(q) == CUDA_SUCCESS, 38);
    Token(to_exporter.w);
    return 0;
  });
  EXPECT_EQ(Join(exporter), 0);
  EXPECT_EQ(Join(importer), 0);
}

TEST(IpcFallback, PidfdGetfdRefusedUsesTheService) { FallbackRoundTrip(Refuse::kGetfd); }
TEST(IpcFallback, NoPidfdsAtAllUsesTheService) { FallbackRoundTrip(Refuse::kPidfds); }
TEST(IpcFallback, PidfdOffUsesTheService) { FallbackRoundTrip(Refuse::kSetting); }

// Forged, damaged, truncated and foreign handles: an error, never a crash or a mapping.
TEST(IpcBadInput, ForgedStaleAndTruncatedHandles) {
  Pipe to_importer;
  Pipe to_exporter;
  const pid_t exporter = Child([&]() -> int {
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 10);
    Exported e;
    CHECK_OR(Export(api, kBlock, 31, &e), 11);
    CHECK_OR(Send(to_importer.w, &e.handle, sizeof(e.handle)), 12);
    CHECK_OR(Await(to_exporter.r), 13);
    return 0;
  });
  const pid_t importer = Child([&]() -> int {
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 30);
    CUipcMemHandle good{};
    CHECK_OR(Recv(to_importer.r, &good, sizeof(good)), 31);
    auto open = [&](CUipcMemHandle h) {
      CUdeviceptr p = 0;
      const CUresult r = api.cuIpcOpenMemHandle_v2(&p, h, 0);
      return r == CUDA_SUCCESS ? (api.cuIpcCloseMemHandle(p), CUDA_SUCCESS) : r;
    };
    auto forge = [&](const std::function<void(IpcWireHandle*)>& change) {
      CUipcMemHandle h = good;
      auto* w = reinterpret_cast<IpcWireHandle*>(h.reserved);
      change(w);
      w->check = IpcHandleCheck(*w);
      return h;
    };
    // Truncated (the tail zeroed) and damaged (one bit, check not redone): malformed.
    CUipcMemHandle truncated = good;
    memset(truncated.reserved + 40, 0, 24);
    CHECK_OR(open(truncated) == CUDA_ERROR_INVALID_VALUE, 32);
    CUipcMemHandle damaged = good;
    damaged.reserved[30] ^= 4;
    CHECK_OR(open(damaged) == CUDA_ERROR_INVALID_VALUE, 33);
    // Another descriptor of the exporter (its stdin, its stderr): not its export table. (Before
    // any open: once this process has the exporter's table, the number is not used again.)
    CHECK_OR(open(forge([](IpcWireHandle* w) { w->table_fd = 0; })) == CUDA_ERROR_INVALID_HANDLE,
             38);
    CHECK_OR(open(forge([](IpcWireHandle* w) { w->table_fd = 2; })) == CUDA_ERROR_INVALID_HANDLE,
             39);
    // Well-formed but naming nothing the exporter registered.
    CHECK_OR(open(forge([](IpcWireHandle* w) { w->nonce += 1; })) == CUDA_ERROR_INVALID_HANDLE, 34);
    CHECK_OR(open(forge([](IpcWireHandle* w) { w->slot += 1; })) == CUDA_ERROR_INVALID_HANDLE, 35);
    CHECK_OR(open(forge([](IpcWireHandle* w) { w->generation += 1; })) == CUDA_ERROR_INVALID_HANDLE,
             36);
    CHECK_OR(open(forge([](IpcWireHandle* w) { w->slot = 1u << 30; })) == CUDA_ERROR_INVALID_VALUE,
             37);
    // Identity: a start time that is not the exporter's (a recycled pid), another pid.
    CHECK_OR(open(forge([](IpcWireHandle* w) { w->start_time += 1; })) == CUDA_ERROR_INVALID_HANDLE,
             40);
    CHECK_OR(open(forge([](IpcWireHandle* w) { w->pid = 1; })) == CUDA_ERROR_INVALID_HANDLE, 41);
    // Offset or size beyond what the slot holds.
    CHECK_OR(open(forge([](IpcWireHandle* w) { w->size += 1 << 30; })) == CUDA_ERROR_INVALID_HANDLE,
             42);
    CHECK_OR(open(forge([](IpcWireHandle* w) { w->offset += 4096; })) == CUDA_ERROR_INVALID_HANDLE,
             43);
    // A handle without the magic is the driver's (which refuses this one).
    CUipcMemHandle zero{};
    CHECK_OR(open(zero) != CUDA_SUCCESS, 44);
    // The good one still works after all that.
    CHECK_OR(open(good) == CUDA_SUCCESS, 45);
    Token(to_exporter.w);
    return 0;
  });
  EXPECT_EQ(Join(exporter), 0);
  EXPECT_EQ(Join(importer), 0);
}

// A device that reports POSIX descriptors but refuses to create shareable memory: allocation
// works (plain memory), and IPC of pooled memory is refused with the old rule, never a handle.
TEST(IpcFallback, ShareableMemoryRefusedByTheDriver) {
  const pid_t child = Child([&]() -> int {
    setenv("VRAMSCOPE_FAKE_SHAREABLE", "refuse", 1);
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 10);
    CUdeviceptr small = 0;
    CUdeviceptr block = 0;
    CHECK_OR(api.cuMemAlloc_v2(&small, 1000) == CUDA_SUCCESS, 11);
    CHECK_OR(api.cuMemAlloc_v2(&block, kBlock) == CUDA_SUCCESS, 12);
    Fill(block, kBlock, 61);
    CUipcMemHandle handle{};
    CHECK_OR(api.cuIpcGetMemHandle(&handle, block) == CUDA_ERROR_NOT_SUPPORTED, 13);
    CHECK_OR(api.cuMemFree_v2(block) == CUDA_SUCCESS, 14);
    CHECK_OR(api.cuMemFree_v2(small) == CUDA_SUCCESS, 15);
    return 0;
  });
  EXPECT_EQ(Join(child), 0);
}

// The summary's counters: the exporter's ipc_export and the importer's ipc_import, each the
// block's bytes at their peak, one allocation, nothing left at exit.
std::string ReadAllText(int fd) {
  std::string text;
  char buf[4096];
  ssize_t n = 0;
  while ((n = read(fd, buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
  return text;
}

TEST(IpcCounters, ExportAndImportBytesInTheSummary) {
  Pipe to_importer;
  Pipe to_exporter;
  Pipe exporter_err;
  Pipe importer_err;
  auto with_summary = [](int err) {
    dup2(err, 2);
    setenv("VRAMSCOPE_SUMMARY", "1", 1);
  };
  const pid_t exporter = Child([&]() -> int {
    with_summary(exporter_err.w);
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 10);
    Exported e;
    CHECK_OR(Export(api, kBlock, 51, &e), 11);
    CHECK_OR(Send(to_importer.w, &e.handle, sizeof(e.handle)), 12);
    CHECK_OR(Await(to_exporter.r), 13);
    CHECK_OR(api.cuMemFree_v2(e.block) == CUDA_SUCCESS, 14);
    exit(0);  // the summary is printed by the exit handler
  });
  const pid_t importer = Child([&]() -> int {
    with_summary(importer_err.w);
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 30);
    CUipcMemHandle handle{};
    CHECK_OR(Recv(to_importer.r, &handle, sizeof(handle)), 31);
    CUdeviceptr p = 0;
    CHECK_OR(api.cuIpcOpenMemHandle_v2(&p, handle, 0) == CUDA_SUCCESS, 32);
    CHECK_OR(api.cuIpcCloseMemHandle(p) == CUDA_SUCCESS, 33);
    Token(to_exporter.w);
    exit(0);
  });
  close(exporter_err.w);
  close(importer_err.w);
  const std::string exporter_text = ReadAllText(exporter_err.r);
  const std::string importer_text = ReadAllText(importer_err.r);
  EXPECT_EQ(Join(exporter), 0);
  EXPECT_EQ(Join(importer), 0);
  const std::string figures = "=0/" + std::to_string(kBlock) + "/1";
  EXPECT_NE(exporter_text.find(" ipc_export" + figures), std::string::npos) << exporter_text;
  EXPECT_NE(importer_text.find(" ipc_import" + figures), std::string::npos) << importer_text;
}

// Spawned importers (exec of this binary): one under the shim reads and writes the block; one
// without the shim gets the driver's error for a handle that is not a legacy one.
int SpawnImporter(const CUipcMemHandle& handle, bool with_shim) {
  std::string hex;
  for (unsigned char c : handle.reserved) {
    char b[3];
    snprintf(b, sizeof(b), "%02x", c);
    hex += b;
  }
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!with_shim && strncmp(*e, "LD_PRELOAD=", 11) == 0) continue;
    env_strings.emplace_back(*e);
  }
  env_strings.push_back("VRAMSCOPE_IPC_TEST_ROLE=" + std::string(with_shim ? "import" : "raw"));
  env_strings.push_back("VRAMSCOPE_IPC_TEST_HANDLE=" + hex);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  char self[] = "/proc/self/exe";
  char* argv[] = {self, nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) != 0) return -1;
  return Join(pid);
}

TEST(IpcSpawn, SpawnedImporterWithAndWithoutTheShim) {
  Pipe to_parent;
  Pipe to_exporter;
  const pid_t exporter = Child([&]() -> int {
    DriverApi api;
    CHECK_OR(Init(&api, "direct"), 10);
    Exported e;
    CHECK_OR(Export(api, kBlock, 41, &e), 11);
    CHECK_OR(Send(to_parent.w, &e.handle, sizeof(e.handle)), 12);
    CHECK_OR(Await(to_exporter.r), 13);
    CHECK_OR(Holds(e.block, kBlock, 42), 14);  // the spawned importer's bytes
    return 0;
  });
  CUipcMemHandle handle{};
  ASSERT_TRUE(Recv(to_parent.r, &handle, sizeof(handle)));
  EXPECT_EQ(SpawnImporter(handle, /*with_shim=*/true), 0);
  EXPECT_EQ(SpawnImporter(handle, /*with_shim=*/false), 0);
  Token(to_exporter.w);
  EXPECT_EQ(Join(exporter), 0);
}

int SpawnedRole(const char* role) {
  const char* hex = getenv("VRAMSCOPE_IPC_TEST_HANDLE");
  CHECK_OR(hex != nullptr && strlen(hex) == 128, 50);
  CUipcMemHandle handle{};
  for (int i = 0; i < 64; ++i) {
    unsigned v = 0;
    CHECK_OR(sscanf(hex + 2 * i, "%2x", &v) == 1, 51);
    handle.reserved[i] = static_cast<char>(v);
  }
  DriverApi api;
  CHECK_OR(Init(&api, "direct"), 52);
  const bool shim =
      ModuleOf(reinterpret_cast<void*>(api.cuIpcOpenMemHandle_v2)).find("libvramscope") !=
      std::string::npos;
  CUdeviceptr p = 0;
  const CUresult r = api.cuIpcOpenMemHandle_v2(&p, handle, 0);
  if (strcmp(role, "raw") == 0) {
    CHECK_OR(!shim, 53);
    CHECK_OR(r == CUDA_ERROR_INVALID_VALUE, 54);  // not a legacy handle: the driver says so
    return 0;
  }
  CHECK_OR(shim, 55);
  CHECK_OR(r == CUDA_SUCCESS, 56);
  CHECK_OR(Holds(p, kBlock, 41), 57);
  Fill(p, kBlock, 42);
  CHECK_OR(api.cuIpcCloseMemHandle(p) == CUDA_SUCCESS, 58);
  return 0;
}

}  // namespace
}  // namespace vramscope::fake

int main(int argc, char** argv) {
  if (const char* role = getenv("VRAMSCOPE_IPC_TEST_ROLE"); role != nullptr) {
    return vramscope::fake::SpawnedRole(role);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
