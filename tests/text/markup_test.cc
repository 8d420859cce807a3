// lib/text's MarkupEscape, the one escaper of the HTML report and the JUnit file (unit).
#include "vramscope/markup.h"

#include <gtest/gtest.h>

namespace vramscope {
namespace {

TEST(MarkupEscapeTest, EscapesTheFiveSpecialCharacters) {
  EXPECT_EQ(MarkupEscape("a<b>&\"c'd"), "a&lt;b&gt;&amp;&quot;c&#39;d");
  EXPECT_EQ(MarkupEscape("plain text 123"), "plain text 123");
  EXPECT_EQ(MarkupEscape(""), "");
}

TEST(MarkupEscapeTest, KeepsWhitespaceAsReferencesAndReplacesOtherControls) {
  EXPECT_EQ(MarkupEscape("a\tb\nc\rd"), "a&#9;b&#10;c&#13;d");
  EXPECT_EQ(MarkupEscape(std::string_view("x\x01y\x7fz\0", 6)), "x?y?z?");
}

TEST(MarkupEscapeTest, PassesUtf8Unchanged) {
  EXPECT_EQ(MarkupEscape("caf\xc3\xa9 \xe2\x86\x92"), "caf\xc3\xa9 \xe2\x86\x92");
}

}  // namespace
}  // namespace vramscope
