// Strings a traced process controls (command line, host, GPU name, mode, NVTX names, module
// paths) leave the drain as valid UTF-8, escaped reversibly (vramscope/utf8.h), with the exact
// arguments beside the escaped command line. vramscope-agent and `vramscope run` share this
// reader, so both send only what the collector can parse.
#include <google/protobuf/repeated_ptr_field.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "drain/ring_reader.h"
#include "ring_test_util.h"
#include "vramscope/ring/ring_writer.h"
#include "vramscope/utf8.h"

namespace vramscope::interposer {
namespace {

using testing::TempDir;

// Overwrites header text the way a hostile (or merely Latin-1) process's ring holds it.
void SetText(const char* source, std::size_t size, char* field, std::size_t capacity) {
  memset(field, 0, capacity);
  memcpy(field, source, size);
}

TEST(RingStringsTest, HostileHeaderAndRecordTextArriveEscaped) {
  TempDir dir;
  RingWriter writer;
  ASSERT_EQ(writer.Open({.dir = dir.path().c_str()}), RingError::kOk);
  // The writer's own mapping: what the process wrote into its header.
  auto* header = const_cast<vramscope_ring_header*>(writer.header());
  const char kArgs[] = "./app\0out\xE9.txt\0back\\slash";
  SetText(kArgs, sizeof(kArgs) - 1, header->command_line, sizeof(header->command_line));
  header->command_line_len = sizeof(kArgs) - 1;
  SetText("node\xFF", 5, header->host, sizeof(header->host));
  SetText("po\xC3ol", 5, header->mode, sizeof(header->mode));
  writer.SetDeviceInfo(0, "GPU \xA0 H200", nullptr, 1 << 30);
  const char kName[] = "step \xE9";
  const char kDomain[] = "dom\xC0\xAF";
  ASSERT_TRUE(
      writer.RecordNvtxPush(0, 1, 0, 0, kName, sizeof(kName) - 1, kDomain, sizeof(kDomain) - 1));
  ASSERT_TRUE(writer.RecordAlloc(0, 0x1000, 100, 512, VRAMSCOPE_RING_ALLOC_POOLED));

  // File rings are reported under the reader's host name (never the header's), which can be
  // as hostile: a machine named in Latin-1.
  agent::RingReader::Options options;
  options.host = "node\xFF";
  auto reader = agent::RingReader::OpenFile(writer.path(), options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  google::protobuf::RepeatedPtrField<v1::Event> events;
  testing::DrainAll(**reader, &events);
  ASSERT_GE(events.size(), 3);

  const v1::ProcessKey key = (*reader)->process_key();
  EXPECT_EQ(key.host(), "node\\xFF");
  const v1::ProcessStartEvent& start = events[0].process_start();
  EXPECT_EQ(start.host(), "node\\xFF");
  ASSERT_EQ(start.command_line_size(), 3);
  EXPECT_EQ(start.command_line(0), "./app");
  EXPECT_EQ(start.command_line(1), "out\\xE9.txt");
  EXPECT_EQ(start.command_line(2), "back\\slash");  // valid: as it is
  ASSERT_EQ(start.raw_command_line_size(), 3);      // one argument was escaped: all, byte for byte
  EXPECT_EQ(start.raw_command_line(1), "out\xE9.txt");
  EXPECT_EQ(start.raw_command_line(2), "back\\slash");
  EXPECT_EQ(UnescapeUtf8(start.command_line(1)), start.raw_command_line(1));
  EXPECT_EQ(start.mode(), "po\\xC3ol");
  ASSERT_EQ(start.devices_size(), 1);
  EXPECT_EQ(start.devices(0).name(), "GPU \\xA0 H200");
  EXPECT_EQ(events[1].nvtx_push().name(), "step \\xE9");
  EXPECT_EQ(events[1].nvtx_push().domain(), "dom\\xC0\\xAF");

  // What the agent puts on the wire parses at the other end.
  v1::EventBatch batch;
  *batch.mutable_process() = key;
  batch.set_sequence(1);
  *batch.mutable_events() = events;
  v1::EventBatch parsed;
  EXPECT_TRUE(parsed.ParseFromString(batch.SerializeAsString()));
}

TEST(RingStringsTest, ValidTextIsUntouchedAndHasNoRawCopy) {
  TempDir dir;
  RingWriter writer;
  ASSERT_EQ(writer.Open({.dir = dir.path().c_str()}), RingError::kOk);
  auto* header = const_cast<vramscope_ring_header*>(writer.header());
  const char kArgs[] = "python3\0caf\xC3\xA9.py\0C:\\x41";
  SetText(kArgs, sizeof(kArgs) - 1, header->command_line, sizeof(header->command_line));
  header->command_line_len = sizeof(kArgs) - 1;
  auto reader = agent::RingReader::OpenFile(writer.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  google::protobuf::RepeatedPtrField<v1::Event> events;
  testing::DrainAll(**reader, &events);
  ASSERT_GE(events.size(), 1);
  const v1::ProcessStartEvent& start = events[0].process_start();
  ASSERT_EQ(start.command_line_size(), 3);
  EXPECT_EQ(start.command_line(1), "caf\xC3\xA9.py");
  EXPECT_EQ(start.command_line(2), "C:\\x41");
  EXPECT_EQ(start.raw_command_line_size(), 0);
}

}  // namespace
}  // namespace vramscope::interposer
