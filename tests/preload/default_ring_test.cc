// The default ring directory (interposer/ring/ring_dir.h): a plain LD_PRELOAD run, with
// VRAMSCOPE_RING_DIR unset, writes its ring into the default directory only when that exists and
// is safe, and says once where its ring is or why it writes none; vramscope-agent with no
// --ring-dir creates the directory with the right mode, and a plain run then reaches it.
//
// The default directory's path is replaced by VRAMSCOPE_TEST_DEFAULT_RING_DIR (a temporary
// directory), so nothing here touches /dev/shm/vramscope. ring_app runs over the fake driver.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/collector/test_util.h"
#include "tests/pipeline/subprocess.h"

namespace vramscope {
namespace {

using ::vramscope::testing::Env;
using ::vramscope::testing::ReadFile;
using ::vramscope::testing::Subprocess;
using ::vramscope::testing::TempDir;

std::size_t Count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

class DefaultRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(Env("VRAMSCOPE_SHIM").empty()) << "meson sets VRAMSCOPE_SHIM";
    ASSERT_FALSE(Env("VRAMSCOPE_RING_APP").empty());
    default_dir_ = tmp_.path() + "/vramscope";
  }

  // `ring_app MODE` with the shim preloaded, VRAMSCOPE_RING_DIR unset unless `ring_dir_env` sets
  // it, the default directory at default_dir_, the shim's info lines on; returns the exit status.
  int RunApp(const std::string& mode = "basic", const std::string& ring_dir_env = "") {
    const std::string err = tmp_.path() + "/stderr.txt";
    const std::string command = "env -u VRAMSCOPE_RING_DIR " + ring_dir_env +
                                " VRAMSCOPE_TEST_DEFAULT_RING_DIR=" + default_dir_ +
                                " VRAMSCOPE_LOG=info LD_PRELOAD=${LD_PRELOAD:+$LD_PRELOAD:}" +
                                Env("VRAMSCOPE_SHIM") + " " + Env("VRAMSCOPE_RING_APP") + " " +
                                mode + " " + tmp_.path() + "/out.txt 2>" + err;
    const int status = system(command.c_str());
    stderr_ = ReadFile(err);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  }

  // The ring files in `dir` (finished names only).
  static std::vector<std::string> Rings(const std::string& dir) {
    std::vector<std::string> rings;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("vramscope.", 0) == 0 && name.size() > 5 &&
          name.compare(name.size() - 5, 5, ".ring") == 0) {
        rings.push_back(entry.path().string());
      }
    }
    return rings;
  }

  void MakeDefaultDir(mode_t mode) {
    ASSERT_EQ(mkdir(default_dir_.c_str(), 0700), 0);
    ASSERT_EQ(chmod(default_dir_.c_str(), mode), 0);  // exactly, whatever the umask
  }

  std::string Missing() const {
    return "no agent ring directory " + default_dir_ +
           "; set VRAMSCOPE_RING_DIR or start vramscope-agent";
  }

  TempDir tmp_;
  std::string default_dir_;
  std::string stderr_;
};

TEST_F(DefaultRingTest, SafeDefaultDirectoryGetsTheRingAndTheLogSaysWhere) {
  MakeDefaultDir(0700);
  EXPECT_EQ(RunApp(), 3) << stderr_;
  const std::vector<std::string> rings = Rings(default_dir_);
  ASSERT_EQ(rings.size(), 1u) << stderr_;
  EXPECT_EQ(Count(stderr_, "recording events to " + rings[0]), 1u) << stderr_;
  EXPECT_EQ(Count(stderr_, "no agent ring directory"), 0u) << stderr_;
}

TEST_F(DefaultRingTest, StickyDirectoryWritableByEveryoneIsUsed) {
  MakeDefaultDir(01777);
  EXPECT_EQ(RunApp(), 3) << stderr_;
  EXPECT_EQ(Rings(default_dir_).size(), 1u) << stderr_;
}

TEST_F(DefaultRingTest, MissingDirectoryMeansNoRingAndOneLineSayingWhy) {
  // fork: parent and child both start recording, each tries the default directory.
  EXPECT_EQ(RunApp("fork"), 0) << stderr_;
  EXPECT_FALSE(std::filesystem::exists(default_dir_)) << "the shim must not create it";
  EXPECT_EQ(Count(stderr_, Missing()), 1u) << stderr_;
  EXPECT_EQ(Count(stderr_, "recording events to"), 0u) << stderr_;
  // The program ran as without a ring.
  EXPECT_FALSE(ReadFile(tmp_.path() + "/out.txt").empty());
}

TEST_F(DefaultRingTest, WritableByOthersWithoutStickyBitIsRefused) {
  for (const mode_t mode : {mode_t{0777}, mode_t{0770}}) {
    MakeDefaultDir(mode);
    EXPECT_EQ(RunApp(), 3) << stderr_;
    EXPECT_TRUE(Rings(default_dir_).empty()) << stderr_;
    char expected[64];
    snprintf(expected, sizeof(expected), "is writable by other users (mode %04o) and not sticky",
             static_cast<unsigned>(mode));
    EXPECT_EQ(Count(stderr_, "not writing an event ring to " + default_dir_ + ": it " + expected),
              1u)
        << stderr_;
    ASSERT_EQ(rmdir(default_dir_.c_str()), 0);
  }
}

TEST_F(DefaultRingTest, DirectoryOfAnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to another user";
  MakeDefaultDir(0700);
  ASSERT_EQ(chown(default_dir_.c_str(), 65534, 65534), 0);
  EXPECT_EQ(RunApp(), 3) << stderr_;
  EXPECT_TRUE(Rings(default_dir_).empty()) << stderr_;
  EXPECT_EQ(Count(stderr_, "it is owned by uid 65534, not root or uid 0"), 1u) << stderr_;
}

