// Process-wide state of libvramscope.so: lazy, retryable, re-entrancy-safe initialisation (no
// work in ELF constructors), fork and exit handling, the summary line.
//
// Initialisation runs on the first hook that needs it, from any thread, at any time (even
// before the shim's own constructors would have run): it reads VRAMSCOPE_*, opens the real
// driver and registers the pthread_atfork and atexit handlers. A hook called by the thread that
// is initialising (libcuda's constructors may call dlsym) passes straight through. If the
// driver cannot be opened, initialisation is retried on the next hook; if something the shim
// needs is missing, the program runs as if the shim were absent, after one warning.
//
// fork: the child forgets every pool without touching it (its memory belongs to the parent's
// context) and starts with zeroed counters; driver calls then behave as the driver does.
// exit: the atexit handler prints the summary and stops the shim's own driver calls; nothing
// is freed at exit and nothing runs in ELF destructors.
#pragma once

#include <atomic>

#include "cupti.h"
#include "ring_events.h"
#include "state.h"

namespace vramscope::interposer {
namespace shim_internal {
bool EnsureDriverSlow();
}  // namespace shim_internal

// The real driver table is usable (loads libcuda.so.1 on first need).
inline bool EnsureDriver() {
  if (__builtin_expect(shim_internal::Ready(), 1)) {
    MaybeOpenPendingRing();
    MaybeStartCupti();
    return true;
  }
  return shim_internal::EnsureDriverSlow();
}
// For the dlsym hook: initialise only if libcuda is already loaded and this thread is not
// initialising already.
bool EnsureDriverFromDlsym();

// Writes the VRAMSCOPE_SUMMARY line to stderr.
void PrintSummary();

}  // namespace vramscope::interposer
