// interposer/ring/ring_dir: where rings live. ChooseRingDir's reading of VRAMSCOPE_RING_DIR (and
// the test-only default override), and CheckRingDir's verdicts: modes, symlinks, files, owners.
#include "vramscope/ring/ring_dir.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "ring_test_util.h"

namespace vramscope::interposer {
namespace {

using testing::TempDir;

TEST(RingDirTest, ChooseRingDirFollowsTheEnvironment) {
  unsetenv("VRAMSCOPE_TEST_DEFAULT_RING_DIR");
  unsetenv("VRAMSCOPE_RING_DIR");
  RingDirChoice choice = ChooseRingDir();
  EXPECT_EQ(choice.source, RingDirSource::kDefault);
  EXPECT_STREQ(choice.dir, "/dev/shm/vramscope");
  setenv("VRAMSCOPE_TEST_DEFAULT_RING_DIR", "/tmp/elsewhere", 1);
  EXPECT_STREQ(ChooseRingDir().dir, "/tmp/elsewhere");
  unsetenv("VRAMSCOPE_TEST_DEFAULT_RING_DIR");
  for (const char* off : {"off", ""}) {
    setenv("VRAMSCOPE_RING_DIR", off, 1);
    EXPECT_EQ(ChooseRingDir().source, RingDirSource::kOff) << off;
  }
  setenv("VRAMSCOPE_RING_DIR", "/tmp/rings", 1);
  choice = ChooseRingDir();
  EXPECT_EQ(choice.source, RingDirSource::kExplicit);
  EXPECT_STREQ(choice.dir, "/tmp/rings");
  unsetenv("VRAMSCOPE_RING_DIR");
}

TEST(RingDirTest, CheckRingDirAcceptsOnlyASafeDirectory) {
  TempDir base;
  const std::string dir = base.path() + "/rings";
  char why[128];
  RingDirCheck check = CheckRingDir(dir.c_str());
  EXPECT_EQ(check.verdict, RingDirVerdict::kMissing);
  EXPECT_EQ(check.fd, -1);
  EXPECT_STREQ(DescribeRingDirCheck(check, why, sizeof(why)), "does not exist");
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  for (const auto& [mode, verdict] :
       std::vector<std::pair<mode_t, RingDirVerdict>>{{0700, RingDirVerdict::kSafe},
                                                      {0755, RingDirVerdict::kSafe},
                                                      {01777, RingDirVerdict::kSafe},
                                                      {01770, RingDirVerdict::kSafe},
                                                      {0777, RingDirVerdict::kOpenNotSticky},
                                                      {0720, RingDirVerdict::kOpenNotSticky},
                                                      {0702, RingDirVerdict::kOpenNotSticky}}) {
    ASSERT_EQ(chmod(dir.c_str(), mode), 0);
    check = CheckRingDir(dir.c_str());
    EXPECT_EQ(check.verdict, verdict) << std::oct << mode;
    EXPECT_EQ(check.fd >= 0, verdict == RingDirVerdict::kSafe) << std::oct << mode;
    if (check.fd >= 0) close(check.fd);
  }
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
  EXPECT_STREQ(DescribeRingDirCheck(CheckRingDir(dir.c_str()), why, sizeof(why)),
               "is writable by other users (mode 0777) and not sticky");
  ASSERT_EQ(chmod(dir.c_str(), 0700), 0);
  const std::string link = base.path() + "/link";
  ASSERT_EQ(symlink(dir.c_str(), link.c_str()), 0);
  EXPECT_EQ(CheckRingDir(link.c_str()).verdict, RingDirVerdict::kNotADirectory);
  const std::string file = base.path() + "/file";
  ASSERT_EQ(close(open(file.c_str(), O_CREAT | O_WRONLY, 0600)), 0);
  EXPECT_EQ(CheckRingDir(file.c_str()).verdict, RingDirVerdict::kNotADirectory);
  if (geteuid() == 0) {
    ASSERT_EQ(chown(dir.c_str(), 65534, 65534), 0);
    check = CheckRingDir(dir.c_str());
    EXPECT_EQ(check.verdict, RingDirVerdict::kForeignOwner);
    EXPECT_STREQ(DescribeRingDirCheck(check, why, sizeof(why)),
                 "is owned by uid 65534, not root or uid 0");
  }
  EXPECT_EQ(rmdir(dir.c_str()), 0);  // TempDir removes files only
}

}  // namespace
}  // namespace vramscope::interposer
