// What the in-process `vramscope run` tests share: the fake application's path (meson sets
// VRAMSCOPE_FAKE_APP) and a temporary directory whose files are removed after each test.
// Not thread-safe: one test thread.
#ifndef VRAMSCOPE_TESTS_RUN_RUN_FIXTURE_H_
#define VRAMSCOPE_TESTS_RUN_RUN_FIXTURE_H_

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace vramscope::cli::testing {

inline std::string FakeApp() {
  const char* path = getenv("VRAMSCOPE_FAKE_APP");
  return path != nullptr ? path : "";
}

class RunFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(FakeApp().empty()) << "VRAMSCOPE_FAKE_APP is not set (meson sets it)";
    ASSERT_NE(getenv("VRAMSCOPE_SHIM"), nullptr);
    char pattern[] = "/tmp/vramscope-run-test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    for (const std::string& f : files_) unlink(f.c_str());
    rmdir(dir_.c_str());
  }
  // A path in the test's directory, removed after the test.
  std::string File(const std::string& name) {
    files_.push_back(dir_ + "/" + name);
    return files_.back();
  }

  std::string dir_;
  std::vector<std::string> files_;
};

}  // namespace vramscope::cli::testing

#endif  // VRAMSCOPE_TESTS_RUN_RUN_FIXTURE_H_
