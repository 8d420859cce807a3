// Settings read from VRAMSCOPE_* environment variables once per process (and again in a fork
// child). Plain getenv/strtoull: no allocation.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vramscope::interposer {

enum class Mode : std::uint32_t {
  kPool = 0,     // cuMemAlloc_v2/cuMemFree_v2 served by the pool (default)
  kPassthrough,  // every call reaches the driver unchanged; recorded only
  kStrict,       // pooled, but cuMemFree_v2 synchronises like the driver (fences done at once)
};

const char* ModeName(Mode mode);

enum class CuptiSetting : std::uint8_t { kAuto = 0, kOff, kOn };

struct Config {
  Mode mode = Mode::kPool;
  bool summary = false;  // VRAMSCOPE_SUMMARY=1: one line to stderr at exit
  // VRAMSCOPE_POOL_POLICY: the pool's layout policy; empty = "vmm" where the device supports
  // virtual memory management, else "segments".
  char policy[32] = {};
  std::size_t capacity_bytes = 0;  // VRAMSCOPE_POOL_CAPACITY (0 = unlimited)
  // Amortised fence: after this many pooled frees, or this many pending bytes, since the last
  // synchronisation, the next free synchronises the context (what the driver's free does on
  // every call). VRAMSCOPE_FENCE_BATCH_FREES / VRAMSCOPE_FENCE_BATCH_BYTES; bytes 0 = automatic:
  // 1/64 of the device's memory, at least 64 MiB. Four batches pending make the free
  // synchronise inline.
  std::uint64_t fence_batch_frees = 1024;
  std::uint64_t fence_batch_bytes = 0;
  // VRAMSCOPE_FENCE_ASYNC=0: the free that fills a batch synchronises itself instead of asking
  // the helper thread.
  bool fence_async = true;
  // VRAMSCOPE_FENCE_SPIN_US: after a synchronisation the helper thread watches for the next
  // request this long before it sleeps, so a program that frees in a tight loop asks with one
  // store instead of waking a sleeping thread (a futex call per batch). 0 = always sleep.
  std::uint64_t fence_spin_us = 50;
  // VRAMSCOPE_FENCE_EAGER=1: allocations ask the helper thread for a reuse synchronisation even
  // when recent synchronisations were slow (the program far ahead of the GPU).
  bool fence_eager = false;
  // VRAMSCOPE_FENCE_EVENTS (default on; 0: off): the stream-aware event fences (stream_fence.h)
  // beside the amortised device synchronisation, which alone is the rule with 0.
  bool fence_events = true;
  // VRAMSCOPE_FENCE_GPU_WAIT (default on; 0: off, host waits), with event fences: an allocation
  // that would wait on the host for a fence (the lag bound) or grow (the handover bound) takes
  // every block freed so far at once instead, and every stream waits on the GPU for those frees'
  // events before its next work (stream_fence.h, "GPU-side waits"). On the H200 the GPT-2
  // no-cache step holds 1.06-1.14x requested this way, 1.5-1.9x with the device synchronisation
  // alone, at the same speed (BENCHMARKS.md section 4).
  bool fence_gpu_wait = true;
  // VRAMSCOPE_FENCE_LAG_FRACTION: with event fences, an allocation that would grow waits for the
  // oldest fence while more than 1/N of the device's pooled memory waits for fences (at least
  // 16 MiB). 0: never wait (grow).
  std::uint64_t fence_lag_fraction = 16;
  // VRAMSCOPE_FENCE_HANDOVER_FRACTION: with GPU-side waits, an allocation that would grow takes
  // the oldest fences' blocks (handed over, no host wait) while more than 1/N of the device's
  // pooled memory (at least 16 MiB, and at least the request) waits for fences. A handover costs
  // the host a few event records and waits queued on the GPU, not a wait, so its bound can be
  // far tighter than the host wait's. 0: hand over only where the lag bound above is due.
  std::uint64_t fence_handover_fraction = 256;
  // VRAMSCOPE_FENCE_ROUND_US: with event fences, the least time between two rounds the helper
  // thread issues (each records an event on every stream that had work; recording from another
  // thread contends with the program's launches in the driver). 1 to 100000. With GPU-side
  // waits the default is kGpuWaitRoundUs, and the free path keeps the spacing too: a handover
  // issues the round its allocation needs, so rounds only let older fences complete (on the
  // H200 the GPT-2 step was 11% slower with rounds every 50 us than every 500 us).
  std::uint64_t fence_round_us = 50;
  static constexpr std::uint64_t kGpuWaitRoundUs = 500;
  // VRAMSCOPE_FENCE_POLL_US: with event fences queued, how often the helper thread queries them.
  // 1 to 100000; with GPU-side waits the default is kGpuWaitPollUs.
  std::uint64_t fence_poll_us = 20;
  static constexpr std::uint64_t kGpuWaitPollUs = 100;
  bool use_vmm = true;  // VRAMSCOPE_VMM=0 forces plain cuMemAlloc segments
  // VRAMSCOPE_VMM_PIECE: the vmm pool's smallest physical handle, bytes (rounded down to a power
  // of two; at least the map granularity): each mapping is cut into pieces of it (doubled while a
  // mapping would hold over pool::kMaxPiecesPerMap), so the pool can give free memory back piece
  // by piece (pool::Upstream::MapPieceBytes). 0: one handle per mapping, which gives back whole
  // mappings only (traces/gpt2_train: 1.073 of peak live instead of 1.040).
  std::size_t vmm_piece_bytes = std::size_t{64} << 20;  // pool::kDefaultMapPieceBytes
  // VRAMSCOPE_QUICK_REUSE=0: no quick bins in the pools (pool::PoolOptions::quick_reuse).
  bool quick_reuse = true;
  // VRAMSCOPE_CAP_PENDING=0: the vmm pool's soft cap ignores pending bytes (as before).
  bool cap_counts_pending = true;
  // VRAMSCOPE_RUNTIME_HOOKS=0: the exported cudaMalloc/cudaFree forward every call to the
  // shared CUDA runtime (hooks_runtime.cc) instead of serving cached blocks themselves.
  bool runtime_hooks = true;
  // VRAMSCOPE_STACKS=1: allocation sites (call stacks) in the ALLOC records (stacks.h).
  bool stacks = false;
  // VRAMSCOPE_STACKS_UNWIND=libgcc: walk stacks with libgcc's _Unwind_Backtrace only (the fast
  // walk of unwind.h off), to compare or to work around a walk that stops early.
  bool stacks_libgcc = false;
  // VRAMSCOPE_CUPTI: CUPTI memory activity records into the ring (cupti.h). 1 (any non-zero
  // number): on; 0: off; unset, empty or not a number: kAuto, on only when the library was loaded
  // as a CUDA injection (CUDA_INJECTION64_PATH: InitializeInjection) and off under plain
  // LD_PRELOAD. `vramscope run` sets 1 unless the environment sets it (--no-cupti: 0).
  CuptiSetting cupti = CuptiSetting::kAuto;
  // The one reading of `cupti`: whether CUPTI should be started, `as_injection` when the driver
  // loaded the library through CUDA_INJECTION64_PATH.
  bool CuptiWanted(bool as_injection) const {
    return cupti == CuptiSetting::kOn || (cupti == CuptiSetting::kAuto && as_injection);
  }
  // VRAMSCOPE_ORDERED=0: no ordered reuse (ordered.h); every pooled free waits for the fence.
  bool ordered = true;
  // VRAMSCOPE_IPC=0: pooled physical memory is not created shareable, so cuIpcGetMemHandle of a
  // pooled block is refused as before (ipc.h).
  bool ipc = true;
  // VRAMSCOPE_IPC_PIDFD=0: an importer asks the exporter's descriptor service (SCM_RIGHTS)
  // instead of trying pidfd_getfd first.
  bool ipc_pidfd = true;
};

// Reads the environment; logs one warning for each value it cannot parse.
Config ReadConfig();

}  // namespace vramscope::interposer
