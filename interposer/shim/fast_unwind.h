// A fast x86-64 stack walk for allocation sites: libgcc's unwinder re-reads the DWARF call frame
// information (.eh_frame) of every frame on every call, which made a recorded allocation cost
// about 3 us. FastBacktrace reads each code address's rule once and keeps it in a fixed shared
// table, and each thread caches the rules of the paths it walks (below): a later walk through
// the same code is, per frame, one read from the thread's cache and one or two loads from the
// stack.
//
// The rule of an address is what .eh_frame says about it, interpreted here for the forms that
// compilers emit for ordinary functions: the canonical frame address (CFA) as rsp or rbp plus
// an offset, the return address at CFA-8, rbp either untouched or saved at a CFA offset. Tables
// are found with glibc's _dl_find_object (lock-free, async-signal-safe; glibc >= 2.35) and
// .eh_frame_hdr's sorted search table. Anything else (a CFA given by a DWARF expression, as in
// PLT stubs and signal frames; a return address not at CFA-8; code without unwind information
// before the stack's end; a CFA that does not grow) makes the walk give up, and the caller
// falls back to libgcc's _Unwind_Backtrace, which returns the same frames more slowly.
//
// Frames are return addresses, as _Unwind_Backtrace's _Unwind_GetIP gives them: the first is
// the address in FastBacktrace's caller just after the call to it.
//
// Each thread (the first 512 alive at once; they are taken from a fixed pool and given back at
// thread exit) keeps its previous walk's addresses and rules by depth, and a small direct-mapped
// table of its recent addresses: a walk along a known path reads, per frame, one expected address
// and its rule from the thread's array and one or two words from the stack, and probes the
// shared table only for addresses new to the thread.
//
// Thread safety: any thread, any time; the shared rule table is lock-free (a slot is claimed by
// CAS, filled, then published; readers take only published slots), the caches are thread_local.
// No allocation, no exceptions, no system call on the fast path. Fork: the table and caches stay
// valid in the child (same mappings). Rules of code unloaded by dlclose stay in the tables and
// caches: an address reused by another library would be walked with the old rule, so the walk
// checks each CFA (it must grow, and by less than the stack bound) and stops on doubt rather than
// read far away.
#pragma once

#include <cstdint>

namespace vramscope::interposer {

// Writes at most `max` (and at most 128) return addresses into `frames`, innermost first;
// returns how many, or -1 when the walk met a frame it cannot follow (the caller then uses
// _Unwind_Backtrace).
int FastBacktrace(std::uintptr_t* frames, int max);

// Fork child (single-threaded): gives back the thread caches of the threads that did not follow.
void UnwindForkChild();

// Counters for tests and benchmarks: rules computed (shared table misses), walks given up, and
// shared table lookups (addresses found in neither of the calling thread's caches).
struct UnwindCounters {
  std::uint64_t rules_computed;
  std::uint64_t walks_given_up;
  std::uint64_t shared_lookups;
};
UnwindCounters GetUnwindCounters();

}  // namespace vramscope::interposer
