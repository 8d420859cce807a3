// Sizes of the allocations the shim passes through, so that their frees can be counted: a map
// from key (device pointer, host pointer, VMM handle, array handle, graph pool) to size and kind.
//
// Thread safety: sharded, one mutex per shard; LockAll/UnlockAll bracket fork() so the child
// inherits consistent shards. Allocation: std::unordered_map nodes from malloc, only on
// passthrough paths (each already costs a driver call).
#pragma once

#include <cstdint>

#include "counters.h"

namespace vramscope::interposer {

// kArrays: CUarray and CUmipmappedArray handles; kGraphPools: one entry per device at
// GraphPoolKey(device) (graph_memory.h).
enum class RegistryId : int {
  kDevicePointers = 0,
  kHostPointers,
  kVmmHandles,
  kArrays,
  kGraphPools,
  kCount
};

struct RegistryEntry {
  std::uint64_t size = 0;
  std::uint64_t requested = 0;  // what the caller asked for (pitched: width x height)
  Kind kind = Kind::kDevice;
  int device = 0;
};

// Where a passthrough allocation lives, for the event ring (ring_events.h).
struct AllocOrigin {
  int device = -1;              // -1: the calling thread's current device (0 without a context)
  std::uint64_t requested = 0;  // 0: the allocation's size
  std::uint64_t stream = 0;     // stream-ordered allocations
};

// Records an allocation: counters of `kind`, the registry entry, and (when recording events)
// an ALLOC record of the ring's kind for `kind`.
void RecordAlloc(RegistryId registry, std::uintptr_t key, std::uint64_t size, Kind kind,
                 AllocOrigin origin = {});
// Forgets it, with a FREE record; false if the key was not recorded.
bool RecordFree(RegistryId registry, std::uintptr_t key, RegistryEntry* entry = nullptr,
                std::uint64_t stream = 0);

// Fork (shim.cc's table): every shard's lock in the prepare/parent order; the child releases
// them and forgets every entry.
void LockRegistriesForFork();
void UnlockRegistriesAfterFork();
void RegistriesForkChild();

}  // namespace vramscope::interposer
