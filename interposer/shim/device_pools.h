// The pooled allocation and free of device memory: one Pool per primary context, created lazily
// on the first cuMemAlloc_v2 made under it (the slot, slots.h), with the driver behind it
// (driver_upstream.h) and the device-wide fence (epoch_fences.h); frees routed by address to the
// pool that holds them, under the mode's fence rule and the reuse heuristics (reuse_policy.h).
//
// Thread safety: everything here may be called from any thread. Errors: ShimStatus (kNotOurs:
// not pooled, the caller passes the call through); a driver error is returned in
// `driver_error`.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda.h>

#include "slots.h"
#include "status.h"

namespace vramscope::interposer {

// The slot of `ctx` (which is current on this thread), created if needed. Never null after
// init unless the table is full; slot->pool is null when the context is not pooled.
Slot* SlotForCurrentContext(CUcontext ctx);

// Frees a pooled pointer; kNotOurs if no pool holds it. Applies the mode's fence rule.
ShimStatus FreePooled(std::uintptr_t address, bool strict);
// cuMemAlloc_v2 through the pool of the current context. kNotOurs: not pooled, pass through.
ShimStatus AllocatePooled(CUcontext ctx, std::size_t bytes, std::uintptr_t* address,
                          CUresult* driver_error);
// The runtime-level cudaMalloc's fast path: a block the pool of the current context already
// holds (fences polled), or kUnavailable where AllocatePooled would synchronise or grow (the
// caller then goes through the runtime and AllocatePooled, which repeats only the lookup of a
// cached block before it does so; nothing is recorded twice).
ShimStatus AllocateCachedPooled(CUcontext ctx, std::size_t bytes, std::uintptr_t* address);

// Idle bytes (reserved - allocated) of every live pool on `device`.
std::uint64_t IdleBytesOnDevice(int device);
// Gives idle cached memory back to the driver (after a synchronisation if possible); true if
// anything was released. For a retry after a driver OOM.
bool FlushCaches();

// `context_alive`: called before the driver tears the context down (reset), so the shim may
// still wait for its work; false after a destroy or last release.
void DropContext(CUcontext ctx);
void DropPrimaryContext(int device, bool context_alive);

}  // namespace vramscope::interposer
