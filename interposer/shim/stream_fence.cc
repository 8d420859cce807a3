#include "stream_fence.h"

#include <algorithm>

#include "capture.h"
#include "config.h"
#include "counters.h"
#include "driver.h"
#include "log.h"
#include "slots.h"
#include "state.h"
#include "vramscope/ring/ring_writer.h"

namespace vramscope::interposer {

constinit std::atomic<bool> stream_fence_internal::g_tracking{false};
constinit std::atomic<bool> stream_fence_internal::g_default_dirty{false};
constinit std::atomic<std::uint64_t> stream_fence_internal::g_generation{1};
constinit std::atomic<bool> stream_fence_internal::g_stream_dirty{false};
constinit std::atomic<int> stream_fence_internal::g_owed_live{0};
__attribute__((tls_model("initial-exec"))) constinit thread_local stream_fence_internal::ThreadCache
    stream_fence_internal::t_stream{};

namespace {

using stream_fence_internal::g_default_dirty;
using stream_fence_internal::g_generation;
using stream_fence_internal::g_owed_live;
using stream_fence_internal::g_stream_dirty;
using stream_fence_internal::g_tracking;
using stream_fence_internal::SetDirty;
using stream_fence_internal::SetStreamDirty;
using stream_fence_internal::StreamEntry;
using stream_fence_internal::t_stream;

constexpr int kStreams = 1024;  // a power of two
constexpr std::uintptr_t kTombstone = ~std::uintptr_t{0};

constinit StreamEntry g_streams[kStreams];
// Indices of the entries ever used (tombstones included), so a round scans only those.
constinit std::atomic<int> g_used[kStreams] = {};
constinit std::atomic<int> g_used_count{0};
constinit pthread_mutex_t g_fence_mu = PTHREAD_MUTEX_INITIALIZER;
// Event fences allowed by the configuration and the driver.
constinit std::atomic<bool> g_allowed{false};
// Work that no event can cover was queued since the last round (stream table full,
// cuStreamGetCtx failed, a destroyed stream's event could not be kept): the next round's fences
// synchronise.
constinit std::atomic<bool> g_unattributed{false};
// An unknown entry point was looked up: every fence synchronises from now on.
constinit std::atomic<bool> g_unknown{false};

// GPU-side waits (stream_fence.h). An owed round: a handed-over fence's events, which every
// stream waits for before its next work until they completed. gen 0: a free entry.
struct OwedRound {
  std::uint64_t gen = 0;
  Slot* slot = nullptr;
  CUcontext ctx = nullptr;
  int count = 0;
  CUevent events[EventFenceRing::kEventsPerFence] = {};
};
constexpr int kOwedRounds = 64;
constinit OwedRound g_owed[kOwedRounds];
// Guards g_owed and the legacy entries' insertion; taken after a ring's mutex, never before.
constinit pthread_mutex_t g_owed_mu = PTHREAD_MUTEX_INITIALIZER;
constinit std::atomic<std::uint64_t> g_owed_gen{0};  // the newest owed round's gen
constinit std::atomic<bool> g_gpu_wait{false};
// The legacy stream of each context: the owed rounds it waited for.
struct LegacyWaited {
  std::atomic<CUcontext> ctx{nullptr};
  std::atomic<std::uint64_t> waited{0};
};
constexpr int kLegacyEntries = 64;
constinit LegacyWaited g_legacy_waited[kLegacyEntries];
// The calling thread's per-thread stream (in `ctx`): the owed rounds it waited for.
struct PerThreadWaited {
  CUcontext ctx = nullptr;
  std::uint64_t waited = 0;
};
__attribute__((tls_model("initial-exec"))) constinit thread_local PerThreadWaited t_per_thread{};

void ForgetOwedOfContext(CUcontext ctx);
void ResetOwedInChild();

std::size_t HashOf(std::uintptr_t handle) {
  return static_cast<std::size_t>((handle >> 4) * 0x9E3779B97F4A7C15ull >> 54) & (kStreams - 1);
}

// Lock-free lookup of a registered stream.
StreamEntry* Find(std::uintptr_t handle) {
  std::size_t i = HashOf(handle);
  for (int probe = 0; probe < kStreams; ++probe, i = (i + 1) & (kStreams - 1)) {
    const std::uintptr_t h = g_streams[i].handle.load(std::memory_order_acquire);
    if (h == handle) return &g_streams[i];
    if (h == 0) return nullptr;
  }
  return nullptr;
}

// With g_fence_mu held.
StreamEntry* Insert(std::uintptr_t handle, CUcontext ctx) {
  std::size_t i = HashOf(handle);
  StreamEntry* reuse = nullptr;
  for (int probe = 0; probe < kStreams; ++probe, i = (i + 1) & (kStreams - 1)) {
    const std::uintptr_t h = g_streams[i].handle.load(std::memory_order_relaxed);
    if (h == handle) return &g_streams[i];
    if (h == kTombstone && reuse == nullptr) reuse = &g_streams[i];
    if (h == 0) {
      if (reuse == nullptr) reuse = &g_streams[i];
      break;
    }
  }
  if (reuse == nullptr) return nullptr;
  if (reuse->handle.load(std::memory_order_relaxed) == 0) {
    const int used = g_used_count.load(std::memory_order_relaxed);
    g_used[used].store(static_cast<int>(reuse - g_streams), std::memory_order_relaxed);
    g_used_count.store(used + 1, std::memory_order_release);
  }
  reuse->ctx.store(ctx, std::memory_order_relaxed);
  reuse->dirty.store(false, std::memory_order_relaxed);
  reuse->waited.store(0, std::memory_order_relaxed);  // a new stream owes every live round
  reuse->handle.store(handle, std::memory_order_release);
  return reuse;
}

CUevent TakeEvent(EventFenceRing& ring) {
  if (ring.spare_count > 0) return ring.spare[--ring.spare_count];
  CUevent event = nullptr;
  // Blocking sync: a thread that waits for a fence sleeps instead of spinning.
  if (Real().cuEventCreate(&event, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC) !=
      CUDA_SUCCESS) {
    return nullptr;
  }
  return event;
}

void GiveEvent(EventFenceRing& ring, CUevent event) {
  if (event == nullptr) return;
  if (ring.spare_count < EventFenceRing::kSpare) {
    ring.spare[ring.spare_count++] = event;
  } else if (Real().cuEventDestroy_v2 != nullptr) {
    (void)Real().cuEventDestroy_v2(event);
  }
}

// With ring.mu held: drops the oldest fence, its events back to the spare list.
void PopOldest(EventFenceRing& ring) {
  EventFenceRing::Fence& fence = ring.fences[ring.head];
  for (int i = 0; i < fence.count; ++i) GiveEvent(ring, fence.events[i]);
  fence.count = 0;
  ring.head = (ring.head + 1) % EventFenceRing::kFences;
  --ring.count;
  ring.in_flight.store(ring.count, std::memory_order_release);
}

// With ring.mu held, in `slot`'s context: completes queued fences whose events completed (or
// whose epoch a synchronisation completed), oldest first. `may_sync`: a fence that is not exact
// is completed with a device synchronisation (the helper thread only).
void PollRingLocked(Slot* slot, bool may_sync) {
  EventFenceRing& ring = slot->event_fences;
  const RealDriver& real = Real();
  while (ring.count > 0) {
    EventFenceRing::Fence& fence = ring.fences[ring.head];
    if (slot->fences.IsComplete(fence.epoch)) {
      PopOldest(ring);
      continue;
    }
    if (fence.sync) {
      if (!may_sync || AnyCaptureLive()) return;
      // Sync takes a later epoch and completes every earlier one; without the ring's lock, so
      // a thread waiting for a fence is not held behind the device synchronisation.
      pthread_mutex_unlock(&ring.mu);
      const bool synced = slot->fences.Sync();
      pthread_mutex_lock(&ring.mu);
      if (!synced) return;
      continue;
    }
    bool done = true;
    for (int i = 0; i < fence.count && done; ++i) {
      const CUresult result = real.cuEventQuery(fence.events[i]);
      Counters().event_queries.Add(1);
      if (result == CUDA_ERROR_NOT_READY) {
        done = false;
      } else if (result != CUDA_SUCCESS) {
        fence.sync = true;  // cannot tell: the device-wide rule decides
        done = false;
      }
    }
    if (!done) return;
    slot->fences.CompleteFromEvents(fence.epoch);
    PopOldest(ring);
  }
}

// With g_fence_mu held and the slot's context current (relaxed capture mode): one fence of a
// round for `slot`; `exact` false when the round cannot cover everything.
void QueueFence(Slot* slot, std::uint64_t epoch, bool legacy, StreamEntry** streams,
                int stream_count, bool exact) {
  EventFenceRing& ring = slot->event_fences;
  const RealDriver& real = Real();
  pthread_mutex_lock(&ring.mu);
  const bool full = ring.count == EventFenceRing::kFences;
  // Full: the newest fence takes this round too (its events stay, this round's join them, and
  // it completes the later epoch, which covers both since fences complete in order).
  EventFenceRing::Fence& fence =
      ring.fences[(ring.head + ring.count - (full ? 1 : 0)) % EventFenceRing::kFences];
  if (full) {
    fence.sync = fence.sync || !exact;
  } else {
    fence.count = 0;
    fence.sync = !exact;
  }
  fence.epoch = epoch;
  // A full ring's newest fence keeps its generation; events it takes in a later one are keyed
  // by no stream (a handle may name another stream by then), so a handover never merges them.
  const std::uint64_t generation = g_generation.load(std::memory_order_acquire);
  if (!full) fence.generation = generation;
  const bool same_generation = fence.generation == generation;
  auto record = [&](CUstream stream) {
    if (fence.sync) return;
    if (fence.count == EventFenceRing::kEventsPerFence) {
      fence.sync = true;
      return;
    }
    CUevent event = TakeEvent(ring);
    if (event != nullptr) Counters().event_records.Add(1);
    if (event == nullptr || real.cuEventRecord(event, stream) != CUDA_SUCCESS) {
      GiveEvent(ring, event);
      fence.sync = true;
      return;
    }
    fence.streams[fence.count] = same_generation ? stream : nullptr;
    fence.events[fence.count++] = event;
  };
  for (int i = 0; i < stream_count; ++i) {
    record(reinterpret_cast<CUstream>(streams[i]->handle.load(std::memory_order_relaxed)));
  }
  if (legacy) record(CU_STREAM_LEGACY);
  for (int i = 0; i < ring.orphan_count; ++i) {
    if (!fence.sync && fence.count < EventFenceRing::kEventsPerFence) {
      fence.streams[fence.count] = nullptr;
      fence.events[fence.count++] = ring.orphans[i];
    } else {
      fence.sync = true;
      GiveEvent(ring, ring.orphans[i]);
    }
  }
  ring.orphan_count = 0;
  if (ring.orphan_overflow) fence.sync = true;
  ring.orphan_overflow = false;
  if (fence.sync && !full) Counters().event_fence_syncs.Add(1);
  if (!full && !fence.sync && fence.count == 0 && ring.count == 0) {
    // No stream had work since the last round and nothing older is queued: the frees stamped
    // with this epoch wait for nothing.
    slot->fences.CompleteFromEvents(epoch);
    ring.bytes_since_round.store(0, std::memory_order_relaxed);
    ring.frees_since_round.store(0, std::memory_order_relaxed);
    ring.last_round_ns.store(RingNowNs(), std::memory_order_relaxed);
    pthread_mutex_unlock(&ring.mu);
    return;
  }
  if (!full) ++ring.count;
  ring.in_flight.store(ring.count, std::memory_order_release);
  ring.bytes_since_round.store(0, std::memory_order_relaxed);
  ring.frees_since_round.store(0, std::memory_order_relaxed);
  ring.last_round_ns.store(RingNowNs(), std::memory_order_relaxed);
  if (!full) Counters().event_fences.Add(1);
  pthread_mutex_unlock(&ring.mu);
}

}  // namespace

void stream_fence_internal::NoteSlow(std::uintptr_t handle) {
  const std::uint64_t generation = g_generation.load(std::memory_order_acquire);
  StreamEntry* entry = Find(handle);
  if (entry == nullptr) {
    const RealDriver& real = Real();
    CUcontext ctx = nullptr;
    bool known = false;
    if (real.cuStreamGetCtx != nullptr) {
      DriverCallScope scope(nullptr);  // relaxed capture mode
      known = real.cuStreamGetCtx(reinterpret_cast<CUstream>(handle), &ctx) == CUDA_SUCCESS &&
              ctx != nullptr;
    }
    if (known) {
      pthread_mutex_lock(&g_fence_mu);
      entry = Insert(handle, ctx);
      pthread_mutex_unlock(&g_fence_mu);
    }
    if (entry == nullptr) {
      // The work cannot be named by an event: the next round synchronises.
      g_unattributed.store(true, std::memory_order_seq_cst);
      return;
    }
  }
  SetStreamDirty(entry->dirty);
  t_stream = {handle, entry, generation};
}

void ConfigureStreamFence(bool allowed) {
  const RealDriver& real = Real();
  allowed = allowed && real.cuEventCreate != nullptr && real.cuEventRecord != nullptr &&
            real.cuEventQuery != nullptr && real.cuEventSynchronize != nullptr &&
            real.cuStreamGetCtx != nullptr;
  g_allowed.store(allowed, std::memory_order_relaxed);
  g_unknown.store(false, std::memory_order_relaxed);
  g_unattributed.store(false, std::memory_order_relaxed);
  // Tracked from the start: work queued before the first pool still needs its events.
  g_tracking.store(allowed, std::memory_order_seq_cst);
  g_gpu_wait.store(allowed && Cfg().fence_gpu_wait && real.cuStreamWaitEvent != nullptr &&
                       real.cuCtxGetCurrent != nullptr,
                   std::memory_order_relaxed);
}

bool EventFencesOn() {
  return g_allowed.load(std::memory_order_relaxed) && !g_unknown.load(std::memory_order_relaxed);
}

void NoteUnknownStreamWork() {
  if (!g_allowed.load(std::memory_order_relaxed)) return;
  if (!g_unknown.exchange(true, std::memory_order_seq_cst)) {
    VRAMSCOPE_LOG(kInfo, "an unknown entry point was looked up: fences synchronise the device");
  }
  // Work queued through it would not pay the owed waits.
  DrainOwedWaitsOnHost();
}

bool IssueEventRound() {
  if (!EventFencesOn() || Exiting() || AnyCaptureLive()) return false;
  Slot* slots[kMaxSlots];
  const int count = LiveSlots(slots, kMaxSlots);
  if (count == 0) return false;
  pthread_mutex_lock(&g_fence_mu);
  const std::uint64_t captures = CapturesBegun();
  std::uint64_t epochs[kMaxSlots];
  // Every free stamped with these epochs has returned; its work's flags are set now (or were
  // cleared by an earlier round, whose events follow that work).
  for (int i = 0; i < count; ++i) epochs[i] = slots[i]->fences.NextFenceEpoch();
  const bool unattributed = g_unattributed.exchange(false, std::memory_order_seq_cst);
  const bool legacy = g_default_dirty.exchange(false, std::memory_order_seq_cst);
  // Cleared before the entries: an entry flagged after its own exchange sets it again.
  g_stream_dirty.store(false, std::memory_order_seq_cst);
  StreamEntry* dirty[kStreams];
  int dirty_count = 0;
  const int used = g_used_count.load(std::memory_order_acquire);
  for (int u = 0; u < used; ++u) {
    StreamEntry& entry = g_streams[g_used[u].load(std::memory_order_relaxed)];
    const std::uintptr_t h = entry.handle.load(std::memory_order_relaxed);
    if (h == 0 || h == kTombstone) continue;
    if (entry.dirty.exchange(false, std::memory_order_seq_cst)) dirty[dirty_count++] = &entry;
  }
  for (int s = 0; s < count; ++s) {
    Slot* slot = slots[s];
    // This context's streams first in `mine`.
    StreamEntry* mine[kStreams];
    int mine_count = 0;
    for (int i = 0; i < dirty_count; ++i) {
      if (dirty[i]->ctx.load(std::memory_order_relaxed) == slot->ctx) mine[mine_count++] = dirty[i];
    }
    bool exact = !unattributed && !g_unknown.load(std::memory_order_relaxed);
    if (mine_count == 0 && !legacy && slot->event_fences.orphan_count == 0) {
      // Nothing to record: no driver call, no context switch.
      QueueFence(slot, epochs[s], false, mine, 0, exact);
      continue;
    }
    DriverCallScope scope(slot->ctx);
    exact = exact && scope.ok();
    QueueFence(slot, epochs[s], legacy, mine, mine_count, exact);
  }
  // A pool created after the snapshot above may already hold frees whose work flagged a stream
  // cleared here: give its flags back to the next round (an extra event elsewhere is harmless).
  Slot* now[kMaxSlots];
  const int now_count = LiveSlots(now, kMaxSlots);
  bool grew = false;
  for (int i = 0; i < now_count && !grew; ++i) {
    bool seen = false;
    for (int k = 0; k < count && !seen; ++k) seen = slots[k] == now[i];
    grew = !seen;
  }
  if (grew) {
    if (legacy) g_default_dirty.store(true, std::memory_order_seq_cst);
    for (int i = 0; i < dirty_count; ++i) SetStreamDirty(dirty[i]->dirty);
  }
  // A capture begun during the round may have swallowed a record (it joins the graph and the
  // event keeps its old state): none of this round's fences may trust their events.
  if (CapturesBegun() != captures || AnyCaptureLive()) {
    for (int s = 0; s < count; ++s) {
      EventFenceRing& ring = slots[s]->event_fences;
      pthread_mutex_lock(&ring.mu);
      if (ring.count > 0) {
        ring.fences[(ring.head + ring.count - 1) % EventFenceRing::kFences].sync = true;
      }
      pthread_mutex_unlock(&ring.mu);
    }
  }
  pthread_mutex_unlock(&g_fence_mu);
  return true;
}

bool PollEventFences(bool issue_due, std::uint64_t round_interval_ns) {
  if (Exiting()) return false;
  Slot* slots[kMaxSlots];
  const int count = LiveSlots(slots, kMaxSlots);
  bool queued = false;
  bool due = false;
  const std::uint64_t now = issue_due ? RingNowNs() : 0;
  for (int i = 0; i < count; ++i) {
    Slot* slot = slots[i];
    EventFenceRing& ring = slot->event_fences;
    if (ring.in_flight.load(std::memory_order_acquire) != 0) {
      DriverCallScope scope(slot->ctx);
      if (scope.ok()) {
        pthread_mutex_lock(&ring.mu);
        PollRingLocked(slot, /*may_sync=*/true);
        pthread_mutex_unlock(&ring.mu);
      }
      queued = queued || ring.in_flight.load(std::memory_order_acquire) != 0;
    }
    if (issue_due && ring.frees_since_round.load(std::memory_order_relaxed) != 0 &&
        now - ring.last_round_ns.load(std::memory_order_relaxed) >= round_interval_ns) {
      due = true;
    }
  }
  if (due && IssueEventRound()) queued = true;
  if (RetireOwedWaits()) queued = true;  // keep polling while rounds are owed
  // Pieces waiting for the rounds just retired go back to the driver (keep polling while some
  // still wait).
  for (int i = 0; i < count; ++i) {
    slots[i]->upstream.ReapDeferred(/*all=*/false);
    queued = queued || slots[i]->upstream.HasDeferred();
  }
  return queued;
}

bool CompleteIfIdle(Slot* slot) {
  EventFenceRing& ring = slot->event_fences;
  if (g_stream_dirty.load(std::memory_order_seq_cst) ||
      g_default_dirty.load(std::memory_order_seq_cst) ||
      ring.in_flight.load(std::memory_order_acquire) != 0 || !EventFencesOn() || Exiting()) {
    return false;
  }
  // Under the round lock: a round that has cleared the flags but not yet queued its fence
  // holds it.
  pthread_mutex_lock(&g_fence_mu);
  const bool idle = !g_stream_dirty.load(std::memory_order_seq_cst) &&
                    !g_default_dirty.load(std::memory_order_seq_cst) &&
                    !g_unattributed.load(std::memory_order_seq_cst) &&
                    ring.in_flight.load(std::memory_order_acquire) == 0 && ring.orphan_count == 0 &&
                    !ring.orphan_overflow;
  if (idle) {
    // No work on any stream since the last round, whose fences all completed: every free
    // stamped before this epoch waits for nothing.
    slot->fences.CompleteFromEvents(slot->fences.NextFenceEpoch());
    ring.bytes_since_round.store(0, std::memory_order_relaxed);
    ring.frees_since_round.store(0, std::memory_order_relaxed);
  }
  pthread_mutex_unlock(&g_fence_mu);
  return idle;
}

void PollSlotEventFences(Slot* slot) {
  EventFenceRing& ring = slot->event_fences;
  if (ring.in_flight.load(std::memory_order_acquire) == 0 || Exiting()) return;
  DriverCallScope scope(slot->ctx);
  if (!scope.ok() || pthread_mutex_trylock(&ring.mu) != 0) return;
  PollRingLocked(slot, /*may_sync=*/false);
  pthread_mutex_unlock(&ring.mu);
  (void)RetireOwedWaits();
  slot->upstream.ReapDeferred(/*all=*/false);  // what no helper thread reaps (fence_async off)
}

bool WaitOldestEventFence(Slot* slot) {
  EventFenceRing& ring = slot->event_fences;
  if (ring.in_flight.load(std::memory_order_acquire) == 0 || Exiting()) return false;
  DriverCallScope scope(slot->ctx);
  if (!scope.ok()) return false;
  const RealDriver& real = Real();
  pthread_mutex_lock(&ring.mu);
  PollRingLocked(slot, /*may_sync=*/false);
  if (ring.count == 0) {
    pthread_mutex_unlock(&ring.mu);
    return true;  // completed meanwhile
  }
  EventFenceRing::Fence& fence = ring.fences[ring.head];
  const std::uint64_t epoch = fence.epoch;
  bool sync = fence.sync;
  CUevent events[EventFenceRing::kEventsPerFence];
  const int n = fence.count;
  for (int i = 0; i < n; ++i) events[i] = fence.events[i];
  pthread_mutex_unlock(&ring.mu);
  // The events stay valid objects: a fence that completes meanwhile returns them to the spare
  // list, where a later round may record them again (on any stream). So the wait proves the
  // fence only if it is still queued afterwards: its events were then not recycled.
  for (int i = 0; i < n && !sync; ++i) {
    if (real.cuEventSynchronize(events[i]) != CUDA_SUCCESS) sync = true;
  }
  Counters().event_fence_waits.Add(1);
  if (sync) {
    (void)slot->fences.Sync(/*forced=*/true);
    return true;
  }
  pthread_mutex_lock(&ring.mu);
  if (ring.count > 0 && ring.fences[ring.head].epoch == epoch && !ring.fences[ring.head].sync) {
    slot->fences.CompleteFromEvents(epoch);
  }
  PollRingLocked(slot, /*may_sync=*/false);
  pthread_mutex_unlock(&ring.mu);
  return true;
}

bool AnyEventFenceQueued() {
  Slot* slots[kMaxSlots];
  const int count = LiveSlots(slots, kMaxSlots);
  for (int i = 0; i < count; ++i) {
    if (slots[i]->event_fences.in_flight.load(std::memory_order_acquire) != 0 ||
        slots[i]->upstream.HasDeferred()) {
      return true;
    }
  }
  return false;
}

void BeforeStreamDestroy(CUstream stream) {
  if (!g_tracking.load(std::memory_order_acquire)) return;
  const auto handle = reinterpret_cast<std::uintptr_t>(stream);
  if (handle <= reinterpret_cast<std::uintptr_t>(CU_STREAM_PER_THREAD)) return;
  pthread_mutex_lock(&g_fence_mu);
  StreamEntry* entry = Find(handle);
  if (entry != nullptr) {
    const CUcontext ctx = entry->ctx.load(std::memory_order_relaxed);
    if (entry->dirty.exchange(false, std::memory_order_seq_cst)) {
      // Its queued work still runs after the destroy: an event recorded now follows it, and the
      // next round of its pool takes it.
      Slot* slot = ExistingSlot(ctx);
      bool kept = slot == nullptr;  // no pool in that context: nothing of ours to cover
      if (slot != nullptr) {
        EventFenceRing& ring = slot->event_fences;
        DriverCallScope scope(ctx);
        pthread_mutex_lock(&ring.mu);
        CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
        const bool capturing = Real().cuStreamIsCapturing != nullptr &&
                               Real().cuStreamIsCapturing(stream, &status) == CUDA_SUCCESS &&
                               status != CU_STREAM_CAPTURE_STATUS_NONE;
        if (scope.ok() && !capturing && ring.orphan_count < EventFenceRing::kOrphans) {
          CUevent event = TakeEvent(ring);
          if (event != nullptr && Real().cuEventRecord(event, stream) == CUDA_SUCCESS) {
            ring.orphans[ring.orphan_count++] = event;
            kept = true;
          } else {
            GiveEvent(ring, event);
          }
        }
        if (!kept) ring.orphan_overflow = true;
        kept = true;
        pthread_mutex_unlock(&ring.mu);
      }
      if (!kept) g_unattributed.store(true, std::memory_order_seq_cst);
    }
    entry->handle.store(kTombstone, std::memory_order_release);
    g_generation.fetch_add(1, std::memory_order_acq_rel);
  }
  pthread_mutex_unlock(&g_fence_mu);
}

void ForgetContextStreams(CUcontext ctx) {
  pthread_mutex_lock(&g_fence_mu);
  for (StreamEntry& entry : g_streams) {
    const std::uintptr_t h = entry.handle.load(std::memory_order_relaxed);
    if (h != 0 && h != kTombstone && entry.ctx.load(std::memory_order_relaxed) == ctx) {
      entry.handle.store(kTombstone, std::memory_order_release);
    }
  }
  g_generation.fetch_add(1, std::memory_order_acq_rel);
  pthread_mutex_unlock(&g_fence_mu);
  ForgetOwedOfContext(ctx);
}

void ResetStreamFenceInChild() {
  ResetOwedInChild();
  pthread_mutex_init(&g_fence_mu, nullptr);
  for (StreamEntry& entry : g_streams) {
    entry.handle.store(0, std::memory_order_relaxed);
    entry.ctx.store(nullptr, std::memory_order_relaxed);
    entry.dirty.store(false, std::memory_order_relaxed);
    entry.waited.store(0, std::memory_order_relaxed);
  }
  g_used_count.store(0, std::memory_order_relaxed);
  g_default_dirty.store(false, std::memory_order_relaxed);
  g_stream_dirty.store(false, std::memory_order_relaxed);
  g_generation.fetch_add(1, std::memory_order_acq_rel);
  t_stream = {};
}

}  // namespace vramscope::interposer

