// Where event rings live: the one place that decides it, for the shim (which writes a ring) and
// vramscope-agent (which creates the default directory and reads it).
//
// The rule:
//   VRAMSCOPE_RING_DIR=DIR      rings go to DIR, as given (`vramscope run` sets a private one).
//   VRAMSCOPE_RING_DIR=off, ""  no ring.
//   unset                       the default directory, VRAMSCOPE_RING_DEFAULT_DIR
//                               (/dev/shm/vramscope, vramscope/ring.h), which vramscope-agent
//                               creates at start. The shim writes there only when it exists and
//                               is safe (CheckRingDir); otherwise it writes no ring.
// VRAMSCOPE_TEST_DEFAULT_RING_DIR=DIR replaces the default directory's path, for tests only (so
// they need not touch /dev/shm/vramscope); it is not a setting for users.
//
// Safe directory (CheckRingDir): a directory, not a symlink (opened with O_NOFOLLOW, judged by
// fstat of what was opened), owned by root or by the calling process's effective user, and, if
// others may write to it (group or world write bit), sticky, so nobody can rename or replace
// another user's ring in it.
//
// Thread safety: everything here is safe from any thread; getenv is read, never written. Error
// convention: enums and errno values, no exceptions; libc only, no heap.
#pragma once

#include <sys/types.h>

namespace vramscope::interposer {

// Where the ring of this process goes, by the rule above.
enum class RingDirSource {
  kOff,       // VRAMSCOPE_RING_DIR=off or empty
  kExplicit,  // VRAMSCOPE_RING_DIR=DIR
  kDefault,   // unset: the default directory, used only when CheckRingDir says kSafe
};
struct RingDirChoice {
  RingDirSource source = RingDirSource::kOff;
  // The directory (kOff: the value that turned rings off). The environment's string or a
  // constant: copy it before the environment may change.
  const char* dir = nullptr;
};
RingDirChoice ChooseRingDir();

// The default directory: $VRAMSCOPE_TEST_DEFAULT_RING_DIR (tests only) when set and not empty,
// else VRAMSCOPE_RING_DEFAULT_DIR.
const char* DefaultRingDir();

enum class RingDirVerdict {
  kSafe,
  kMissing,        // ENOENT
  kNotADirectory,  // a symlink, or not a directory
  kForeignOwner,   // owned by neither root nor the effective user
  kOpenNotSticky,  // group- or world-writable without the sticky bit
  kCannotOpen,     // another open/fstat error (errno in RingDirCheck::error)
};
struct RingDirCheck {
  RingDirVerdict verdict = RingDirVerdict::kCannotOpen;
  int fd = -1;      // kSafe: the directory, open (O_DIRECTORY | O_CLOEXEC); the caller closes it
  uid_t owner = 0;  // when it could be opened
  mode_t mode = 0;  // when it could be opened (st_mode)
  int error = 0;    // errno of the failed open or fstat
};
// Opens `dir` without following a final symlink and judges what was opened. The descriptor is
// closed unless the verdict is kSafe.
RingDirCheck CheckRingDir(const char* dir);
// Why a directory was refused, in words for a log line ("is owned by uid 1000, not root or uid
// 0"); "" for kSafe. Writes into `buffer`.
const char* DescribeRingDirCheck(const RingDirCheck& check, char* buffer, unsigned size);

}  // namespace vramscope::interposer
