// lib/file's WriteFileAtomically: replacement keeping the mode, new files' mode, no leftovers
// (unit).
#include "vramscope/atomic_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace vramscope {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(AtomicFileTest, ReplacesKeepingTheMode) {
  char dir[] = "/tmp/vramscope-check-test.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/baseline.json";
  ASSERT_TRUE(WriteFileAtomically(path, "one").ok());
  ASSERT_EQ(chmod(path.c_str(), 0640), 0);
  ASSERT_TRUE(WriteFileAtomically(path, "two").ok());
  EXPECT_EQ(Read(path), "two");
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  const absl::Status s = WriteFileAtomically(std::string(dir) + "/missing/x", "three");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  unlink(path.c_str());
  EXPECT_EQ(rmdir(dir), 0);  // no temporary file left behind
}

TEST(AtomicFileTest, NewFileTakesTheGivenModeWithoutSync) {
  char dir[] = "/tmp/vramscope-atomic-test.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/spool.batch";
  const mode_t old_mask = umask(0);  // the given mode is not reduced by the umask either
  const absl::Status s =
      WriteFileAtomically(path, "batch", AtomicWriteOptions{.new_file_mode = 0600, .sync = false});
  umask(old_mask);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(Read(path), "batch");
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // A directory in the way: refused, nothing written beside it.
  const absl::Status refused = WriteFileAtomically(dir, "x");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  unlink(path.c_str());
  EXPECT_EQ(rmdir(dir), 0);
}

}  // namespace
}  // namespace vramscope