// --- GPU-side waits ---------------------------------------------------------------------------

namespace vramscope::interposer {

namespace {

CUcontext CurrentContext() {
  CUcontext ctx = nullptr;
  const RealDriver& real = Real();
  if (real.cuCtxGetCurrent == nullptr || real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) return nullptr;
  return ctx;
}

// The legacy stream of `ctx`'s entry, inserted if new; null if the table is full (the stream
// then waits every time, which is safe).
std::atomic<std::uint64_t>* LegacyWaitedFor(CUcontext ctx) {
  for (LegacyWaited& entry : g_legacy_waited) {
    const CUcontext c = entry.ctx.load(std::memory_order_acquire);
    if (c == ctx) return &entry.waited;
    if (c == nullptr) break;
  }
  std::atomic<std::uint64_t>* found = nullptr;
  pthread_mutex_lock(&g_owed_mu);
  for (LegacyWaited& entry : g_legacy_waited) {
    const CUcontext c = entry.ctx.load(std::memory_order_relaxed);
    if (c == ctx) {
      found = &entry.waited;
      break;
    }
    if (c == nullptr) {
      entry.waited.store(0, std::memory_order_relaxed);
      entry.ctx.store(ctx, std::memory_order_release);
      found = &entry.waited;
      break;
    }
  }
  pthread_mutex_unlock(&g_owed_mu);
  return found;
}

// A created stream's registry entry, registered if new; null if it cannot be (the stream then
// waits every time).
StreamEntry* StreamEntryFor(std::uintptr_t handle) {
  stream_fence_internal::ThreadCache& cache = t_stream;
  if (cache.handle == handle && cache.generation == g_generation.load(std::memory_order_acquire)) {
    return cache.entry;
  }
  StreamEntry* entry = Find(handle);
  if (entry != nullptr) return entry;
  const RealDriver& real = Real();
  CUcontext ctx = nullptr;
  if (real.cuStreamGetCtx == nullptr) return nullptr;
  {
    DriverCallScope scope(nullptr);  // relaxed capture mode
    if (real.cuStreamGetCtx(reinterpret_cast<CUstream>(handle), &ctx) != CUDA_SUCCESS ||
        ctx == nullptr) {
      return nullptr;
    }
  }
  pthread_mutex_lock(&g_fence_mu);
  entry = Insert(handle, ctx);
  pthread_mutex_unlock(&g_fence_mu);
  return entry;
}

// Raises `waited` to `gen` (never lowers it: another thread may have waited for more).
void RaiseWaited(std::atomic<std::uint64_t>* waited, std::uint64_t gen) {
  std::uint64_t now = waited->load(std::memory_order_acquire);
  while (now < gen && !waited->compare_exchange_weak(now, gen, std::memory_order_acq_rel,
                                                     std::memory_order_acquire)) {
  }
}

// With g_owed_mu held: moves the entries `done` selects out of the table (their events into
// `out`, at most kOwedRounds), returns how many.
template <typename Done>
int TakeOwedLocked(Done done, OwedRound* out) {
  int taken = 0;
  for (OwedRound& round : g_owed) {
    if (round.gen == 0 || !done(round)) continue;
    out[taken++] = round;
    round.gen = 0;
    round.count = 0;
    g_owed_live.fetch_sub(1, std::memory_order_seq_cst);
  }
  // The pools whose rounds went: their oldest round still owed (EpochFences::SetOwed).
  for (int i = 0; i < taken; ++i) {
    Slot* slot = out[i].slot;
    if (slot == nullptr || (i > 0 && out[i - 1].slot == slot)) continue;
    std::uint64_t floor = EpochFences::kNoneOwed;
    for (const OwedRound& round : g_owed) {
      if (round.gen != 0 && round.slot == slot) floor = std::min(floor, round.gen);
    }
    slot->fences.SetOwed(slot->fences.owed_newest(), floor);
  }
  return taken;
}

// The events of retired rounds back to their pools' spare lists.
void GiveBack(OwedRound* rounds, int count) {
  for (int i = 0; i < count; ++i) {
    Slot* slot = rounds[i].slot;
    if (slot == nullptr || slot->dead.load(std::memory_order_acquire)) continue;
    EventFenceRing& ring = slot->event_fences;
    pthread_mutex_lock(&ring.mu);
    for (int e = 0; e < rounds[i].count; ++e) GiveEvent(ring, rounds[i].events[e]);
    pthread_mutex_unlock(&ring.mu);
  }
}

}  // namespace

void stream_fence_internal::PayOwedSlow(CUstream stream, bool per_thread) {
  // Even after exit began: work queued by exit handlers may touch a handed-over block.
  const auto handle = reinterpret_cast<std::uintptr_t>(stream);
  const std::uint64_t newest = g_owed_gen.load(std::memory_order_acquire);
  CUstream target = stream;
  std::atomic<std::uint64_t>* waited = nullptr;
  bool thread_stream = false;
  CUcontext ctx = nullptr;
  if (handle <= reinterpret_cast<std::uintptr_t>(CU_STREAM_PER_THREAD)) {
    ctx = CurrentContext();
    if (ctx == nullptr) return;  // the driver refuses the call: nothing is queued
    thread_stream = handle == reinterpret_cast<std::uintptr_t>(CU_STREAM_PER_THREAD) ||
                    (handle == 0 && per_thread);
    if (thread_stream) {
      target = CU_STREAM_PER_THREAD;
      if (t_per_thread.ctx != ctx) t_per_thread = {ctx, 0};
      if (t_per_thread.waited >= newest) return;
    } else {
      target = CU_STREAM_LEGACY;
      waited = LegacyWaitedFor(ctx);
    }
  } else {
    StreamEntry* entry = StreamEntryFor(handle);
    if (entry != nullptr) waited = &entry->waited;
  }
  if (waited != nullptr && waited->load(std::memory_order_acquire) >= newest) return;
  const RealDriver& real = Real();
  // Relaxed capture mode: a wait from this thread must not invalidate another's global capture.
  DriverCallScope scope(nullptr);
  // A capturing stream's work runs when its graph is launched, and the launch pays; it stays
  // owed until its capture ended.
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (real.cuStreamIsCapturing != nullptr &&
      real.cuStreamIsCapturing(target, &status) == CUDA_SUCCESS &&
      status != CU_STREAM_CAPTURE_STATUS_NONE) {
    return;
  }
  const std::uint64_t from =
      thread_stream ? t_per_thread.waited
                    : (waited != nullptr ? waited->load(std::memory_order_acquire) : 0);
  std::uint64_t waits = 0;
  pthread_mutex_lock(&g_owed_mu);
  const std::uint64_t top = g_owed_gen.load(std::memory_order_acquire);
  for (OwedRound& round : g_owed) {
    if (round.gen == 0 || round.gen <= from) continue;
    for (int e = 0; e < round.count; ++e) {
      if (real.cuEventQuery(round.events[e]) == CUDA_SUCCESS) continue;  // the GPU passed it
      if (real.cuStreamWaitEvent(target, round.events[e], 0) != CUDA_SUCCESS) {
        // Cannot order it on the GPU: wait on the host instead.
        (void)real.cuEventSynchronize(round.events[e]);
      }
      ++waits;
    }
  }
  pthread_mutex_unlock(&g_owed_mu);
  if (waits != 0) Counters().gpu_waits.Add(waits);
  if (thread_stream) {
    t_per_thread.waited = top;
  } else if (waited != nullptr) {
    RaiseWaited(waited, top);
  }
}

bool GpuWaitOn() {
  return g_gpu_wait.load(std::memory_order_relaxed) && EventFencesOn() && !Exiting();
}

namespace {

// One owed round's worth of events standing for a run of queued fences: the newest event of
// each stream. Events on one stream complete in order, so its newest covers the older ones.
struct MergedEvents {
  int count = 0;
  CUevent events[EventFenceRing::kEventsPerFence] = {};
  CUstream streams[EventFenceRing::kEventsPerFence] = {};
  std::uint64_t generations[EventFenceRing::kEventsPerFence] = {};

