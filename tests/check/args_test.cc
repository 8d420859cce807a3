// viewer-cli/common/args.h: the option reader `vramscope check`, `report` and `top` share.
#include "common/args.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace vramscope::cli {
namespace {

struct Argv {
  explicit Argv(std::vector<std::string> args) : storage(std::move(args)) {
    for (std::string& a : storage) pointers.push_back(a.data());
  }
  int argc() const { return static_cast<int>(pointers.size()); }
  char** argv() { return pointers.data(); }
  std::vector<std::string> storage;
  std::vector<char*> pointers;
};

TEST(ArgReaderTest, ValuesInlineOrNextAndPositionals) {
  Argv a({"check", "--baseline", "b.json", "--report=r.json", "file", "--flag"});
  ArgReader args("check", a.argc(), a.argv());
  std::string value;
  ASSERT_TRUE(args.Next());
  EXPECT_TRUE(args.Is("--baseline"));
  EXPECT_FALSE(args.HasInlineValue());
  ASSERT_TRUE(args.Value(&value));
  EXPECT_EQ(value, "b.json");
  ASSERT_TRUE(args.Next());
  EXPECT_EQ(args.flag(), "--report");
  EXPECT_EQ(args.arg(), "--report=r.json");
  EXPECT_TRUE(args.HasInlineValue());
  ASSERT_TRUE(args.Value(&value));
  EXPECT_EQ(value, "r.json");
  ASSERT_TRUE(args.Next());
  EXPECT_EQ(args.arg(), "file");
  EXPECT_EQ(args.flag(), "file");
  ASSERT_TRUE(args.Next());
  EXPECT_TRUE(args.Is("--flag"));
  testing::internal::CaptureStderr();
  EXPECT_FALSE(args.Value(&value));  // nothing follows
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "vramscope check: --flag needs a value\n");
  EXPECT_FALSE(args.Next());
}

TEST(ArgReaderTest, EqualsOnlySplitsLongOptions) {
  Argv a({"top", "-x=1", "--filter=a=b", "--empty="});
  ArgReader args("top", a.argc(), a.argv());
  std::string value;
  ASSERT_TRUE(args.Next());
  EXPECT_EQ(args.flag(), "-x=1");  // a short option is never split
  EXPECT_FALSE(args.HasInlineValue());
  ASSERT_TRUE(args.Next());
  EXPECT_EQ(args.flag(), "--filter");
  ASSERT_TRUE(args.Value(&value));
  EXPECT_EQ(value, "a=b");  // split at the first '='
  ASSERT_TRUE(args.Next());
  ASSERT_TRUE(args.Value(&value));
  EXPECT_EQ(value, "");
  EXPECT_FALSE(args.Next());
}

}  // namespace
}  // namespace vramscope::cli
