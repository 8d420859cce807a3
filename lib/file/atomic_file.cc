// Atomic file replacement: see vramscope/atomic_file.h.
#include "vramscope/atomic_file.h"

#include <absl/strings/str_cat.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

namespace vramscope {

absl::Status WriteFileAtomically(const std::string& path, std::string_view content,
                                 const AtomicWriteOptions& options) {
  auto fail = [&](const char* what, int error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot ", what, " ", path, ": ", strerror(error)));
  };
  mode_t mode;
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) return fail("replace", EISDIR);
    mode = st.st_mode & 07777;
  } else if (options.new_file_mode != 0) {
    mode = options.new_file_mode;
  } else {
    const mode_t mask = umask(0);
    umask(mask);
    mode = 0666 & ~mask;
  }
  // The ".tmp" suffix: directory readers (the agent's spool replay) skip and remove such names.
  constexpr int kSuffixLength = 4;
  std::string temp = path + ".XXXXXX.tmp";
  const int fd = mkostemps(temp.data(), kSuffixLength, O_CLOEXEC);
  if (fd < 0) return fail("create a temporary file next to", errno);
  // Until the rename, errors must remove the temporary file.
  auto abandon = [&](const char* what) {
    const int error = errno;
    close(fd);
    unlink(temp.c_str());
    return fail(what, error);
  };
  std::size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = write(fd, content.data() + written, content.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      return abandon("write");
    }
    written += static_cast<std::size_t>(n);
  }
  if (fchmod(fd, mode) != 0) return abandon("set the mode of");
  // Data on disk before the name points at it: a crash leaves the old file or the new one.
  if (options.sync && fsync(fd) != 0) return abandon("flush");
  if (close(fd) != 0) {
    const int error = errno;
    unlink(temp.c_str());
    return fail("write", error);
  }
  if (rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    unlink(temp.c_str());
    return fail("rename a temporary file over", error);
  }
  return absl::OkStatus();
}

}  // namespace vramscope
