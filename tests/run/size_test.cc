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
  for (const char* bad : {"", "GiB", "-1", "+1", "1.2.3", "4 GiBs", "4XB", "1e9",
                          "99999999999999TB", " 4", "4 ", "0x10", "."}) {
    EXPECT_FALSE(ParseSize(bad).has_value()) << bad;
  }
}

// The one grammar (vramscope/size_parse.h) every program and the shim share.
TEST(SizeTest, SameBytesEveryWay) {
  EXPECT_EQ(ParseSize("512MiB"), 536870912u);
  EXPECT_EQ(ParseSize("512M"), 536870912u);
  EXPECT_EQ(ParseSize("512m"), 536870912u);
  EXPECT_EQ(ParseSize("0.5GiB"), 536870912u);
  EXPECT_EQ(ParseSize("1G"), 1073741824u);
  EXPECT_EQ(ParseSize("1GiB"), 1073741824u);
  EXPECT_EQ(ParseSize("1GB"), 1000000000u);
  EXPECT_EQ(ParseSize("1gb"), 1000000000u);
  EXPECT_EQ(ParseSize("1.9B"), 1u);  // fractions of a byte round down
  EXPECT_EQ(ParseSize("18446744073709551615"), 18446744073709551615u);
  EXPECT_EQ(ParseSize("16777215.999999999999T"), 18446744073709551614u);
  static_assert(vramscope::ParseSize("4K") == 4096u, "usable at compile time");
}

TEST(SizeTest, SaysWhyNot) {
  EXPECT_EQ(vramscope::ParseSizeText("").error, vramscope::SizeError::kEmpty);
  EXPECT_EQ(vramscope::ParseSizeText("abc").error, vramscope::SizeError::kNotANumber);
  EXPECT_EQ(vramscope::ParseSizeText("1 ").error, vramscope::SizeError::kNotANumber);
  EXPECT_EQ(vramscope::ParseSizeText("0x10").error, vramscope::SizeError::kNotANumber);
  EXPECT_EQ(vramscope::ParseSizeText("4PiB").error, vramscope::SizeError::kUnknownUnit);
  EXPECT_EQ(vramscope::ParseSizeText("18446744073709551616").error,
            vramscope::SizeError::kTooLarge);
  EXPECT_EQ(vramscope::ParseSizeText("16777216T").error, vramscope::SizeError::kTooLarge);
  EXPECT_EQ(vramscope::ParseSizeText("99999999999999999999999GB").error,
            vramscope::SizeError::kTooLarge);
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
