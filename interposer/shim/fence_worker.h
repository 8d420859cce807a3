// A helper thread that runs the amortised fence synchronisation (device_pools.h) off the
// application's thread, so a free never blocks on queued GPU work in pool mode: the free that
// fills a batch only asks, the helper calls cuCtxSynchronize for that pool's context and then
// completes the epoch. Sound for the same reason the inline call is: the epoch is taken by the
// helper right before its synchronisation, after every free stamped with it returned.
//
// Started lazily on the first request, with every signal blocked (the application's handlers
// never run on it). fork: the child has no helper; the next request starts one. exit: Quiesce
// waits (bounded) for a synchronisation in flight, after which the helper makes no driver call.
// Thread safety: all functions may be called from any thread.
#pragma once

#include <cstdint>

namespace vramscope::interposer {

struct Slot;

// Queues a synchronisation of `slot` unless one is already queued or running. False if the
// helper cannot run (thread creation failed): the caller then synchronises itself.
bool RequestBackgroundSync(Slot* slot);

// Wakes the helper to poll (it polls while event fences are queued or unmaps are deferred,
// DriverUpstream::HasDeferred), starting it if needed.
void WakeFenceWorker();
// Waits up to `timeout_ms` for the helper to finish what it is doing.
void QuiesceFenceWorker(int timeout_ms);

// CPU time the helper thread has used so far, nanoseconds (0 when it never started).
std::uint64_t FenceWorkerCpuNs();

void LockFenceWorkerForFork();
void UnlockFenceWorkerAfterFork();
void ResetFenceWorkerInChild();

}  // namespace vramscope::interposer
