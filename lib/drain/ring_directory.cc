#include "drain/ring_directory.h"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <dirent.h>
#include <errno.h>
#include <string.h>

#include <algorithm>

#include "vramscope/ring.h"

namespace vramscope::agent {

bool IsRingFileName(std::string_view std_name) {
  const absl::string_view name(std_name.data(), std_name.size());
  return name.size() > sizeof(VRAMSCOPE_RING_FILE_PREFIX) + sizeof(VRAMSCOPE_RING_FILE_SUFFIX) &&
         absl::StartsWith(name, VRAMSCOPE_RING_FILE_PREFIX) &&
         absl::EndsWith(name, VRAMSCOPE_RING_FILE_SUFFIX);
}

absl::StatusOr<std::vector<std::string>> RingDirectory::Scan() {
  DIR* d = opendir(dir_.c_str());
  if (d == nullptr) {
    const int err = errno;
    return absl::Status(err == ENOENT   ? absl::StatusCode::kNotFound
                        : err == EACCES ? absl::StatusCode::kPermissionDenied
                                        : absl::StatusCode::kUnavailable,
                        absl::StrCat("cannot read ring directory ", dir_, ": ", strerror(err)));
  }
  std::vector<std::string> found;
  while (const dirent* entry = readdir(d)) {
    if (!IsRingFileName(entry->d_name)) continue;
    std::string path = absl::StrCat(dir_, "/", entry->d_name);
    if (seen_.insert(path).second) found.push_back(std::move(path));
  }
  closedir(d);
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace vramscope::agent
