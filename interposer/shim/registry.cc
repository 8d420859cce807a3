#include "registry.h"

#include <pthread.h>

#include <unordered_map>

#include "origin.h"
#include "ring_events.h"

namespace vramscope::interposer {
namespace {

constexpr int kShards = 16;

struct Shard {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  // Created on first use and never destroyed: no constructor or destructor at load/exit time.
  std::unordered_map<std::uintptr_t, RegistryEntry>* map = nullptr;
};

constexpr int kRegistries = static_cast<int>(RegistryId::kCount);
constinit Shard g_shards[kRegistries][kShards] = {};

Shard& ShardFor(RegistryId registry, std::uintptr_t key) {
  const std::uint64_t mixed = (key >> 8) * 0x9E3779B97F4A7C15ull;
  return g_shards[static_cast<int>(registry)][mixed >> 60];
}

void RingFree(std::uintptr_t key, const RegistryEntry& entry, std::uint64_t stream) {
  RingWriter* ring = Ring();
  const std::uint8_t ring_kind = RingAllocKind(entry.kind);
  if (ring == nullptr || ring_kind == VRAMSCOPE_RING_ALLOC_UNSPECIFIED) return;
  (void)ring->RecordFree(static_cast<std::uint32_t>(entry.device), key, entry.requested, entry.size,
                         ring_kind, stream);
}

}  // namespace

void RecordAlloc(RegistryId registry, std::uintptr_t key, std::uint64_t size, Kind kind,
                 AllocOrigin origin) {
  RingWriter* ring = Ring();
  const std::uint8_t ring_kind = RingAllocKind(kind);
  const int device = origin.device >= 0 ? origin.device
                     : ring != nullptr  ? CurrentDeviceOrZero()
                                        : 0;
  const std::uint64_t requested = origin.requested != 0 ? origin.requested : size;
  KindCounters& counters = Counters().kind[static_cast<int>(kind)];
  counters.bytes.Add(size);
  counters.allocs.Add(1);
  if (IsDeviceMemory(kind)) Counters().passthrough_device_bytes.Add(size);
  Shard& shard = ShardFor(registry, key);
  pthread_mutex_lock(&shard.mu);
  if (shard.map == nullptr) shard.map = new std::unordered_map<std::uintptr_t, RegistryEntry>();
  RegistryEntry& entry = (*shard.map)[key];
  RegistryEntry stale_entry;
  const bool stale = entry.size != 0 || entry.requested != 0;
  if (stale) {
    // The driver handed out a key we still hold: the old one was freed by a route we do not
    // see (e.g. context teardown). Uncount it.
    KindCounters& stale_counters = Counters().kind[static_cast<int>(entry.kind)];
    stale_counters.bytes.Sub(entry.size);
    stale_counters.frees.Add(1);
    if (IsDeviceMemory(entry.kind)) Counters().passthrough_device_bytes.Sub(entry.size);
    stale_entry = entry;
  }
  entry = {size, requested, kind, device};
  pthread_mutex_unlock(&shard.mu);
  if (ring == nullptr || ring_kind == VRAMSCOPE_RING_ALLOC_UNSPECIFIED) return;
  if (stale) RingFree(key, stale_entry, 0);
  NoteRingDevice(device);
  const RingAllocOrigin caller = RingCallerOrigin(ring);
  (void)ring->RecordAlloc(static_cast<std::uint32_t>(device), key, requested, size, ring_kind,
                          origin.stream, caller.nvtx_range, caller.site);
}

bool RecordFree(RegistryId registry, std::uintptr_t key, RegistryEntry* out, std::uint64_t stream) {
  Shard& shard = ShardFor(registry, key);
  RegistryEntry entry;
  bool found = false;
  pthread_mutex_lock(&shard.mu);
  if (shard.map != nullptr) {
    auto it = shard.map->find(key);
    if (it != shard.map->end()) {
      entry = it->second;
      shard.map->erase(it);
      found = true;
    }
  }
  pthread_mutex_unlock(&shard.mu);
  if (!found) return false;
  KindCounters& counters = Counters().kind[static_cast<int>(entry.kind)];
  counters.bytes.Sub(entry.size);
  counters.frees.Add(1);
  if (IsDeviceMemory(entry.kind)) Counters().passthrough_device_bytes.Sub(entry.size);
  RingFree(key, entry, stream);
  if (out != nullptr) *out = entry;
  return true;
}

void LockRegistriesForFork() {
  for (auto& registry : g_shards) {
    for (Shard& shard : registry) pthread_mutex_lock(&shard.mu);
  }
}

void UnlockRegistriesAfterFork() {
  for (auto& registry : g_shards) {
    for (Shard& shard : registry) pthread_mutex_unlock(&shard.mu);
  }
}

void RegistriesForkChild() {
  UnlockRegistriesAfterFork();
  for (auto& registry : g_shards) {
    for (Shard& shard : registry) {
      if (shard.map != nullptr) shard.map->clear();
    }
  }
}

}  // namespace vramscope::interposer
