// Replacing a file atomically: readers see the old content or the new, never a part. The one
// writer of whole files for the agent (spool files), the collector (run summaries, the port file)
// and the CLI (baselines, JUnit, reports).
// Thread safety: safe to call from any thread; two writers of one path leave one's content.
// Errors: absl::Status, kFailedPrecondition naming the path and the system error.
#pragma once

#include <absl/status/status.h>
#include <sys/types.h>

#include <string>
#include <string_view>

namespace vramscope {

struct AtomicWriteOptions {
  // Mode of a file that does not exist yet; 0: 0666 minus the umask. A file that exists keeps
  // its mode.
  mode_t new_file_mode = 0;
  // fsync the data before the rename: the file survives the machine losing power, not only the
  // writer dying. Off where a file is rewritten often and losing it is harmless (spool files).
  bool sync = true;
};

// Writes `content` to a temporary file next to `path` (same directory, so same file system;
// named PATH.XXXXXX.tmp, so a reader of the directory that skips ".tmp" names never sees it) and
// renames it over `path`. On error nothing is left behind and `path` is unchanged.
absl::Status WriteFileAtomically(const std::string& path, std::string_view content,
                                 const AtomicWriteOptions& options = {});

}  // namespace vramscope
