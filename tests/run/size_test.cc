#include "common/size.h"

#include <gtest/gtest.h>

namespace vramscope::cli {
namespace {

TEST(SizeTest, ParsesUnits) {
  EXPECT_EQ(ParseSize("4096"), 4096u);
  EXPECT_EQ(ParseSize("4GiB"), 4ull << 30);
  EXPECT_EQ(ParseSize("4gib"), 4ull << 30);
  EXPECT_EQ(ParseSize("512MiB"), 512ull << 20);
  EXPECT_EQ(ParseSize("1.5GB"), 1500000000u);
  EXPECT_EQ(ParseSize("2G"), 2ull << 30);
  EXPECT_EQ(ParseSize("1 KiB"), 1024u);
  EXPECT_EQ(ParseSize("3kb"), 3000u);
  EXPECT_EQ(ParseSize("10B"), 10u);
  EXPECT_EQ(ParseSize("0.5KiB"), 512u);
  EXPECT_EQ(ParseSize("1TiB"), 1ull << 40);
}

TEST(SizeTest, RejectsNonsense) {
  for (const char* bad :
       {"", "GiB", "-1", "1.2.3", "4 GiBs", "4XB", "1e9", "99999999999999TB", " 4"}) {
    EXPECT_FALSE(ParseSize(bad).has_value()) << bad;
  }
}

TEST(SizeTest, Formats) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(10ull << 20), "10.0 MiB");
  EXPECT_EQ(FormatBytes(141ull << 30), "141 GiB");
}

}  // namespace
}  // namespace vramscope::cli
