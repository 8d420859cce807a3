// Replacing a file atomically: readers see the old content or the new, never a part.
#pragma once

#include <absl/status/status.h>

#include <string>
#include <string_view>

namespace vramscope::cli {

// Writes `content` to a temporary file next to `path` (same directory, so same file system),
// flushes it to disk and renames it over `path`. The new file keeps the mode of the file it
// replaces, else 0666 minus the umask. On error nothing is left behind and `path` is unchanged;
// the status (kFailedPrecondition) names the path and the system error.
absl::Status WriteFileAtomically(const std::string& path, std::string_view content);

}  // namespace vramscope::cli
