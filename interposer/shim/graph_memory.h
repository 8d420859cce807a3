// Graph memory: what the driver holds for CUDA graphs' memory nodes, recorded as one entry per
// device (Kind::kGraph, ring kind GRAPH).
//
// Graph-owned memory (cuGraphAddMemAllocNode, cuGraphAddNode(_v2) with a MEM_ALLOC node, or
// cuMemAllocAsync on a capturing stream) is not allocated when the node is made: the driver maps
// it from the device's graph memory pool when a graph is instantiated, uploaded or launched, and
// gives it back on cuDeviceGraphMemTrim (or when graphs are destroyed). The only figure the driver
// offers is per device: cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT).
//
// Scheme: each device d with graph memory has one registry entry (RegistryId::kGraphPools) at the
// fixed key GraphPoolKey(d), a non-canonical address no pointer or handle can take. After each
// call that can change the figure, RefreshGraphMemory reads it and, if it differs from the entry,
// records FREE(old size) then ALLOC(new size) of that entry (free first, so the transient never
// raises a peak). The summary's graph= and the report's "graph" kind are thus the driver's
// reserved graph memory per device, and the totals add up with every other kind.
//
// Cost: nothing is read until the process has made a mem-alloc node (NoteGraphMemAllocNode sets
// a bit of a relaxed atomic device mask); a graph launch in a process without one pays one relaxed
// load. After that, each refresh reads the attribute once per device in the mask under that
// device's mutex (keeps the recorded sequence equal to the sequence of reads).
//
// Thread safety: any thread. Fork: LockGraphMemoryForFork/UnlockGraphMemoryAfterFork bracket
// fork() (taken before the registries' locks, as in RefreshGraphMemory); the child resets.
#pragma once

#include <cstdint>

namespace vramscope::interposer {

inline constexpr std::uintptr_t kGraphPoolKeyBase = 0xFFFFFFFFFFFF0000ull;
inline std::uintptr_t GraphPoolKey(int device) {
  return kGraphPoolKeyBase + static_cast<std::uintptr_t>(device);
}

// A mem-alloc node was made for `device` (-1: the calling thread's current device).
void NoteGraphMemAllocNode(int device);

// Re-reads the graph pool of every device that has mem-alloc nodes, and of `also_device`
// (-1: none), and records changes. Returns at once (one relaxed load) if no node was ever made.
void RefreshGraphMemory(int also_device = -1);

// Fork (shim.cc's table): the graph pools' lock in the prepare/parent order; the child releases
// it and forgets the recorded pools.
void LockGraphMemoryForFork();
void UnlockGraphMemoryAfterFork();
void ResetGraphMemoryInChild();

}  // namespace vramscope::interposer
