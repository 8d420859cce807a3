// RingFaultScope: reading a mapped ring file that another process may shrink at any moment.
//
// What it is: a ring is a MAP_SHARED mapping of a file its writer (any local user, for a root
// agent) owns. When that file is truncated, touching a mapped page past its new end raises
// SIGBUS, whose default action kills the reader (exit status 135). Checking the size with fstat
// before each access cannot prevent it (the file can shrink right after the check), so:
//
//   * the reader marks the mapping it is about to touch in a thread-local marker for the
//     duration of a RingFaultScope;
//   * a process-wide SIGBUS handler (InstallRingFaultHandler, installed once, the first time a
//     file ring is opened) looks at the faulting address: inside the range marked by the thread
//     that faulted, it maps anonymous zero pages over the whole marked range (mmap MAP_FIXED, same
//     address, size and protection), notes the fault in the marker and returns. The faulting
//     load or store runs again against the zero pages and the reader goes on; at its next check
//     (faulted()) it drops what it read and reports the ring as damaged.
//   * a fault anywhere else is handed to the handler that was installed before this one, or, if
//     that was the default (or SIG_IGN), SIGBUS is reset to the default action and raised again:
//     a real crash stays a crash, with its core dump.
//
// Why not siglongjmp out of the handler: the fault can hit in the middle of std::string::append
// or a protobuf Add (the reader copies text straight out of the ring), and jumping over those
// frames would skip destructors and leave objects half-updated. Replacing the pages keeps every
// frame intact, needs no restructuring of the reader, and costs nothing per record (a scope is
// two thread-local stores; the handler runs only on a fault). Why not pread() instead of a
// mapping: the reader polls atomics in the header (head, per-slot seq) and stores the tail,
// which a copy cannot do; and copying every record doubles the memory traffic of the drain.
//
// Thread safety: scopes are per thread and nest (an inner scope of the same range passes a fault
// on to the outer one when it ends). The mapping must stay mapped while a scope marks it.
// Error convention: none here; the caller turns faulted() into an absl::Status.
#pragma once

#include <cstddef>

namespace vramscope::agent {

// Installs the SIGBUS handler once per process (thread-safe, idempotent). The handler chains to
// whatever SIGBUS disposition was in place when it was installed.
void InstallRingFaultHandler();

class RingFaultScope {
 public:
  // Marks [base, base + size) for this thread until the scope ends. A null base marks nothing
  // (memory rings, which cannot shrink).
  RingFaultScope(void* base, std::size_t size);
  ~RingFaultScope();
  RingFaultScope(const RingFaultScope&) = delete;
  RingFaultScope& operator=(const RingFaultScope&) = delete;

  // A SIGBUS hit the marked range since the scope began: the range now holds zero pages.
  bool faulted() const;
  // Offset of the first faulting address from base (valid when faulted()).
  std::size_t fault_offset() const;

 private:
  struct Saved {
    char* begin;
    char* end;
    bool faulted;
    std::size_t offset;
  };
  Saved saved_;
};

// How many faults the handler turned into damaged rings, process-wide (for tests and logs).
unsigned long RingFaultsHandled();

}  // namespace vramscope::agent
