// Allocation sites (VRAMSCOPE_STACKS=1): the native call stack of each recorded allocation,
// unwound in the application and resolved to function, file and line outside it.
//
// CaptureSite walks the stack with fast_unwind.h (cached .eh_frame rules, per-thread caches of
// the paths walked; libgcc's _Unwind_Backtrace where that walk gives up, or for every walk with
// VRAMSCOPE_STACKS_UNWIND=libgcc), skips the shim's own frames, keeps at most
// VRAMSCOPE_RING_MAX_SITE_FRAMES return addresses and hashes them (four lanes) into the site id.
// A fixed-size open-addressing table of seen ids (CAS insert, no lock) decides who writes a
// site's frames: the thread that inserts it, once, as SITE records (vramscope/ring.h). Addresses
// outside every known module make it refresh the module map with dl_iterate_phdr (under a spin
// lock; only on a new site) and write a MODULE record per new module. When the table is full, sites
// are still named in ALLOC records but their frames are not sent (the report shows the bare id).
//
// Thread safety: any thread, any time. Costs: the walk dominates (tests/stacks/stack_bench
// measures the extra per allocation; see README.md); then one hash and a probe.
// No allocation, no exceptions (the unwinder only reads). Fork: StacksForkChild forgets what was
// sent (the child's ring starts empty).
#pragma once

#include <cstdint>

#include "ring_events.h"

namespace vramscope::interposer {

// The calling allocation's site id, writing its frames (and any new module) into `ring` when
// first seen; 0 when stacks are off (VRAMSCOPE_STACKS unset), `ring` is null or the unwind
// found no frame outside the shim.
std::uint64_t CaptureSite(RingWriter* ring);

// Fork child (single-threaded): every site and module is sent again to the child's ring.
void StacksForkChild();

}  // namespace vramscope::interposer
