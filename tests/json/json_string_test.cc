// json::Quote, the one escaper of JSON string literals: every byte sequence gives a literal that is
// valid UTF-8 and valid JSON, in a document and inside an HTML <script> element.
#include "vramscope/json/json_string.h"

#include <gtest/gtest.h>

#include <string>

namespace vramscope::json {
namespace {

TEST(JsonQuoteTest, DocumentEscapes) {
  EXPECT_EQ(Quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(Quote(std::string("\0\x1f\x7f", 3)), "\"\\u0000\\u001f\\u007f\"");
  EXPECT_EQ(Quote("\n\r\t"), "\"\\n\\r\\t\"");
  EXPECT_EQ(Quote("caf\xc3\xa9"), "\"caf\xc3\xa9\"");  // UTF-8 passes through
  EXPECT_EQ(Quote("</script>&"), "\"</script>&\"");
  // Not UTF-8: escaped as the drain does, the backslashes then escaped for JSON.
  EXPECT_EQ(Quote("a\xff\\"), "\"a\\\\xFF\\\\\\\\\"");
}

TEST(JsonQuoteTest, NothingCanCloseTheScriptElement) {
  const QuoteFor script = QuoteFor::kScriptElement;
  EXPECT_EQ(Quote("</script>", script), "\"\\u003c/script\\u003e\"");
  EXPECT_EQ(Quote("a\"b\\c&", script), "\"a\\\"b\\\\c\\u0026\"");
  EXPECT_EQ(Quote(std::string("\n\x01", 2), script), "\"\\u000a\\u0001\"");
  EXPECT_EQ(Quote("caf\xc3\xa9", script), "\"caf\xc3\xa9\"");
  EXPECT_EQ(Quote("\xc0<", script), "\"\\\\xC0\\u003c\"");
}

}  // namespace
}  // namespace vramscope::json
