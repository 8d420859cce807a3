#include "slots.h"

#include <algorithm>

#include "counters.h"

namespace vramscope::interposer {
namespace slots_internal {

constinit std::atomic<Slot*> g_slots[kMaxSlots] = {};
constinit std::atomic<int> g_slot_count{0};
constinit std::atomic<std::uint64_t> g_generation{1};
__attribute__((tls_model("initial-exec"))) constinit thread_local SlotCache t_cache{};

}  // namespace slots_internal

namespace {

using slots_internal::g_generation;
using slots_internal::g_slot_count;
using slots_internal::g_slots;
using slots_internal::t_cache;

constinit pthread_mutex_t g_slots_mu = PTHREAD_MUTEX_INITIALIZER;

// Policy names live as long as the pools that were given a string_view of them.
struct PolicyName {
  char text[32] = {};
};
constinit PolicyName g_policy_names[kMaxSlots] = {};

}  // namespace

Slot* ScanFor(CUcontext ctx) {
  const int count = g_slot_count.load(std::memory_order_acquire);
  for (int i = 0; i < count; ++i) {
    Slot* slot = g_slots[i].load(std::memory_order_acquire);
    if (slot != nullptr && slot->ctx == ctx && !slot->dead.load(std::memory_order_acquire)) {
      return slot;
    }
  }
  return nullptr;
}

Slot* ExistingSlot(CUcontext ctx) {
  Slot* slot = CachedSlotFor(ctx);
  return slot != nullptr ? slot : ScanFor(ctx);
}

int LiveSlots(Slot** out, int capacity) {
  const int count = g_slot_count.load(std::memory_order_acquire);
  int written = 0;
  for (int i = 0; i < count && written < capacity; ++i) {
    Slot* slot = g_slots[i].load(std::memory_order_acquire);
    if (slot != nullptr && slot->pool != nullptr && !slot->dead.load(std::memory_order_acquire)) {
      out[written++] = slot;
    }
  }
  return written;
}

Slot* FindPooledBlock(std::uintptr_t address, pool::BlockInfo* info) {
  Slot* slots[kMaxSlots];
  const int count = LiveSlots(slots, kMaxSlots);
  for (int i = 0; i < count; ++i) {
    if (slots[i]->pool->Lookup(address, info) == pool::PoolStatus::kOk) return slots[i];
  }
  return nullptr;
}

Slot* FindOwner(std::uintptr_t address) {
  Slot* slots[kMaxSlots];
  const int count = LiveSlots(slots, kMaxSlots);
  for (int i = 0; i < count; ++i) {
    if (slots[i]->upstream.OwnsAddress(address)) return slots[i];
  }
  return nullptr;
}

void LockSlotTable() { pthread_mutex_lock(&g_slots_mu); }
void UnlockSlotTable() { pthread_mutex_unlock(&g_slots_mu); }
int SlotCount() { return g_slot_count.load(std::memory_order_relaxed); }
char* PolicyNameBuffer(int index) { return g_policy_names[index].text; }

void PublishSlot(int index, Slot* slot) {
  g_slots[index].store(slot, std::memory_order_release);
  g_slot_count.store(index + 1, std::memory_order_release);
}

void InvalidateSlotCaches() { g_generation.fetch_add(1, std::memory_order_acq_rel); }

void LockSlotsForFork() { pthread_mutex_lock(&g_slots_mu); }
void UnlockSlotsAfterFork() { pthread_mutex_unlock(&g_slots_mu); }

void SlotsForkChild() {
  UnlockSlotsAfterFork();
  // The child must not touch the parent's pools (their locks may be held by threads that do
  // not exist here, their memory belongs to the parent's context): leak them.
  const int count = g_slot_count.load(std::memory_order_relaxed);
  for (int i = 0; i < count; ++i) g_slots[i].store(nullptr, std::memory_order_relaxed);
  g_slot_count.store(0, std::memory_order_release);
  g_generation.fetch_add(1, std::memory_order_acq_rel);
  t_cache = {};
}

const char* RefreshPoolFigures() {
  const char* policy = nullptr;
  for (int device = 0; device < kMaxDevices; ++device) {
    DeviceCounters& counters = DeviceCountersFor(device);
    std::uint64_t values[9] = {};
    const int count = g_slot_count.load(std::memory_order_acquire);
    for (int i = 0; i < count; ++i) {
      Slot* slot = g_slots[i].load(std::memory_order_acquire);
      if (slot == nullptr || slot->pool == nullptr || slot->device != device) continue;
      if (policy == nullptr) policy = g_policy_names[i].text;
      const pool::PoolStats stats = slot->pool->Stats();
      const bool live = !slot->dead.load(std::memory_order_acquire);
      if (live) {
        values[0] += stats.current_requested_bytes;
        values[2] += stats.current_allocated_bytes;
        values[4] += stats.free_bytes;
        values[5] += stats.pending_bytes;
      }
      values[1] = std::max<std::uint64_t>(values[1], stats.peak_requested_bytes);
      values[3] = std::max<std::uint64_t>(values[3], stats.peak_allocated_bytes);
      values[6] += stats.alloc_count;
      values[7] += stats.free_count;
      values[8] += stats.oom_count;
    }
    counters.current_requested_bytes.value.store(values[0], std::memory_order_relaxed);
    counters.peak_requested_bytes.value.store(values[1], std::memory_order_relaxed);
    counters.current_allocated_bytes.value.store(values[2], std::memory_order_relaxed);
    counters.peak_allocated_bytes.value.store(values[3], std::memory_order_relaxed);
    counters.idle_bytes.value.store(values[4], std::memory_order_relaxed);
    counters.pending_bytes.value.store(values[5], std::memory_order_relaxed);
    counters.allocs.value.store(values[6], std::memory_order_relaxed);
    counters.frees.value.store(values[7], std::memory_order_relaxed);
    counters.oom.value.store(values[8], std::memory_order_relaxed);
  }
  return policy;
}

}  // namespace vramscope::interposer
