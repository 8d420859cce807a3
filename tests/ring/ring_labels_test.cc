// Run labels in the ring: the text form's rules (vramscope/ring/labels.h), LABELS records
// written by the writer and read back by the drain into a new ProcessStart, and hostile LABELS
// records (wrong chunk count, length, numbering, a malformed label) skipped as invalid records
// without any label reaching the events.
#include <google/protobuf/repeated_ptr_field.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>

#include "drain/ring_reader.h"
#include "ring_test_util.h"
#include "vramscope/ring/labels.h"
#include "vramscope/ring/ring_writer.h"

namespace vramscope::interposer {
namespace {

using testing::TempDir;
using Labels = std::map<std::string, std::string>;

void Add(void* context, std::string_view key, std::string_view value) {
  (*static_cast<Labels*>(context))[std::string(key)] = std::string(value);
}

// The labels of `text`, or {"!": why} when refused.
Labels Parse(std::string_view text) {
  Labels labels;
  char why[160] = {};
  if (!ParseLabels(text, &Add, &labels, why, sizeof(why))) return {{"!", why}};
  return labels;
}

TEST(RingLabelsTest, TextForm) {
  EXPECT_EQ(Parse(""), Labels{});
  EXPECT_EQ(Parse("job=train,commit=abc"), (Labels{{"job", "train"}, {"commit", "abc"}}));
  EXPECT_EQ(Parse("a=x\\,y\\\\z,b="), (Labels{{"a", "x,y\\z"}, {"b", ""}}));
  EXPECT_EQ(Parse("a=1,a=2"), (Labels{{"a", "2"}}));
  EXPECT_EQ(Parse("note=it's \"q\"\nline \xc3\xa9"),
            (Labels{{"note", "it's \"q\"\nline \xc3\xa9"}}));
  EXPECT_EQ(Parse("job"), (Labels{{"!", "label 1 (\"job\") has no '='"}}));
  EXPECT_EQ(Parse("a=1,,b=2"), (Labels{{"!", "label 2 (\"\") has no '='"}}));
  EXPECT_EQ(Parse("=x"), (Labels{{"!", "a label key is empty"}}));
  EXPECT_EQ(Parse("9a=x"), (Labels{{"!", "label key \"9a\" is not [A-Za-z_][A-Za-z0-9_]*"}}));
  EXPECT_EQ(Parse("a-b=x"), (Labels{{"!", "label key \"a-b\" is not [A-Za-z_][A-Za-z0-9_]*"}}));
  EXPECT_EQ(Parse("a=\xff"), (Labels{{"!", "label \"a\": value is not valid UTF-8"}}));
  EXPECT_EQ(Parse("a=x\\n"),
            (Labels{{"!", "label 1 (\"a\"): '\\' must be followed by ',' or '\\'"}}));
  std::string long_value = "a=";
  long_value.append(257, 'v');
  EXPECT_EQ(Parse(long_value), (Labels{{"!", "label 1 (\"a\"): value longer than 256 bytes"}}));
  std::string long_key(65, 'k');
  long_key += "=v";
  EXPECT_EQ(Parse(long_key).begin()->first, "!");
  std::string many;
  for (int i = 0; i < 33; ++i) {
    many += 'k';
    many += std::to_string(i);
    many += "=v,";
  }
  EXPECT_EQ(Parse(many), (Labels{{"!", "more than 32 labels"}}));
  EXPECT_EQ(Parse(std::string(1025, 'a')), (Labels{{"!", "labels longer than 1024 bytes"}}));
  // A bad label anywhere means none is visited.
  Labels visited;
  EXPECT_FALSE(ParseLabels("a=1,b", &Add, &visited, nullptr, 0));
  EXPECT_TRUE(visited.empty());
}

// Drains the ring of `writer`; returns the labels of the last ProcessStart and the invalid
// records the drain counted.
Labels DrainLabels(RingWriter& writer, std::uint64_t* invalid) {
  auto reader = agent::RingReader::OpenFile(writer.path(), {});
  EXPECT_TRUE(reader.ok()) << reader.status();
  google::protobuf::RepeatedPtrField<v1::Event> events;
  absl::StatusOr<agent::DrainStats> stats = (*reader)->Drain(&events);
  EXPECT_TRUE(stats.ok());
  *invalid = stats->invalid;
  Labels labels;
  for (const v1::Event& event : events) {
    if (!event.has_process_start()) continue;
    labels = Labels(event.process_start().labels().begin(), event.process_start().labels().end());
  }
  return labels;
}

TEST(RingLabelsTest, WrittenAndReadBackAcrossChunks) {
  TempDir dir;
  RingWriter writer;
  ASSERT_EQ(writer.Open({.dir = dir.path().c_str()}), RingError::kOk);
  std::string text = "job=train,note=";  // 3 chunks
  text.append(100, 'x');
  text += "\\,y";
  ASSERT_TRUE(writer.RecordLabels(text.data(), text.size()));
  ASSERT_TRUE(writer.RecordAlloc(0, 0x1000, 100, 512, VRAMSCOPE_RING_ALLOC_POOLED));
  EXPECT_FALSE(writer.RecordLabels(std::string(1025, 'a').data(), 1025));
  std::uint64_t invalid = 0;
  EXPECT_EQ(DrainLabels(writer, &invalid),
            (Labels{{"job", "train"}, {"note", std::string(100, 'x') + ",y"}}));
  EXPECT_EQ(invalid, 0u);
}

// Writes `text` as LABELS records, then lets `damage` change them in the ring.
void WriteDamaged(RingWriter& writer, const std::string& text,
                  void (*damage)(vramscope_ring_record* first)) {
  const std::uint64_t head = writer.header()->head;
  ASSERT_TRUE(writer.RecordLabels(text.data(), text.size()));
  auto* records = reinterpret_cast<vramscope_ring_record*>(
      reinterpret_cast<char*>(const_cast<vramscope_ring_header*>(writer.header())) +
      VRAMSCOPE_RING_HEADER_SIZE);
  damage(&records[head & (writer.header()->capacity - 1)]);
}

TEST(RingLabelsTest, HostileRecordsAreSkippedAsInvalid) {
  void (*damages[])(vramscope_ring_record*) = {
      [](vramscope_ring_record* r) { r->flags = 9; },              // chunk count past the head
      [](vramscope_ring_record* r) { r->aux = 5000; },             // longer than the limit
      [](vramscope_ring_record* r) { r->aux = 0; },                // empty
      [](vramscope_ring_record* r) { r[1].sub = 0; },              // chunks out of order
      [](vramscope_ring_record* r) { r[1].aux = 41; },             // chunks disagree on the length
      [](vramscope_ring_record* r) { r->payload.text[0] = '9'; },  // a key starting with a digit
      [](vramscope_ring_record* r) { r[1].payload.text[0] = '\xff'; },  // value not UTF-8
  };
  for (auto damage : damages) {
    TempDir dir;
    RingWriter writer;
    ASSERT_EQ(writer.Open({.dir = dir.path().c_str()}), RingError::kOk);
    std::string text = "job=";  // 2 chunks
    text.append(60, 'x');
    WriteDamaged(writer, text, damage);
    ASSERT_TRUE(writer.RecordAlloc(0, 0x1000, 100, 512, VRAMSCOPE_RING_ALLOC_POOLED));
    std::uint64_t invalid = 0;
    EXPECT_EQ(DrainLabels(writer, &invalid), Labels{});
    EXPECT_GE(invalid, 1u);
  }
}

}  // namespace
}  // namespace vramscope::interposer
