// The ring records of pooled memory: ALLOC and FREE of pooled blocks with the sizes the pool
// reports, OOM with the pool's verdict, POOL_STATE from the pool's Stats(). Above the slot table
// (slots.h), which they read, and below the pooled allocation and free (device_pools.h), which
// write them.
//
// Thread safety: any thread (the ring writer is lock-free); never with the pool's lock held.
// Costs: the check for an open ring is inline, the record is not. Nothing here fails (a full
// ring counts its drops).
#pragma once

#include <cstdint>

#include "ring_events.h"
#include "slots.h"

namespace vramscope::interposer {

// Pooled memory. `slot` holds the block; sizes come from the pool (AllocateSized/FreeSized).
void RingPooledAllocRecord(RingWriter* ring, Slot* slot, std::uintptr_t address,
                           std::uint64_t requested, std::uint64_t allocated);
void RingPooledFreeRecord(RingWriter* ring, Slot* slot, std::uintptr_t address,
                          std::uint64_t requested, std::uint64_t allocated);
// The pool's hot path: the check is inline, the record (when a ring is open) is not.
inline void RingPooledAlloc(Slot* slot, std::uintptr_t address, std::uint64_t requested,
                            std::uint64_t allocated) {
  if (RingWriter* ring = Ring()) RingPooledAllocRecord(ring, slot, address, requested, allocated);
}
inline void RingPooledFree(Slot* slot, std::uintptr_t address, std::uint64_t requested,
                           std::uint64_t allocated) {
  if (RingWriter* ring = Ring()) RingPooledFreeRecord(ring, slot, address, requested, allocated);
}
// The pool could not serve `requested`: an OOM record with the pool's verdict, then its state.
void RingPooledOom(Slot* slot, std::uint64_t requested);
// A POOL_STATE record from the pool's Stats() (never call with the pool's lock held).
void RingPoolState(Slot* slot);

}  // namespace vramscope::interposer
