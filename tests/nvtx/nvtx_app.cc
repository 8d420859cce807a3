// A CUDA program with NVTX ranges whose figures are known in advance, for nvtx_run_test: run
// under `vramscope run` over the fake driver. Uses the real NVTX v3 headers (header-only; the
// shim is reached through NVTX_INJECTION64_PATH, which vramscope run sets) and allocates with
// cuMemAlloc_v2 (pooled by the shim; every size a multiple of 512, so allocated == requested).
//
// Timeline (one thread at a time, so process-wide allocated bytes are exact at every point):
//   main:   push "phase_a" (default domain, nvtxRangePushA)
//             alloc A 1 MiB
//             push "step" (domain "vs.outer", DomainRangePushEx, ASCII, category 7)
//               alloc B 2 MiB, free B
//             pop "step"
//           pop "phase_a"; free A
//   worker thread (started and joined here):
//           push "worker" (domain "vs.inner" created with the wide API; registered string)
//             alloc C 4 MiB
//             push "inner_\u00fc" (vs.inner, wide message)
//               alloc D 512 KiB
//             pop
//             free C
//           pop "worker"                       (D stays live)
//   main:   free D
//           push "step" (vs.outer) alloc E 256 KiB, free E, pop
//           start/end range "span": alloc F 8 KiB, free F, end
//           NvtxCopyPhase (libnvtx_copy.so, its own NVTX copy): push "lib_phase", alloc G 64 KiB,
//           free G, pop
//   two threads at once, in a fixed order (each step waits for the one before):
//           T1 push "t1"; T2 push "t2"; T2 alloc X 768 KiB; T1 alloc Y 1280 KiB; T1 pop;
//           T2 pop; then X and Y freed
// Expected per range (name, domain: count, peak allocated, net growth, allocations inside):
//   phase_a, "":            1, 3 MiB,   +1 MiB,   1
//   step, vs.outer:         2, 3 MiB,    0,       2
//   worker, vs.inner:       1, 4.5 MiB, +512 KiB, 1
//   inner_ü, vs.inner:      1, 4.5 MiB, +512 KiB, 1
//   span, "":               1, 8 KiB,    0,       1
//   lib_phase, "":          1, 64 KiB,   0,       1
//   t1, "":                 1, 2 MiB,   +2 MiB,   1  (Y; X is T2's, innermost there: t2)
//   t2, "":                 1, 2 MiB,   +2 MiB,   1
// Exits 0, or 1 with a message when a CUDA or NVTX call fails.
#include <stdio.h>
#include <stdlib.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include <cuda.h>
#include <nvtx3/nvToolsExt.h>

extern "C" int NvtxCopyPhase(size_t bytes);  // nvtx_copy.cc

