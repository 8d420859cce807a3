// The shim's process-wide lifecycle state, read by every layer: whether initialisation finished,
// whether the shim disabled itself, whether exit began, and the settings read at
// initialisation, and whether the shared CUDA runtime has answered. Only the lifecycle (shim.cc)
// writes the flags and the settings (the runtime hooks set g_runtime_seen); everything else reads
// them through the inline checks below, which are most of a pooled allocation's bookkeeping
// outside the pool.
//
// Thread safety: the flags are atomics; g_config is written only under the lifecycle's init lock
// before g_state becomes kReady (release) and in a fork child, so a reader that saw Ready() reads
// a settled Config. Nothing here fails or allocates.
#pragma once

#include <atomic>

#include "config.h"

namespace vramscope::interposer {
namespace shim_internal {

enum class State : int { kUninitialised = 0, kReady = 1 };
extern constinit std::atomic<int> g_state;
extern constinit std::atomic<bool> g_disabled;
extern constinit std::atomic<bool> g_exiting;
extern constinit Config g_config;
extern __attribute__((tls_model("initial-exec"))) constinit thread_local bool t_in_init;
// The shared CUDA runtime answered a forwarded cudaMalloc/cudaFree with success, so it is
// initialised in this process (hooks_runtime.cc reads and sets it; a fork child clears it).
extern constinit std::atomic<bool> g_runtime_seen;

inline bool Ready() {
  return g_state.load(std::memory_order_acquire) == static_cast<int>(State::kReady);
}

}  // namespace shim_internal

// The shim's own machinery may run on this thread now: initialised, enabled, not exiting, not
// inside initialisation.
inline bool Active() {
  return shim_internal::Ready() && !shim_internal::g_disabled.load(std::memory_order_relaxed) &&
         !shim_internal::g_exiting.load(std::memory_order_relaxed) && !shim_internal::t_in_init;
}
inline const Config& Cfg() { return shim_internal::g_config; }
inline bool Exiting() { return shim_internal::g_exiting.load(std::memory_order_acquire); }
// Fork child (shim.cc's table): the shared runtime has not answered in the child yet.
inline void ForgetRuntimeInChild() {
  shim_internal::g_runtime_seen.store(false, std::memory_order_relaxed);
}
// The pools may be consulted (frees routed, pointers looked up) also after exit began: frees
// then touch only the pools' books.
inline bool CanRouteFrees() { return Active() || Exiting(); }

}  // namespace vramscope::interposer
