#include "reuse_policy.h"

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
    // GPU waits: the oldest fence's blocks now, its events waited for by every stream's next
    // work on the GPU; past the lag bound, else the host waits for it. Below the lag bound a
    // fence that cannot be handed over (not exact, the owed table full) means growing; with no
    // fence queued, a round is issued (the frees since the last one) for the next turn.
    if (HandOverOldestEventFence(slot)) {
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
