// Where event rings live: see ring_dir.h.
#include "vramscope/ring/ring_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vramscope/ring.h"

namespace vramscope::interposer {

const char* DefaultRingDir() {
  const char* test_dir = getenv("VRAMSCOPE_TEST_DEFAULT_RING_DIR");
  return test_dir != nullptr && test_dir[0] != '\0' ? test_dir : VRAMSCOPE_RING_DEFAULT_DIR;
}

RingDirChoice ChooseRingDir() {
  RingDirChoice choice;
  const char* dir = getenv("VRAMSCOPE_RING_DIR");
  if (dir == nullptr) {
    choice.source = RingDirSource::kDefault;
    choice.dir = DefaultRingDir();
  } else {
    choice.source =
        dir[0] != '\0' && strcmp(dir, "off") != 0 ? RingDirSource::kExplicit : RingDirSource::kOff;
    choice.dir = dir;
  }
  return choice;
}

RingDirCheck CheckRingDir(const char* dir) {
  RingDirCheck check;
  // O_NOFOLLOW and then fstat of the descriptor: the directory judged is the one opened, so it
  // cannot be swapped for a symlink between the check and the use (the caller creates its file
  // relative to `fd`).
  const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    check.error = errno;
    check.verdict = check.error == ENOENT ? RingDirVerdict::kMissing
                    : check.error == ELOOP || check.error == ENOTDIR
                        ? RingDirVerdict::kNotADirectory
                        : RingDirVerdict::kCannotOpen;
    return check;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    check.error = errno;
    close(fd);
    return check;
  }
  check.owner = st.st_uid;
  check.mode = st.st_mode;
  if (!S_ISDIR(st.st_mode)) {
    check.verdict = RingDirVerdict::kNotADirectory;
  } else if (st.st_uid != 0 && st.st_uid != geteuid()) {
    check.verdict = RingDirVerdict::kForeignOwner;
  } else if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    check.verdict = RingDirVerdict::kOpenNotSticky;
  } else {
    check.verdict = RingDirVerdict::kSafe;
    check.fd = fd;
    return check;
  }
  close(fd);
  return check;
}

const char* DescribeRingDirCheck(const RingDirCheck& check, char* buffer, unsigned size) {
  if (size == 0) return "";
  buffer[0] = '\0';
  switch (check.verdict) {
    case RingDirVerdict::kSafe:
      break;
    case RingDirVerdict::kMissing:
      snprintf(buffer, size, "does not exist");
      break;
    case RingDirVerdict::kNotADirectory:
      snprintf(buffer, size, "is a symlink or not a directory");
      break;
    case RingDirVerdict::kForeignOwner:
      snprintf(buffer, size, "is owned by uid %u, not root or uid %u",
               static_cast<unsigned>(check.owner), static_cast<unsigned>(geteuid()));
      break;
    case RingDirVerdict::kOpenNotSticky:
      snprintf(buffer, size, "is writable by other users (mode %04o) and not sticky",
               static_cast<unsigned>(check.mode & 07777));
      break;
    case RingDirVerdict::kCannotOpen:
      snprintf(buffer, size, "cannot be opened (%s)", strerror(check.error));
      break;
  }
  return buffer;
}

}  // namespace vramscope::interposer
