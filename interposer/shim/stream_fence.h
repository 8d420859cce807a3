// The stream-aware fence: a pooled free is reusable once the GPU has passed the point of the free
// on every stream of its context that received work, tested with events rather than a
// cuCtxSynchronize, so a fence completes when the GPU catches up and no thread waits for it.
//
// Tracking. Every watched entry point (hooks_streams_gen.cc, and the hand-written hooks that
// queue work on a stream) notes the stream with NoteStreamWork *after* the driver call returned,
// so the work is in the stream's queue before its flag is set. A created stream is registered
// once in a fixed table (its context from cuStreamGetCtx) and its entry flagged; work on a
// default stream (the legacy stream, a per-thread stream) sets one process-wide flag, covered by
// an event on the legacy stream, which waits for every blocking stream of its context, the
// per-thread streams included. A thread that keeps queueing on the same stream pays one
// thread-local compare and one load.
//
// Rounds (IssueEventRound). Under one mutex, for every live pool: take the next epoch (every
// free stamped with an earlier one has returned, and so has the work it could depend on, whose
// flag is therefore set or was cleared by an earlier round), clear the flags, record one event
// on each flagged stream of the pool's context (and on its legacy stream when a default stream
// was flagged), and queue {epoch, events}. PollEventFences completes epochs in order once all
// their events have completed. A round that cannot be exact falls back to the device-wide rule
// for its fence (EpochFences::Sync, cuCtxSynchronize, by the helper thread): a capture live or
// begun during the round (an event recorded on a capturing stream would join the graph), work the
// shim could not attribute (stream table full, cuStreamGetCtx failed), an entry point it does
// not know (NoteUnknownStreamWork: from then on every fence synchronises), a failed record, more
// flagged streams than a fence holds. A stream destroyed while flagged gets an event recorded
// before the destroy reaches the driver (the work still runs after it), which the next round
// takes. A context destroyed or reset forgets its streams; a fork child starts empty.
//
// GPU-side waits (VRAMSCOPE_FENCE_GPU_WAIT=1). Where an allocation would block the host for the
// oldest queued fence (the lag bound, reuse_policy.h), or grow past the handover bound, the
// allocating thread issues a round for the frees since the last one and HandOverEventFences moves
// the queued fences' events into the owed table as one round (the newest event of each stream
// stands for its older ones) and completes their epochs at once, so every block freed so far
// serves the allocation now. From then on, before any work is queued on a stream that has not yet
// waited for that round, PayOwedWaits (called by WatchStream, ordered.h, before every watched
// driver call: launches, async and synchronous copies and memsets, graph launch and upload,
// capture begin, ...) queues cuStreamWaitEvent(stream, event) for every event of every owed round
// the stream has not waited for and the GPU has not passed: one wait per stream per round,
// whatever the stream's device (a stream of another device may reach the memory by peer
// access). Every stream is covered: a created stream by its registry entry (one created after
// the round starts at 0, so its first work waits), the legacy stream by a per-context entry, a
// per-thread stream by a thread-local one. A capturing stream is skipped and stays owed: its
// captured work runs only when the graph is launched, and the launch's stream waits (a wait on an
// event recorded outside the capture would invalidate it); cuStreamBeginCapture pays before the
// capture begins. The helper thread retires an owed round once its events completed; while none
// is owed the submission path costs one relaxed load. Pooled memory goes back to the driver once
// every round owed when the pool let it go is retired (DriverUpstream's deferred unmaps, which the
// helper reaps as it retires rounds; a segment free or a range release synchronises first,
// EpochFences::BeforeReturningMemory); an IPC export, an unknown entry point
// and a fork child end every owed round on the host (DrainOwedWaitsOnHost, cuEventSynchronize); a
// context destroyed forgets its rounds. A fence that is not exact (it falls back to a device
// synchronisation) is never handed over, nor is one when the owed table (64 rounds) is full:
// the host waits then, as without GPU waits.
//
// Thread safety: NoteStreamWork is lock-free; the rest takes g_fence_mu (rounds, registration,
// destroys) and a pool's ring mutex (its queued fences), never on the allocate/free hot path.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>

#include <cuda.h>

#include "event_fence_ring.h"

