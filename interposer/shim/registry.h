// Sizes of the allocations the shim passes through, so that their frees can be counted: a map
// from key (device pointer, host pointer or VMM handle) to size and kind.
//
// Thread safety: sharded, one mutex per shard; LockAll/UnlockAll bracket fork() so the child
// inherits consistent shards. Allocation: std::unordered_map nodes from malloc, only on
// passthrough paths (each already costs a driver call).
#pragma once

#include <cstdint>

#include "counters.h"

namespace vramscope::interposer {

enum class RegistryId : int { kDevicePointers = 0, kHostPointers, kVmmHandles, kCount };

struct RegistryEntry {
  std::uint64_t size = 0;
  Kind kind = Kind::kDevice;
};

// Records an allocation: counters of `kind` and the registry entry.
void RecordAlloc(RegistryId registry, std::uintptr_t key, std::uint64_t size, Kind kind);
// Forgets it; false if the key was not recorded.
bool RecordFree(RegistryId registry, std::uintptr_t key, RegistryEntry* entry = nullptr);

void LockRegistriesForFork();
void UnlockRegistriesAfterFork();
void ClearRegistriesInChild();

}  // namespace vramscope::interposer
