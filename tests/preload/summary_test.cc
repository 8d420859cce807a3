// VRAMSCOPE_SUMMARY=1 makes the shim print one line to stderr at exit. Runs summary_helper
// (path in VRAMSCOPE_SUMMARY_HELPER) under the environment meson gives this test.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <regex>
#include <string>

namespace {

// Runs the helper with VRAMSCOPE_SUMMARY=1 (and `log_level` as VRAMSCOPE_LOG, if given);
// returns its stderr and exit status.
std::string RunHelper(int* exit_status, const char* log_level = nullptr) {
  const char* helper = getenv("VRAMSCOPE_SUMMARY_HELPER");
  if (helper == nullptr) return "";
  int fds[2];
  if (pipe(fds) != 0) return "";
  const pid_t child = fork();
  if (child == 0) {
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    setenv("VRAMSCOPE_SUMMARY", "1", 1);
    if (log_level != nullptr) {
      setenv("VRAMSCOPE_LOG", log_level, 1);
      execl(helper, helper, "--lookups", static_cast<char*>(nullptr));
    }
    execl(helper, helper, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buffer[4096];
  ssize_t n = 0;
  while ((n = read(fds[0], buffer, sizeof(buffer))) > 0) out.append(buffer, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  *exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(SummaryTest, OneLineAtExit) {
  ASSERT_NE(getenv("VRAMSCOPE_SUMMARY_HELPER"), nullptr);
  int status = -1;
  const std::string out = RunHelper(&status);
  EXPECT_EQ(status, 0) << out;
  const char* mode_env = getenv("VRAMSCOPE_MODE");
  const std::string mode = mode_env != nullptr && mode_env[0] != '\0' ? mode_env : "pool";
  std::smatch match;
  const std::regex line("vramscope: mode=" + mode +
                        R"( policy=\S+ ordered=\S+( dev0 [^\n]*)? passthrough [^\n]*\n)");
  ASSERT_TRUE(std::regex_search(out, match, line)) << out;
  const std::string summary = match.str(0);
  // The helper queues no work on any stream: ordered reuse stays on in pool mode, and only there.
  EXPECT_NE(summary.find(mode == "pool" ? " ordered=on " : " ordered=off "), std::string::npos)
      << summary;
  if (mode != "passthrough") {
    // Three pooled allocations of 3, 1 and 2 MiB; peak live 4 MiB requested; two frees.
    EXPECT_NE(summary.find(" dev0 peak_requested=4194304 "), std::string::npos) << summary;
    EXPECT_NE(summary.find(" current_requested=2101248 "), std::string::npos) << summary;
    EXPECT_NE(summary.find(" allocs=4 frees=2 "), std::string::npos) << summary;
    EXPECT_NE(summary.find(" device=0/0/0 "), std::string::npos) << summary;
  } else {
    EXPECT_NE(summary.find(" device=2101248/4194304/4 "), std::string::npos) << summary;
    // cuMemAlloc 3+1 MiB live at once, the pitched block after the 3 MiB one was freed.
    EXPECT_NE(
        summary.find(" passthrough peak_device_memory=4194304 current_device_memory=2101248 "),
        std::string::npos)
        << summary;
  }
  EXPECT_NE(summary.find(" managed=1048576/1048576/1 "), std::string::npos) << summary;
  EXPECT_NE(summary.find(" host=0/4096/1 "), std::string::npos) << summary;
  EXPECT_NE(summary.find(" host_registered=0/0/0 "), std::string::npos) << summary;
  EXPECT_NE(summary.find(" pitch=0/"), std::string::npos) << summary;
  // A free after the shim's exit handler ran (static destructors) still succeeds, after the line.
  EXPECT_NE(out.find("summary_helper: late free rc=0"), std::string::npos) << out;
  EXPECT_GT(out.find("summary_helper: late free"), out.find("vramscope: mode=")) << out;
  // Exactly one line.
  EXPECT_EQ(out.find("vramscope: mode="), out.rfind("vramscope: mode=")) << out;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Driver entry points handed out unwrapped are logged once each at debug level, so new driver
// variants show up; nothing is logged at the default level.
TEST(SummaryTest, UnwrappedEntryPointsAreLoggedOnceAtDebugLevel) {
  int status = -1;
  const std::string debug = RunHelper(&status, "debug");
  EXPECT_EQ(status, 0) << debug;
  EXPECT_EQ(Count(debug,
                  "dlsym(\"cuDeviceGetName\") -> cuDeviceGetName: driver entry point not "
                  "wrapped"),
            1)
      << debug;
  EXPECT_EQ(Count(debug,
                  "cuGetProcAddress_v2(\"cuCtxGetDevice\") -> cuCtxGetDevice: driver entry "
                  "point not wrapped"),
            1)
      << debug;
  const std::string quiet = RunHelper(&status, "warn");
  EXPECT_EQ(Count(quiet, "not wrapped"), 0) << quiet;
}

}  // namespace
