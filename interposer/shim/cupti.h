// CUPTI memory activity: the driver's own record of every allocation and free (including memory
// the shim does not pool: stream-ordered pools, libraries, VMM), written into the event ring as
// CUPTI_MEMORY records beside the shim's own, on the ring's clock (CLOCK_MONOTONIC ns).
//
// libcupti is opened with dlopen only when enabled (Config::CuptiWanted: VRAMSCOPE_CUPTI=1;
// `vramscope run` sets it; unset, plain LD_PRELOAD leaves it off and CUDA_INJECTION64_PATH turns
// it on) and the event ring is open (no ring, nowhere to record), from the first hook after the
// shim's initialisation, or from InitializeInjection (injection.cc) when the library is loaded as
// CUDA_INJECTION64_PATH. Where: the file in VRAMSCOPE_CUPTI_LIB, else
// dlopen("libcupti.so.13") (the loader's path), else the toolkit's lib directories. Only these
// CUPTI functions are used, all looked up with the real dlsym: cuptiActivityEnable,
// cuptiActivityRegisterCallbacks, cuptiActivityFlushAll, cuptiActivityGetNextRecord,
// cuptiActivityGetNumDroppedRecords, cuptiGetResultString and
// cuptiActivityRegisterTimestampCallback (timestamps then come from the ring's clock; without it
// CUPTI's CLOCK_REALTIME stamps are shifted by an offset measured at start).
//
// Records: CUPTI_ACTIVITY_KIND_MEMORY2 (allocation / release: address, bytes, memory kind,
// stream, pool type and address for stream-ordered memory) and CUPTI_ACTIVITY_KIND_MEMORY_POOL
// (pool created / destroyed / trimmed). CUPTI's own dropped records (buffers full) become one
// RECORDS_DROPPED record per completed buffer that lost some. Buffers: a fixed set allocated at
// start; when all are in flight CUPTI drops (and counts) records instead of growing.
//
// If CUPTI cannot be used (not found, another tool such as Nsight or the PyTorch profiler holds
// it, no permission) the shim warns once and goes on with its hooks only.
//
// Threads: a helper thread (every signal blocked) flushes every VRAMSCOPE_CUPTI_FLUSH_MS (100 ms
// default) for live views; at exit it does a forced flush that the exit handler waits for at
// most VRAMSCOPE_CUPTI_EXIT_TIMEOUT_MS (2000 ms): exit never hangs on CUPTI. CUPTI is never
// called from a hook that holds a pool lock: only from MaybeStartCupti (hook entry, no lock) and
// the helper thread. CUPTI's buffer callbacks only write ring records (lock-free, no driver call).
// A fork child leaves CUPTI alone (its threads did not survive the fork) and records hooks only.
#pragma once

#include <atomic>
#include <cstdint>

namespace vramscope::interposer {

namespace cupti_internal {
enum class CuptiState : int { kOff = 0, kPending, kStarting, kOn, kUnavailable };
extern constinit std::atomic<int> g_cupti_state;
void StartPendingCupti();
}  // namespace cupti_internal

// Init path (driver loaded, settings read): leaves CUPTI pending when VRAMSCOPE_CUPTI enables it.
void ArmCupti(bool enabled);
// Every hook entry (no lock held): starts CUPTI once when it is pending.
inline void MaybeStartCupti() {
  if (__builtin_expect(cupti_internal::g_cupti_state.load(std::memory_order_relaxed) ==
                           static_cast<int>(cupti_internal::CuptiState::kPending),
                       0)) {
    cupti_internal::StartPendingCupti();
  }
}
// Exit handler: the final forced flush, waited for at most the configured timeout.
void FlushCuptiAtExit();
// Fork child handler: forgets CUPTI without calling it.
void CuptiForkChild();
// For the summary line: true when CUPTI records are being collected; records CUPTI dropped.
bool CuptiActive();
std::uint64_t CuptiDroppedRecords();

}  // namespace vramscope::interposer
