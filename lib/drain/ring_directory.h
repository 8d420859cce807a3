// RingDirectory: finds the ring files in a directory, including ones created later.
//
// Scan() lists "vramscope.*.ring" files (never the ".tmp" names a writer is still initialising)
// not returned before. Thread safety: one thread at a time. Error convention: absl::Status
// (NotFound / PermissionDenied when the directory cannot be read).
#pragma once

#include <absl/container/flat_hash_set.h>
#include <absl/status/statusor.h>

#include <string>
#include <vector>

namespace vramscope::agent {

class RingDirectory {
 public:
  explicit RingDirectory(std::string dir) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }
  // Paths (dir/name) of ring files not returned by an earlier Scan, sorted by name.
  absl::StatusOr<std::vector<std::string>> Scan();
  // Lets a path be returned again (after its reader failed to open it, e.g. not ready).
  void Forget(const std::string& path) { seen_.erase(path); }

 private:
  std::string dir_;
  absl::flat_hash_set<std::string> seen_;
};

// True for a ring file name (no directory): "vramscope.<...>.ring".
bool IsRingFileName(std::string_view name);

}  // namespace vramscope::agent
