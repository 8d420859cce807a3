#include "registry.h"

#include <pthread.h>

#include <unordered_map>

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

}  // namespace

void RecordAlloc(RegistryId registry, std::uintptr_t key, std::uint64_t size, Kind kind) {
  KindCounters& counters = Counters().kind[static_cast<int>(kind)];
  counters.bytes.Add(size);
  counters.allocs.Add(1);
  if (IsDeviceMemory(kind)) Counters().passthrough_device_bytes.Add(size);
  Shard& shard = ShardFor(registry, key);
  pthread_mutex_lock(&shard.mu);
  if (shard.map == nullptr) shard.map = new std::unordered_map<std::uintptr_t, RegistryEntry>();
  RegistryEntry& entry = (*shard.map)[key];
  if (entry.size != 0) {
    // The driver handed out a key we still hold: the old one was freed by a route we do not
    // see (e.g. context teardown). Uncount it.
    KindCounters& stale = Counters().kind[static_cast<int>(entry.kind)];
    stale.bytes.Sub(entry.size);
    stale.frees.Add(1);
    if (IsDeviceMemory(entry.kind)) Counters().passthrough_device_bytes.Sub(entry.size);
  }
  entry = {size, kind};
  pthread_mutex_unlock(&shard.mu);
}

bool RecordFree(RegistryId registry, std::uintptr_t key, RegistryEntry* out) {
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

void ClearRegistriesInChild() {
  for (auto& registry : g_shards) {
    for (Shard& shard : registry) {
      if (shard.map != nullptr) shard.map->clear();
    }
  }
}

}  // namespace vramscope::interposer