namespace vramscope::interposer {

struct Slot;

namespace stream_fence_internal {

struct StreamEntry {
  std::atomic<std::uintptr_t> handle{0};  // 0: empty; kTombstone: a destroyed stream's
  std::atomic<CUcontext> ctx{nullptr};
  std::atomic<bool> dirty{false};
  std::atomic<std::uint64_t> waited{0};  // owed rounds up to this one waited for (GPU waits)
};
struct ThreadCache {
  std::uintptr_t handle = 0;
  StreamEntry* entry = nullptr;
  std::uint64_t generation = 0;
};
extern constinit std::atomic<bool> g_tracking;
extern constinit std::atomic<bool> g_default_dirty;
extern constinit std::atomic<std::uint64_t> g_generation;
extern constinit std::atomic<bool> g_stream_dirty;  // some registered stream is flagged
extern constinit thread_local ThreadCache t_stream;
void NoteSlow(std::uintptr_t handle);

// Owed rounds not yet retired (GPU waits); 0 on the submission path's common case.
extern constinit std::atomic<int> g_owed_live;
void PayOwedSlow(CUstream stream, bool per_thread);

inline void SetDirty(std::atomic<bool>& flag) {
  // Sequentially consistent: a free that follows this work reads the epoch after the store, so
  // a round that takes a later epoch sees the flag (or an earlier round cleared it after it).
  if (!flag.load(std::memory_order_seq_cst)) flag.store(true, std::memory_order_seq_cst);
}
inline void SetStreamDirty(std::atomic<bool>& flag) {
  if (!flag.load(std::memory_order_seq_cst)) {
    flag.store(true, std::memory_order_seq_cst);
    SetDirty(g_stream_dirty);
  }
}

}  // namespace stream_fence_internal

// Work was queued on `stream` (the driver call has returned). `per_thread`: a _ptsz / _ptds
// entry point, where a null stream is the per-thread stream (also a default stream here).
inline void NoteStreamWork(CUstream stream, bool /*per_thread*/) {
  using namespace stream_fence_internal;
  if (!g_tracking.load(std::memory_order_relaxed)) return;
  const auto handle = reinterpret_cast<std::uintptr_t>(stream);
  // 0, CU_STREAM_LEGACY (1), CU_STREAM_PER_THREAD (2).
  if (handle <= reinterpret_cast<std::uintptr_t>(CU_STREAM_PER_THREAD)) {
    SetDirty(g_default_dirty);
    return;
  }
  ThreadCache& cache = t_stream;
  if (cache.handle == handle && cache.generation == g_generation.load(std::memory_order_acquire)) {
    SetStreamDirty(cache.entry->dirty);
    return;
  }
  NoteSlow(handle);
}

// Notes the stream when the hook returns, after the driver call in its return statement.
class StreamWorkNote {
 public:
  StreamWorkNote(CUstream stream, bool per_thread, bool active = true)
      : stream_(stream), per_thread_(per_thread), active_(active) {}
  ~StreamWorkNote() {
    if (active_) NoteStreamWork(stream_, per_thread_);
  }
  StreamWorkNote(const StreamWorkNote&) = delete;
  StreamWorkNote& operator=(const StreamWorkNote&) = delete;

 private:
  CUstream stream_;
  bool per_thread_;
  bool active_;
};

// Work is about to be queued on `stream` (before the driver call; `per_thread` as for
// NoteStreamWork): the stream first waits on the GPU for every owed round it has not waited for.
inline void PayOwedWaits(CUstream stream, bool per_thread) {
  if (__builtin_expect(stream_fence_internal::g_owed_live.load(std::memory_order_relaxed) == 0,
                       1)) {
    return;
  }
  stream_fence_internal::PayOwedSlow(stream, per_thread);
}

// GPU-side waits are in use (VRAMSCOPE_FENCE_GPU_WAIT=1 and event fences on).
bool GpuWaitOn();
// Completes the queued fences of `slot`, oldest first, by handing their events over to GPU-side
// waits as one owed round (never blocks on the GPU): every exact fence up to the first that is
// not, or up to as many as one round's newest event per stream covers (events on one stream
// complete in order). True if the oldest fence is complete now (handed over, or it completed
// meanwhile), false if it cannot be handed over (none queued, not exact, owed table full, GPU
// waits off): the caller then waits on the host.
bool HandOverEventFences(Slot* slot);
// Waits on the host until every owed round's events completed and retires them (IPC export,
// unknown entry point: work the shim cannot make wait may follow).
void DrainOwedWaitsOnHost();
// Retires the owed rounds whose events completed (the helper thread's poll); true while any is
// still owed.
bool RetireOwedWaits();

// At initialisation and in a fork child: whether event fences are used (pool mode,
// VRAMSCOPE_FENCE_EVENTS not 0, and the driver has what they need).
void ConfigureStreamFence(bool allowed);
// Event fences are in use (not turned off, no unknown entry point seen).
bool EventFencesOn();
// An entry point the shim does not know was looked up: work may be queued unseen, so every
// fence from now on synchronises the device.
void NoteUnknownStreamWork();

// Issues a round for every live pool; false if it could not issue one (event fences off, exit,
// a capture live): the caller then falls back to EpochFences::Sync.
bool IssueEventRound();
// Completes the queued fences whose events completed (oldest first, every live pool) and, with
// `issue_due`, issues a round when frees happened since the last one and `round_interval_ns`
// passed. Returns true while any pool still has a fence queued.
bool PollEventFences(bool issue_due, std::uint64_t round_interval_ns);
// Completes what `slot`'s queued fences allow without waiting (skipped if another thread is at
// it); for VRAMSCOPE_FENCE_ASYNC=0, where no helper thread polls.
void PollSlotEventFences(Slot* slot);
// Blocks the calling thread until the oldest queued fence of `slot` completes (cuEventSynchronize
// on its events, blocking-sync events) and completes it; false if none was queued.
bool WaitOldestEventFence(Slot* slot);
bool AnyEventFenceQueued();
// If no stream has had work since the last round and `slot` has no fence queued, completes every
// free of `slot` so far at once (a lock and a few atomics: cheap enough for the freeing thread)
// and returns true.
bool CompleteIfIdle(Slot* slot);

// cuStreamDestroy hooks: before the driver destroys `stream`.
void BeforeStreamDestroy(CUstream stream);
// The context is gone (destroy, primary reset or last release): forget its streams.
void ForgetContextStreams(CUcontext ctx);
// A fork child: no streams, no flags (its pools are forgotten with their rings).
void ResetStreamFenceInChild();

}  // namespace vramscope::interposer
