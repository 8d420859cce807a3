// Helpers for the ring tests: a private temporary directory and a drain-everything loop.
#pragma once

#include <dirent.h>
#include <google/protobuf/repeated_ptr_field.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "drain/ring_directory.h"
#include "drain/ring_reader.h"

namespace vramscope::testing {

// mkdtemp under $TMPDIR (or /tmp); removes its files and itself on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr && base[0] != '\0' ? base : "/tmp") +
                          "/vramscope-ring-test.XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) != nullptr) path_ = buf.data();
  }
  ~TempDir() {
    if (path_.empty()) return;
    if (DIR* d = opendir(path_.c_str())) {
      while (const dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (name != "." && name != "..") unlink((path_ + "/" + name).c_str());
      }
      closedir(d);
    }
    rmdir(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The only ring file in `dir`.
inline std::string OnlyRing(const std::string& dir) {
  agent::RingDirectory rings(dir);
  auto found = rings.Scan();
  EXPECT_TRUE(found.ok()) << found.status();
  if (!found.ok() || found->size() != 1) {
    ADD_FAILURE() << "expected one ring in " << dir;
    return "";
  }
  return (*found)[0];
}

// Drains until the reader reports nothing new (the writer must be done writing).
inline void DrainAll(agent::RingReader& reader,
                     google::protobuf::RepeatedPtrField<v1::Event>* events) {
  for (;;) {
    auto stats = reader.Drain(events);
    ASSERT_TRUE(stats.ok()) << stats.status();
    if (stats->finished || stats->records == 0) return;
  }
}

}  // namespace vramscope::testing