namespace {

constexpr size_t kMiB = 1 << 20;

void Fail(const char* what) {
  fprintf(stderr, "nvtx_app: %s failed\n", what);
  exit(1);
}

// Not inlined: the allocation sites (vramscope run --stacks) must name these functions.
__attribute__((noinline)) CUdeviceptr AllocateBlock(size_t bytes) {
  CUdeviceptr p = 0;
  if (cuMemAlloc_v2(&p, bytes) != CUDA_SUCCESS) Fail("cuMemAlloc_v2");
  return p;
}

__attribute__((noinline)) CUdeviceptr AllocateInWorker(size_t bytes) {
  // Not a tail call: this frame must stay on the stack.
  volatile CUdeviceptr p = AllocateBlock(bytes);
  return p;
}

// The nesting level NVTX returns: `want`, or "not tracked" when no tool is attached.
bool Level(int got, int want) { return got == want || got == NVTX_NO_PUSH_POP_TRACKING; }

void Free(CUdeviceptr p) {
  if (cuMemFree_v2(p) != CUDA_SUCCESS) Fail("cuMemFree_v2");
}

nvtxEventAttributes_t Attributes() {
  nvtxEventAttributes_t attrib = {};
  attrib.version = NVTX_VERSION;
  attrib.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  return attrib;
}

void Step(nvtxDomainHandle_t outer, size_t bytes) {
  nvtxEventAttributes_t attrib = Attributes();
  attrib.category = 7;
  attrib.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attrib.message.ascii = "step";
  if (!Level(nvtxDomainRangePushEx(outer, &attrib), 0)) Fail("nvtxDomainRangePushEx");
  Free(AllocateBlock(bytes));
  if (!Level(nvtxDomainRangePop(outer), 0)) Fail("nvtxDomainRangePop");
}

CUdeviceptr g_worker_block = 0;
CUcontext g_ctx = nullptr;

void Worker() {
  if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) Fail("cuCtxSetCurrent (worker)");
  nvtxDomainHandle_t inner = nvtxDomainCreateW(L"vs.inner");
  nvtxEventAttributes_t attrib = Attributes();
  attrib.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  attrib.message.registered = nvtxDomainRegisterStringA(inner, "worker");
  nvtxDomainRangePushEx(inner, &attrib);
  const CUdeviceptr c = AllocateInWorker(4 * kMiB);
  nvtxEventAttributes_t wide = Attributes();
  wide.messageType = NVTX_MESSAGE_TYPE_UNICODE;
  wide.message.unicode = L"inner_\u00fc";
  if (!Level(nvtxDomainRangePushEx(inner, &wide), 1)) Fail("nested nvtxDomainRangePushEx level");
  g_worker_block = AllocateInWorker(kMiB / 2);
  if (!Level(nvtxDomainRangePop(inner), 1)) Fail("nested nvtxDomainRangePop level");
  Free(c);
  nvtxDomainRangePop(inner);
}

// A fixed interleaving of two threads: Turn(n) waits until step n, Next() starts the next.
std::mutex g_mu;
std::condition_variable g_cv;
int g_step = 0;

void Turn(int step) {
  std::unique_lock<std::mutex> lock(g_mu);
  g_cv.wait(lock, [step] { return g_step == step; });
}

void Next() {
  std::lock_guard<std::mutex> lock(g_mu);
  ++g_step;
  g_cv.notify_all();
}

CUdeviceptr g_x = 0;
CUdeviceptr g_y = 0;

void ThreadOne() {
  if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) Fail("cuCtxSetCurrent (t1)");
  Turn(0);
  nvtxRangePushA("t1");
  Next();
  Turn(3);
  g_y = AllocateBlock(1280 * 1024);
  nvtxRangePop();
  Next();
}

void ThreadTwo() {
  if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) Fail("cuCtxSetCurrent (t2)");
  Turn(1);
  nvtxRangePushA("t2");
  Next();
  Turn(2);
  g_x = AllocateBlock(768 * 1024);
  Next();
  Turn(4);
  nvtxRangePop();
  Next();
}

}  // namespace

int main() {
  if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&g_ctx, 0) != CUDA_SUCCESS ||
      cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) {
    Fail("context setup");
  }
  nvtxDomainHandle_t outer = nvtxDomainCreateA("vs.outer");

  if (!Level(nvtxRangePushA("phase_a"), 0)) Fail("nvtxRangePushA level");
  const CUdeviceptr a = AllocateBlock(kMiB);
  Step(outer, 2 * kMiB);
  if (!Level(nvtxRangePop(), 0)) Fail("nvtxRangePop level");
  Free(a);

  std::thread worker(Worker);
  worker.join();
  Free(g_worker_block);

  Step(outer, kMiB / 4);

  const nvtxRangeId_t span = nvtxRangeStartA("span");
  Free(AllocateBlock(8192));
  nvtxRangeEnd(span);

  if (NvtxCopyPhase(64 * 1024) != 0) Fail("NvtxCopyPhase");

  std::thread one(ThreadOne);
  std::thread two(ThreadTwo);
  one.join();
  two.join();
  Free(g_x);
  Free(g_y);
  return 0;
}
