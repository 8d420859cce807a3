#include "pool_records.h"

#include "origin.h"

namespace vramscope::interposer {

void RingPooledAllocRecord(RingWriter* ring, Slot* slot, std::uintptr_t address,
                           std::uint64_t requested, std::uint64_t allocated) {
  const RingAllocOrigin origin = RingCallerOrigin(ring);
  (void)ring->RecordAlloc(static_cast<std::uint32_t>(slot->device), address, requested, allocated,
                          VRAMSCOPE_RING_ALLOC_POOLED, 0, origin.nvtx_range, origin.site);
}

void RingPooledFreeRecord(RingWriter* ring, Slot* slot, std::uintptr_t address,
                          std::uint64_t requested, std::uint64_t allocated) {
  (void)ring->RecordFree(static_cast<std::uint32_t>(slot->device), address, requested, allocated,
                         VRAMSCOPE_RING_ALLOC_POOLED);
}

void RingPoolState(Slot* slot) {
  RingWriter* ring = Ring();
  if (ring == nullptr || slot->pool == nullptr) return;
  const pool::PoolStats stats = slot->pool->Stats();
  vramscope_ring_pool_state_payload state{};
  state.largest_free_block_bytes = stats.largest_free_block_bytes;
  state.free_bytes = stats.free_bytes;
  state.pending_bytes = stats.pending_bytes;
  state.unreleasable_free_bytes = stats.unreleasable_free_bytes;
  state.reserved_bytes = stats.current_reserved_bytes;
  (void)ring->RecordPoolState(static_cast<std::uint32_t>(slot->device), state);
}

void RingPooledOom(Slot* slot, std::uint64_t requested) {
  RingWriter* ring = Ring();
  if (ring == nullptr || slot->pool == nullptr) return;
  const pool::PoolStats stats = slot->pool->Stats();
  // pool::OomVerdict and vramscope.v1.OomVerdict share their values (1 fragmentation, 2 capacity).
  (void)ring->RecordOom(static_cast<std::uint32_t>(slot->device), requested, stats.free_bytes,
                        stats.largest_free_block_bytes,
                        static_cast<std::uint8_t>(stats.last_oom_verdict));
  RingPoolState(slot);
}

}  // namespace vramscope::interposer
