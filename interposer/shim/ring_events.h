// The shim's side of the event ring (interposer/ring, layout vramscope/ring.h): opening it, fork
// and exit. The records carry their caller's origin (origin.h); the pools' own records are
// pool_records.h's.
//
// Where the ring goes is interposer/ring/ring_dir.h's rule: VRAMSCOPE_RING_DIR when set (`vramscope
// run` sets a private one), none when it is `off` or empty, and when it is unset the default
// directory /dev/shm/vramscope that vramscope-agent creates, only if it exists and is safe
// (CheckRingDir). The ring is opened lazily: by the first hook that initialises the shim, and in a
// fork child by the first hook after the fork (the child gets its own file and clean counters; a
// child that never calls the driver leaves no ring). The shim logs once at info level where its
// ring is or why it writes none (VRAMSCOPE_LOG=info); a default directory that exists but is
// unsafe, or a ring that cannot be created, is a warning, once. The program is never affected.
//
// Thread safety: Ring() and the Record* helpers may be called from any thread at any time; the
// writer is lock-free and never allocates. Open/fork/exit run under the shim's init lock or in
// the single-threaded fork child.
// Costs: Ring() is one acquire load; a record is the writer's cost (clock, a CAS, a 60-byte copy)
// (the pool reports pooled sizes from the Allocate/Free it does anyway).
// Ownership: the writer lives in static storage and is never destroyed (no ELF destructor; a
// late free from another thread must still find it mapped).
#pragma once

#include <atomic>
#include <cstdint>

#include "counters.h"
#include "vramscope/ring/ring_writer.h"

namespace vramscope::interposer {

namespace ring_internal {
enum class RingState : int { kOff = 0, kPending, kOpen, kFailed };
extern constinit std::atomic<int> g_ring_state;
extern constinit std::atomic<RingWriter*> g_ring;
void OpenPendingRing();
}  // namespace ring_internal

// The open ring, or nullptr when the process is not recording.
inline RingWriter* Ring() { return ring_internal::g_ring.load(std::memory_order_acquire); }

// Init path (shim lock held, driver loaded): opens the ring where ring_dir.h's rule says.
void OpenRingAtInit(const char* mode_name);
// Every hook (EnsureDriver's fast path): opens a ring left pending by a fork child.
inline void MaybeOpenPendingRing() {
  if (__builtin_expect(ring_internal::g_ring_state.load(std::memory_order_relaxed) ==
                           static_cast<int>(ring_internal::RingState::kPending),
                       0)) {
    ring_internal::OpenPendingRing();
  }
}
// Fork child handler: unmaps the parent's ring (without writing to it) and leaves a new one
// pending for the first hook.
void RingForkChild(const char* mode_name);
// Exit path: the PROCESS_EXIT record and the exit status in the header.
void MarkRingExited(int status);

// Fills the ring's device_info for `device` the first time it is seen (name, UUID, total
// memory). Makes driver calls: not for the thread that is initialising the shim.
void NoteRingDevice(int device);
// The device of the calling thread's current context, or 0 when there is none.
int CurrentDeviceOrZero();

// The ring's allocation kind of a passthrough Kind; UNSPECIFIED for kinds that are not
// allocations in the ring's sense (VMM mappings and address reservations).
std::uint8_t RingAllocKind(Kind kind);

}  // namespace vramscope::interposer