TEST_F(DefaultRingTest, SymlinkIsRefused) {
  const std::string target = tmp_.path() + "/elsewhere";
  ASSERT_EQ(mkdir(target.c_str(), 0700), 0);
  ASSERT_EQ(symlink(target.c_str(), default_dir_.c_str()), 0);
  EXPECT_EQ(RunApp(), 3) << stderr_;
  EXPECT_TRUE(Rings(target).empty()) << stderr_;
  EXPECT_EQ(Count(stderr_, "it is a symlink or not a directory"), 1u) << stderr_;
}

TEST_F(DefaultRingTest, OffOrEmptyMeansNoRingEvenWithTheDirectoryThere) {
  MakeDefaultDir(0700);
  EXPECT_EQ(RunApp("basic", "VRAMSCOPE_RING_DIR=off"), 3) << stderr_;
  EXPECT_EQ(Count(stderr_, "VRAMSCOPE_RING_DIR=off: no event ring"), 1u) << stderr_;
  EXPECT_EQ(RunApp("basic", "VRAMSCOPE_RING_DIR="), 3) << stderr_;
  EXPECT_EQ(Count(stderr_, "VRAMSCOPE_RING_DIR=: no event ring"), 1u) << stderr_;
  EXPECT_TRUE(Rings(default_dir_).empty());
}

TEST_F(DefaultRingTest, ExplicitDirectoryIsUsedAsGiven) {
  // VRAMSCOPE_RING_DIR names a directory (as `vramscope run` does): used, whatever its mode.
  const std::string explicit_dir = tmp_.path() + "/explicit";
  ASSERT_EQ(mkdir(explicit_dir.c_str(), 0700), 0);
  MakeDefaultDir(0700);
  EXPECT_EQ(RunApp("basic", "VRAMSCOPE_RING_DIR=" + explicit_dir), 3) << stderr_;
  EXPECT_EQ(Rings(explicit_dir).size(), 1u) << stderr_;
  EXPECT_TRUE(Rings(default_dir_).empty());
}

// vramscope-agent with no --ring-dir and VRAMSCOPE_RING_DIR unset.
class DefaultAgentTest : public DefaultRingTest {
 protected:
  void SetUp() override {
    DefaultRingTest::SetUp();
    agent_ = testing::BinaryFromEnv("VRAMSCOPE_AGENT");
    collector_ = testing::BinaryFromEnv("VRAMSCOPE_COLLECTOR");
    ASSERT_FALSE(agent_.empty() || collector_.empty()) << "meson sets VRAMSCOPE_AGENT/COLLECTOR";
    // The agent inherits this environment.
    unsetenv("VRAMSCOPE_RING_DIR");
    setenv("VRAMSCOPE_TEST_DEFAULT_RING_DIR", default_dir_.c_str(), 1);
  }
  void TearDown() override { unsetenv("VRAMSCOPE_TEST_DEFAULT_RING_DIR"); }

  // `vramscope-agent --once` against `collector`; returns the exit status, its stderr in *output.
  int AgentOnce(const std::string& collector, std::string* output) {
    Subprocess agent;
    EXPECT_TRUE(agent.Start({agent_, "--once", "--collector=" + collector, "--once-timeout=20"}));
    const int status = agent.Wait();
    *output = agent.output();
    return status;
  }

  std::string agent_;
  std::string collector_;
};

TEST_F(DefaultAgentTest, AgentCreatesTheDirectoryAndAPlainPreloadRunReachesIt) {
  Subprocess collector;
  ASSERT_TRUE(collector.Start(
      {collector_, "--listen=127.0.0.1:0", "--data-dir=" + tmp_.path() + "/collector"}));
  const int port = collector.WaitForPort();
  ASSERT_NE(port, 0) << collector.output();
  const std::string address = "127.0.0.1:" + std::to_string(port);

  std::string output;
  ASSERT_EQ(AgentOnce(address, &output), 0) << output;
  struct stat st {};
  ASSERT_EQ(lstat(default_dir_.c_str(), &st), 0) << output;
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_uid, geteuid());
  // Root's agent serves every user (sticky, so none can touch another's ring); a user's agent
  // only that user.
  EXPECT_EQ(st.st_mode & 07777, geteuid() == 0 ? 01777u : 0700u);
  EXPECT_NE(output.find("rings in " + default_dir_), std::string::npos) << output;

  EXPECT_EQ(RunApp(), 3) << stderr_;
  ASSERT_EQ(Rings(default_dir_).size(), 1u) << stderr_;
  ASSERT_EQ(AgentOnce(address, &output), 0) << output;
  // Everything delivered (exit 0), and there was something: the ring's events.
  const std::size_t drained = output.find("drained ");
  ASSERT_NE(drained, std::string::npos) << output;
  EXPECT_GT(std::stoull(output.substr(drained + 8)), 0u) << output;
  // Drained, and its writer gone: the agent removed the ring.
  EXPECT_TRUE(Rings(default_dir_).empty());
  collector.Kill(SIGTERM);
  collector.Wait();
}

TEST_F(DefaultAgentTest, AgentRefusesAnUnsafeDefaultDirectory) {
  MakeDefaultDir(0777);
  std::string output;
  EXPECT_EQ(AgentOnce("127.0.0.1:1", &output), 2) << output;
  EXPECT_NE(output.find("the ring directory " + default_dir_ +
                        " is writable by other users (mode 0777) and not sticky"),
            std::string::npos)
      << output;
}

}  // namespace
}  // namespace vramscope
