// lib/json's pre-scan: the depth limit counts `[` and `{` outside strings only (escapes followed),
// is exact at the limit, names the input, the limit and the byte; the size limit; 100 KB of
// nesting is refused in one pass.
#include "vramscope/json/json_bounds.h"

#include <gtest/gtest.h>

#include <string>

namespace vramscope::json {
namespace {

std::string Nested(const std::string& open, const std::string& close, int levels) {
  std::string out;
  for (int i = 0; i < levels; ++i) out += open;
  out += "1";
  for (int i = 0; i < levels; ++i) out += close;
  return out;
}

TEST(JsonBoundsTest, ExactlyAtTheDepthLimitPassesOneMoreIsRefused) {
  EXPECT_TRUE(CheckJsonBounds(Nested("[", "]", 64), "x.json").ok());
  const absl::Status deep = CheckJsonBounds(Nested("[", "]", 65), "x.json");
  EXPECT_EQ(deep.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(deep.message(), "x.json: JSON nested deeper than 64 levels at byte 64");
  JsonLimits limits;
  limits.max_depth = 3;
  EXPECT_TRUE(CheckJsonBounds(R"({"a": [{"b": 1}], "c": {"d": [2]}})", "f", limits).ok());
  EXPECT_EQ(CheckJsonBounds(R"({"a": [{"b": [1]}]})", "f", limits).message(),
            "f: JSON nested deeper than 3 levels at byte 13");
}

TEST(JsonBoundsTest, BracketsInsideStringsAreNotCounted) {
  JsonLimits limits;
  limits.max_depth = 2;
  EXPECT_TRUE(CheckJsonBounds(R"({"[[[[": ["{{{{", "]]]]"]})", "f", limits).ok());
  // An escaped quote does not end the string; an escaped backslash does not escape the quote.
  EXPECT_TRUE(CheckJsonBounds(R"({"a\"[[[[": ["x\\", "{{"]})", "f", limits).ok());
  EXPECT_FALSE(CheckJsonBounds(R"({"a\\": [["x"]]})", "f", limits).ok());
  // A name of 100 KB of brackets is one string.
  EXPECT_TRUE(CheckJsonBounds("{\"name\": \"" + std::string(100000, '[') + "\"}", "f").ok());
}

TEST(JsonBoundsTest, ClosersBeyondTheOpenersDoNotHideLaterNesting) {
  JsonLimits limits;
  limits.max_depth = 2;
  // Not JSON, for the parser to reject; the depth must not wrap below zero.
  EXPECT_FALSE(CheckJsonBounds("]]]]]][[[", "f", limits).ok());
}

TEST(JsonBoundsTest, HundredKilobytesOfNestingIsRefusedAtTheLimit) {
  for (const std::string& unit : {std::string("["), std::string("{\"a\":")}) {
    std::string deep;
    while (deep.size() < 100000) deep += unit;
    const absl::Status s = CheckJsonBounds(deep, "deep.json");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    // The 65th opener: the first byte of the 65th unit.
    EXPECT_EQ(s.message(), "deep.json: JSON nested deeper than 64 levels at byte " +
                               std::to_string(64 * unit.size()))
        << unit;
  }
}

TEST(JsonBoundsTest, SizeLimit) {
  JsonLimits limits;
  limits.max_bytes = 10;
  EXPECT_TRUE(CheckJsonBounds("[1,2,3,45]", "f", limits).ok());
  EXPECT_EQ(CheckJsonBounds("[1,2,3,456]", "f", limits).message(),
            "f: JSON is 11 bytes, more than the limit of 10 bytes");
  EXPECT_EQ(CheckJsonSize(std::size_t{300} << 20, "big.json").message(),
            "big.json: JSON is 314572800 bytes, more than the limit of 268435456 bytes (256 MiB)");
  EXPECT_TRUE(CheckJsonSize(std::size_t{256} << 20, "f").ok());
}

}  // namespace
}  // namespace vramscope::json
