// The slot table: one Slot per context the shim has seen (the pool of a primary context, its
// driver upstream, its fences), published lock-free for lookups, with a per-thread cache of the
// last slot for the allocation hot path. Creating and dropping slots is device_pools.h's; this
// file holds the table, its lock, its lookups and the pools' figures for the summary.
//
// Slots are never deleted: a context reset or destroy marks its slot dead (the memory went with
// the context) and leaks the Pool object, so a racing thread can never touch freed metadata and
// the dead upstream never calls the driver again.
//
//
// Thread safety: lookups are lock-free (acquire loads of published slots); the table lock
// (LockSlotTable) serialises creation, drops and fork. Nothing here fails; lookups answer null.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include <cuda.h>

#include "driver_upstream.h"
#include "epoch_fences.h"
#include "event_fence_ring.h"
#include "vramscope/pool/pool.h"

namespace vramscope::interposer {

struct Slot {
  CUcontext ctx = nullptr;
  int device = 0;
  bool primary = false;
  std::atomic<bool> dead{false};
  DriverUpstream upstream;
  EpochFences fences;
  std::atomic<bool> sync_requested{false};   // a background synchronisation is queued/running
  std::unique_ptr<pool::Pool> pool;          // null: this context is not pooled (passthrough)
  std::atomic<std::uint32_t> ring_frees{0};  // pooled frees since the last POOL_STATE record
  EventFenceRing event_fences;               // queued event fences (stream_fence.h)
};

// Contexts with a slot, at most (a context beyond them is not pooled).
inline constexpr int kMaxSlots = 64;

namespace slots_internal {

extern constinit std::atomic<Slot*> g_slots[kMaxSlots];
extern constinit std::atomic<int> g_slot_count;
// Bumped whenever a slot dies or the table is forgotten; invalidates the per-thread cache.
extern constinit std::atomic<std::uint64_t> g_generation;

struct SlotCache {
  CUcontext ctx = nullptr;
  Slot* slot = nullptr;
  std::uint64_t generation = 0;
};
extern __attribute__((tls_model("initial-exec"))) constinit thread_local SlotCache t_cache;

}  // namespace slots_internal

// The calling thread's last slot, if it is `ctx`'s and still valid: the allocation hot path.
__attribute__((always_inline)) inline Slot* CachedSlotFor(CUcontext ctx) {
  using slots_internal::t_cache;
  const std::uint64_t generation = slots_internal::g_generation.load(std::memory_order_acquire);
  if (t_cache.ctx == ctx && t_cache.generation == generation) return t_cache.slot;
  return nullptr;
}

// The live slot of `ctx` in the table (no cache), or null.
Slot* ScanFor(CUcontext ctx);
// The live slot of `ctx`, or null; never creates one.
Slot* ExistingSlot(CUcontext ctx);
// Live slots, for routing by address. Returns how many were written.
int LiveSlots(Slot** out, int capacity);
// The slot whose pool holds a live block at `address` (interior pointers included).
Slot* FindPooledBlock(std::uintptr_t address, pool::BlockInfo* info);
// The slot whose upstream holds `address` (live, cached or freed-pending memory).
Slot* FindOwner(std::uintptr_t address);

// The table lock: held to create, publish or drop a slot, and across fork.
void LockSlotTable();
void UnlockSlotTable();
// Under the table lock: the slots published so far; the policy-name buffer (32 bytes, alive as
// long as the process) of the slot at `index`; publishes `slot` at `index` == SlotCount().
int SlotCount();
char* PolicyNameBuffer(int index);
void PublishSlot(int index, Slot* slot);
// Invalidates every thread's cached slot (a slot died).
void InvalidateSlotCaches();

// Fork (shim.cc's table): the table lock in the prepare/parent order; the child releases it and
// forgets every slot without touching it.
void LockSlotsForFork();
void UnlockSlotsAfterFork();
void SlotsForkChild();
// Copies the pools' exact figures into Counters() and returns the policy name in use.
const char* RefreshPoolFigures();

}  // namespace vramscope::interposer