  // Adds `fence`'s events, replacing each stream's older one; false (and unchanged) if they do
  // not fit. A handle stands for the same stream only within one registry generation (the
  // legacy stream always); an event of a destroyed stream (null) is never replaced.
  bool Add(const EventFenceRing::Fence& fence) {
    MergedEvents next = *this;
    for (int e = 0; e < fence.count; ++e) {
      const CUstream stream = fence.streams[e];
      int at = -1;
      for (int m = 0; m < next.count && at < 0 && stream != nullptr; ++m) {
        if (next.streams[m] == stream &&
            (stream == CU_STREAM_LEGACY || next.generations[m] == fence.generation)) {
          at = m;
        }
      }
      if (at < 0) {
        if (next.count == EventFenceRing::kEventsPerFence) return false;
        at = next.count++;
      }
      next.events[at] = fence.events[e];
      next.streams[at] = stream;
      next.generations[at] = fence.generation;
    }
    *this = next;
    return true;
  }
  bool Holds(CUevent event) const {
    for (int m = 0; m < count; ++m) {
      if (events[m] == event) return true;
    }
    return false;
  }
};

}  // namespace

bool HandOverEventFences(Slot* slot) {
  EventFenceRing& ring = slot->event_fences;
  if (!GpuWaitOn() || ring.in_flight.load(std::memory_order_acquire) == 0) return false;
  // The helper retires owed rounds as it polls; if it went to sleep just before a handover,
  // this keeps the table from filling (a lock and a query per owed event, per handover).
  if (g_owed_live.load(std::memory_order_acquire) >= kOwedRounds / 2) (void)RetireOwedWaits();
  DriverCallScope scope(slot->ctx);
  if (!scope.ok()) return false;
  pthread_mutex_lock(&ring.mu);
  PollRingLocked(slot, /*may_sync=*/false);
  if (ring.count == 0) {
    pthread_mutex_unlock(&ring.mu);
    return true;  // completed meanwhile
  }
  // The oldest exact fences whose newest event per stream fit one owed round: fences complete
  // in order, so handing over a prefix of the queue completes exactly its epochs.
  MergedEvents merged;
  int take = 0;
  while (take < ring.count) {
    const EventFenceRing::Fence& fence = ring.fences[(ring.head + take) % EventFenceRing::kFences];
    if (fence.sync || !merged.Add(fence)) break;
    ++take;
  }
  if (take == 0) {
    pthread_mutex_unlock(&ring.mu);
    return false;
  }
  pthread_mutex_lock(&g_owed_mu);
  OwedRound* free_round = nullptr;
  for (OwedRound& round : g_owed) {
    if (round.gen == 0) {
      free_round = &round;
      break;
    }
  }
  if (free_round == nullptr) {
    pthread_mutex_unlock(&g_owed_mu);
    pthread_mutex_unlock(&ring.mu);
    return false;
  }
  const std::uint64_t gen = g_owed_gen.load(std::memory_order_relaxed) + 1;
  free_round->slot = slot;
  free_round->ctx = slot->ctx;
  free_round->count = merged.count;
  for (int i = 0; i < merged.count; ++i) free_round->events[i] = merged.events[i];
  free_round->gen = gen;
  const std::uint64_t floor = slot->fences.owed_floor();
  slot->fences.SetOwed(gen, floor == EpochFences::kNoneOwed ? gen : floor);
  // Owed before the epochs complete: whoever gets a block of them sees the round (the store
  // happens before the allocation returns the block).
  g_owed_live.fetch_add(1, std::memory_order_seq_cst);
  g_owed_gen.store(gen, std::memory_order_seq_cst);
  pthread_mutex_unlock(&g_owed_mu);
  slot->fences.NoteGpuOwed();
  slot->fences.CompleteFromEvents(
      ring.fences[(ring.head + take - 1) % EventFenceRing::kFences].epoch);
  for (int f = 0; f < take; ++f) {
    EventFenceRing::Fence& fence = ring.fences[ring.head];
    // The events a newer one of their stream stands for go back; the others belong to the owed
    // round now.
    for (int e = 0; e < fence.count; ++e) {
      if (!merged.Holds(fence.events[e])) GiveEvent(ring, fence.events[e]);
    }
    fence.count = 0;
    PopOldest(ring);
  }
  pthread_mutex_unlock(&ring.mu);
  Counters().gpu_wait_handovers.Add(1);
  return true;
}

namespace {

// Takes the owed rounds `done` says are finished (under g_owed_mu, in a driver-call scope) out of
// the table and gives their events back.
template <typename Done>
void RetireOwed(Done done) {
  OwedRound retired[kOwedRounds];
  int count = 0;
  {
    DriverCallScope scope(nullptr);
    pthread_mutex_lock(&g_owed_mu);
    count = TakeOwedLocked(done, retired);
    pthread_mutex_unlock(&g_owed_mu);
  }
  GiveBack(retired, count);
}

}  // namespace

bool RetireOwedWaits() {
  if (g_owed_live.load(std::memory_order_acquire) == 0) return false;
  const RealDriver& real = Real();
  RetireOwed([&](const OwedRound& round) {
    for (int e = 0; e < round.count; ++e) {
      if (real.cuEventQuery(round.events[e]) == CUDA_ERROR_NOT_READY) return false;
    }
    return true;
  });
  return g_owed_live.load(std::memory_order_acquire) != 0;
}

void DrainOwedWaitsOnHost() {
  if (g_owed_live.load(std::memory_order_acquire) == 0) return;
  const RealDriver& real = Real();
  RetireOwed([&](const OwedRound& round) {
    for (int e = 0; e < round.count; ++e) (void)real.cuEventSynchronize(round.events[e]);
    return true;
  });
}

namespace {

// Rounds of a context that is gone: its events went with it.
void ForgetOwedOfContext(CUcontext ctx) {
  OwedRound dropped[kOwedRounds];
  pthread_mutex_lock(&g_owed_mu);
  (void)TakeOwedLocked([&](const OwedRound& round) { return round.ctx == ctx; }, dropped);
  for (LegacyWaited& entry : g_legacy_waited) {
    // Its legacy stream is gone too; a new context at the same address owes every live round.
    if (entry.ctx.load(std::memory_order_relaxed) == ctx) {
      entry.waited.store(0, std::memory_order_relaxed);
    }
  }
  pthread_mutex_unlock(&g_owed_mu);
}

void ResetOwedInChild() {
  pthread_mutex_init(&g_owed_mu, nullptr);
  for (OwedRound& round : g_owed) round = OwedRound{};
  for (LegacyWaited& entry : g_legacy_waited) {
    entry.ctx.store(nullptr, std::memory_order_relaxed);
    entry.waited.store(0, std::memory_order_relaxed);
  }
  g_owed_live.store(0, std::memory_order_relaxed);
  g_owed_gen.store(0, std::memory_order_relaxed);
  t_per_thread = {};
}

}  // namespace

}  // namespace vramscope::interposer
