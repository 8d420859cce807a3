// lib/pickle: what the writer writes the reader reads back (every integer width, floats, text,
// nesting, the memo); pickles Python itself wrote (protocol 2 and 4: framing, MEMOIZE,
// SHORT_BINUNICODE, shared references) read right; hostile input is an error, never a crash:
// every truncation, GLOBAL/REDUCE/BUILD, an unknown memo index, stack underflow, a length past
// the end, an integer wider than 64 bits, an unhashable key, a self-containing list.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "vramscope/pickle/pickle_reader.h"
#include "vramscope/pickle/pickle_writer.h"

namespace vramscope::pickle {
namespace {

using namespace std::string_literals;

TEST(PickleTest, WriterRoundTripsThroughTheReader) {
  const std::int64_t ints[] = {0,
                               1,
                               255,
                               256,
                               65535,
                               65536,
                               -1,
                               -256,
                               INT32_MIN,
                               INT32_MAX,
                               std::int64_t{INT32_MAX} + 1,
                               std::numeric_limits<std::int64_t>::min(),
                               std::numeric_limits<std::int64_t>::max()};
  PickleWriter w;
  w.BeginDict();
  w.String("ints");
  w.BeginList();
  for (std::int64_t v : ints) w.Int(v);
  w.EndList();
  w.String("text");
  w.BeginList();
  w.String("snapshot");
  w.String("snapshot");  // memoized: BINGET
  w.String("caf\xc3\xa9");
  w.String("bad \xff byte");
  w.EndList();
  w.String("misc");
  w.BeginTuple();
  w.Float(0.25);
  w.Bool(true);
  w.Bool(false);
  w.None();
  w.EndTuple();
  w.EndDict();
  const std::string bytes = w.Finish();
  absl::StatusOr<PickleDocument> doc = ReadPickle(bytes);
  ASSERT_TRUE(doc.ok()) << doc.status();
  const Value* list = doc->Find(doc->root(), "ints");
  ASSERT_NE(list, nullptr);
  ASSERT_EQ(list->items.size(), std::size(ints));
  for (std::size_t i = 0; i < std::size(ints); ++i) {
    EXPECT_EQ(doc->at(list->items[i]).kind, Kind::kInt);
    EXPECT_EQ(doc->at(list->items[i]).integer, ints[i]) << i;
  }
  const Value* text = doc->Find(doc->root(), "text");
  ASSERT_NE(text, nullptr);
  ASSERT_EQ(text->items.size(), 4u);
  EXPECT_EQ(doc->at(text->items[0]).text, "snapshot");
  EXPECT_EQ(text->items[0], text->items[1]);  // the memo shares one value
  EXPECT_EQ(doc->at(text->items[2]).text, "caf\xc3\xa9");
  EXPECT_EQ(doc->at(text->items[3]).text, "bad \\xFF byte");  // made valid UTF-8 (utf8.h)
  const Value* misc = doc->Find(doc->root(), "misc");
  ASSERT_NE(misc, nullptr);
  ASSERT_EQ(misc->kind, Kind::kTuple);
  EXPECT_EQ(doc->at(misc->items[0]).real, 0.25);
  EXPECT_EQ(doc->at(misc->items[1]).integer, 1);
  EXPECT_EQ(doc->at(misc->items[2]).kind, Kind::kBool);
  EXPECT_EQ(doc->at(misc->items[3]).kind, Kind::kNone);
}

TEST(PickleTest, AnIntegerAbove2To63IsRefusedNotWrapped) {
  PickleWriter w;
  w.UInt(std::numeric_limits<std::uint64_t>::max());
  absl::StatusOr<PickleDocument> doc = ReadPickle(w.Finish());
  ASSERT_FALSE(doc.ok());
  EXPECT_NE(doc.status().message().find("wider than 64 bits"), std::string::npos);
}

// pickle.dumps({'a': [1, 'x', 'x', (2, 3)], 'b': -70000, 'c': 1.5, 'd': None, 'e': True},
//              protocol=4) by CPython 3.11: FRAME, MEMOIZE, SHORT_BINUNICODE, a shared 'x'.
constexpr unsigned char kPython4Bytes[] = {
    0x80, 0x04, 0x95, 0x3b, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7d, 0x94, 0x28,
    0x8c, 0x01, 0x61, 0x94, 0x5d, 0x94, 0x28, 0x4b, 0x01, 0x8c, 0x01, 0x78, 0x94, 0x68,
    0x03, 0x4b, 0x02, 0x4b, 0x03, 0x86, 0x94, 0x65, 0x8c, 0x01, 0x62, 0x94, 0x4a, 0x90,
    0xee, 0xfe, 0xff, 0x8c, 0x01, 0x63, 0x94, 0x47, 0x3f, 0xf8, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x8c, 0x01, 0x64, 0x94, 0x4e, 0x8c, 0x01, 0x65, 0x94, 0x88, 0x75, 0x2e};
const std::string_view kPython4(reinterpret_cast<const char*>(kPython4Bytes), sizeof kPython4Bytes);

TEST(PickleTest, ReadsWhatPythonWrites) {
  absl::StatusOr<PickleDocument> doc = ReadPickle(kPython4);
  ASSERT_TRUE(doc.ok()) << doc.status();
  const Value* a = doc->Find(doc->root(), "a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items.size(), 4u);
  EXPECT_EQ(doc->at(a->items[0]).integer, 1);
  EXPECT_EQ(doc->at(a->items[1]).text, "x");
  EXPECT_EQ(a->items[1], a->items[2]);
  EXPECT_EQ(doc->at(a->items[3]).kind, Kind::kTuple);
  EXPECT_EQ(doc->Find(doc->root(), "b")->integer, -70000);
  EXPECT_EQ(doc->Find(doc->root(), "c")->real, 1.5);
  EXPECT_EQ(doc->Find(doc->root(), "d")->kind, Kind::kNone);
  EXPECT_EQ(doc->Find(doc->root(), "e")->integer, 1);
}

TEST(PickleTest, EveryTruncationIsAnErrorNotACrash) {
  const std::string_view full = kPython4;
  for (std::size_t n = 0; n < full.size(); ++n) {
    EXPECT_FALSE(ReadPickle(full.substr(0, n)).ok()) << n;
  }
}

std::string Refusal(std::string_view bytes) {
  absl::StatusOr<PickleDocument> doc = ReadPickle(bytes);
  return doc.ok() ? "accepted" : std::string(doc.status().message());
}

TEST(PickleTest, ObjectBuildingOpcodesAreRefusedByName) {
  // pickle.dumps(os.system) (protocol 2) and a REDUCE of a GLOBAL: the classic exploit shapes.
  EXPECT_NE(Refusal("\x80\x02"
                    "cposix\nsystem\nq\x00."s)
                .find("GLOBAL"),
            std::string::npos);
  EXPECT_NE(Refusal("\x80\x04\x8c\x02os\x8c\x06system\x93."s).find("STACK_GLOBAL"),
            std::string::npos);
  EXPECT_NE(Refusal("\x80\x02N)R."s).find("REDUCE"), std::string::npos);
  EXPECT_NE(Refusal("\x80\x02}}b."s).find("BUILD"), std::string::npos);
  EXPECT_NE(Refusal("\x80\x02\xff."s).find("0xff"), std::string::npos);
  EXPECT_NE(Refusal("\x80\x02"
                    "C\x01x."s)
                .find("bytes"),
            std::string::npos);
}

TEST(PickleTest, MalformedMachinesAreErrors) {
  EXPECT_NE(Refusal("\x80\x02h\x05."s).find("never stored"), std::string::npos);
  EXPECT_NE(Refusal("\x80\x02u."s).find("mark"), std::string::npos);
  EXPECT_NE(Refusal("\x80\x02"
                    "a."s)
                .find("underflow"),
            std::string::npos);
  EXPECT_NE(Refusal("\x80\x02X\xff\xff\xff\x7f"
                    "abc."s)
                .find("truncated"),
            std::string::npos);
  EXPECT_NE(Refusal("\x80\x02\x8a\x0a"
                    "\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01."s)
                .find("64"),
            std::string::npos);
  EXPECT_NE(Refusal("\x80\x02}(]Nu."s).find("unhashable"), std::string::npos);
  EXPECT_NE(Refusal("\x80\x02NN."s).find("exactly one"), std::string::npos);
  EXPECT_NE(Refusal("\x80\x09N."s).find("protocol"), std::string::npos);
  EXPECT_NE(Refusal("\x80\x02K\x01(e."s).find("not a list"), std::string::npos);
  // A list that contains itself is data, not a crash: readers walk a known schema.
  absl::StatusOr<PickleDocument> doc = ReadPickle(
      "\x80\x02]q\x00h\x00"
      "a."s);
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ(doc->root().items.size(), 1u);
}

}  // namespace
}  // namespace vramscope::pickle
