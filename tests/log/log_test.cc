// lib/log: the line format, the program name and the level filter (unit). stderr is caught
// through a pipe.
#include "vramscope/log.h"

#include <errno.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <regex>
#include <string>

namespace vramscope {
namespace {

// What `log` writes to stderr (one write(2) per line; a pipe holds far more than these).
template <typename F>
std::string CaptureStderr(F log) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const int saved = dup(2);
  dup2(fds[1], 2);
  log();
  dup2(saved, 2);
  close(saved);
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  return out;
}

TEST(LogTest, LineStartsWithTheProgramNameThenLevelAndUtcTime) {
  const std::string out = CaptureStderr([] { Log(LogLevel::kWarning, "spool full"); });
  EXPECT_TRUE(
      std::regex_match(out, std::regex(std::string(program_invocation_short_name) +
                                       " W [0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3} spool full\n")))
      << out;
}

TEST(LogTest, SetLogProgramNamesAnother) {
  SetLogProgram("vramscope-test");
  const std::string out = CaptureStderr([] { Log(LogLevel::kError, "x"); });
  SetLogProgram(program_invocation_short_name);
  EXPECT_EQ(out.rfind("vramscope-test E ", 0), 0u) << out;
}

TEST(LogTest, MessagesBelowTheMinimumLevelAreDropped) {
  SetMinLogLevel(LogLevel::kError);
  const std::string out = CaptureStderr([] {
    Log(LogLevel::kInfo, "a");
    Log(LogLevel::kWarning, "b");
    Log(LogLevel::kError, "c");
  });
  SetMinLogLevel(LogLevel::kInfo);
  EXPECT_EQ(out.find(" c\n") + 3, out.size()) << out;
  EXPECT_EQ(out.find('\n'), out.size() - 1) << "one line only: " << out;
}

}  // namespace
}  // namespace vramscope
