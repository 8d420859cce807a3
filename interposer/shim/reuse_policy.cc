#include "reuse_policy.h"

#include "vramscope/ring/ring_writer.h"

// The out-of-line halves of reuse_policy.h: what its inline checks decided is due.
namespace vramscope::interposer::reuse {

__attribute__((noinline)) void MaybeSyncDue(Slot* slot, std::uint64_t frees,
                                            std::uint64_t pending) {
  const Config& config = Cfg();
  const std::uint64_t batch_bytes = slot->fences.batch_bytes;
  constexpr std::uint64_t kInlineBatches = 4;
  if (frees >= kInlineBatches * config.fence_batch_frees ||
      pending >= kInlineBatches * batch_bytes ||
      (!config.fence_async && (frees >= config.fence_batch_frees || pending >= batch_bytes))) {
    (void)slot->fences.Sync();
  } else if (frees >= config.fence_batch_frees || pending >= batch_bytes) {
    if (!RequestBackgroundSync(slot)) (void)slot->fences.Sync();
  }
}

bool RoundSpacingPassedSlow(const EventFenceRing& ring) {
  return RingNowNs() - ring.last_round_ns.load(std::memory_order_relaxed) >=
         Cfg().fence_round_us * 1000;
}

__attribute__((noinline)) void AskForRound(Slot* slot) {
  // Nothing queued on any stream since the last round: no event to record, no reason to wake
  // the helper.
  if (CompleteIfIdle(slot)) return;
  if (!Cfg().fence_async) {
    // No helper thread: the freeing thread records the round (non-blocking) and polls.
    if (!IssueEventRound()) (void)slot->fences.Sync();
    PollSlotEventFences(slot);
    return;
  }
  if (slot->sync_requested.load(std::memory_order_relaxed)) return;
  if (!RequestBackgroundSync(slot) && !IssueEventRound()) (void)slot->fences.Sync();
}

bool EventLagWait(Slot* slot, std::size_t bytes, std::uintptr_t* address, pool::BlockSizes* sizes) {
  for (int i = 0; i < kMaxLagWaits; ++i) {
    const bool host_due = LagWaitDue(slot, bytes);
    if (!host_due && !HandoverDue(slot)) return false;
    // GPU waits: every block freed so far, now. The frees since the last round get one first
    // (recorded here, a few event records), then all queued fences go over to waits on the GPU
    // as one round. Past the lag bound a fence that cannot be handed over (not exact, the owed
    // table full) makes the host wait for it; below it, growing.
    if (GpuWaitOn() && slot->event_fences.frees_since_round.load(std::memory_order_relaxed) != 0) {
      (void)IssueEventRound();
    }
    if (HandOverEventFences(slot)) {
    } else if (host_due) {
      if (!WaitOldestEventFence(slot) && !IssueEventRound()) return false;
    } else if (slot->event_fences.in_flight.load(std::memory_order_acquire) != 0 ||
               !IssueEventRound()) {
      return false;
    }
    if (slot->pool->AllocateCached(bytes, address, sizes) == pool::PoolStatus::kOk) return true;
  }
  return false;
}

}  // namespace vramscope::interposer::reuse
