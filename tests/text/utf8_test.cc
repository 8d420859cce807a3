// vramscope/utf8.h: what proto3 string fields accept, and the reversible escape every string from
// a traced application goes through before it leaves the node.
#include "vramscope/utf8.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "vramscope/v1/events.pb.h"

namespace vramscope {
namespace {

TEST(Utf8Test, ValidTextIsUnchanged) {
  for (const std::string& text :
       {std::string(""), std::string("python3 train.py --lr=1e-3"), std::string("C:\\path\\x41"),
        std::string("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"), std::string("nul\0in", 6)}) {
    EXPECT_TRUE(IsValidUtf8(text)) << text;
    EXPECT_EQ(ToValidUtf8(text), text);
  }
}

TEST(Utf8Test, InvalidBytesAreEscapedAndBackslashesDoubled) {
  EXPECT_EQ(ToValidUtf8("out\xE9.txt"), "out\\xE9.txt");
  EXPECT_EQ(ToValidUtf8("a\\b\xFF"), "a\\\\b\\xFF");
  // Well-formed characters next to bad bytes are kept.
  EXPECT_EQ(ToValidUtf8("\xC3\xA9\xC3"), "\xC3\xA9\\xC3");
}

TEST(Utf8Test, RejectsWhatProtobufRejects) {
  for (const std::string& bad : {
           std::string("\x80"),              // lone continuation byte
           std::string("\xC0\xAF"),          // overlong '/'
           std::string("\xE0\x80\xAF"),      // overlong, 3 bytes
           std::string("\xED\xA0\x80"),      // UTF-16 surrogate
           std::string("\xF4\x90\x80\x80"),  // above U+10FFFF
           std::string("\xF5\x80\x80\x80"),  // no such lead byte
           std::string("\xE2\x82"),          // cut short
       }) {
    EXPECT_FALSE(IsValidUtf8(bad));
    v1::ProcessKey key;
    key.set_host(bad);
    const std::string wire = key.SerializeAsString();
    v1::ProcessKey parsed;
    EXPECT_FALSE(parsed.ParseFromString(wire)) << "protobuf took what IsValidUtf8 refuses";
    key.set_host(ToValidUtf8(bad));
    EXPECT_TRUE(parsed.ParseFromString(key.SerializeAsString()));
    EXPECT_EQ(UnescapeUtf8(parsed.host()), bad);
  }
}

TEST(Utf8Test, EscapeIsAlwaysValidAndReversible) {
  std::mt19937 random(19);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> length(0, 40);
  int changed = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string text(static_cast<size_t>(length(random)), '\0');
    for (char& c : text) {
      // Mostly ASCII and backslashes, with some high bytes: every case of the escape.
      const int b = byte(random);
      c = static_cast<char>(b < 64 ? '\\' : b < 160 ? 'a' + b % 26 : b);
    }
    const std::string escaped = ToValidUtf8(text);
    ASSERT_TRUE(IsValidUtf8(escaped)) << escaped;
    if (IsValidUtf8(text)) {
      ASSERT_EQ(escaped, text);
    } else {
      ++changed;
      ASSERT_EQ(UnescapeUtf8(escaped), text) << escaped;
    }
  }
  EXPECT_GT(changed, 1000);
}

}  // namespace
}  // namespace vramscope
