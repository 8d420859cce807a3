// RingWriter alone, and round trips of every record kind through the reader.
#include "vramscope/ring/ring_writer.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "drain/ring_directory.h"
#include "drain/ring_reader.h"
#include "ring_test_util.h"
#include "vramscope/ring/ring_dir.h"

namespace vramscope::interposer {
namespace {

using testing::TempDir;

agent::RingReader::Options DeadWriter() {
  agent::RingReader::Options options;
  options.writer_alive = [](const agent::RingInfo&) { return false; };
  return options;
}

TEST(RingWriterTest, OpenCreatesNamedFileWithHeader) {
  TempDir dir;
  RingWriter writer;
  ASSERT_EQ(writer.Open({.dir = dir.path().c_str(), .capacity = 128, .mode = "passthrough"}),
            RingError::kOk);
  const std::string expected_prefix =
      dir.path() + "/vramscope." + std::to_string(getuid()) + "." + std::to_string(getpid()) + ".";
  EXPECT_EQ(std::string(writer.path()).rfind(expected_prefix, 0), 0u) << writer.path();
  EXPECT_EQ(testing::OnlyRing(dir.path()), writer.path());  // no .tmp left behind
  struct stat st;
  ASSERT_EQ(stat(writer.path(), &st), 0);
  EXPECT_EQ(st.st_size, VRAMSCOPE_RING_HEADER_SIZE + 128 * VRAMSCOPE_RING_RECORD_SIZE);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const vramscope_ring_header* h = writer.header();
  EXPECT_EQ(h->magic, VRAMSCOPE_RING_MAGIC);
  EXPECT_EQ(h->pid, static_cast<std::uint32_t>(getpid()));
  EXPECT_EQ(h->parent_pid, static_cast<std::uint32_t>(getppid()));
  EXPECT_STREQ(h->mode, "passthrough");
  EXPECT_GT(h->command_line_len, 0u);
  EXPECT_NE(h->proc_start_ticks, 0u);

  auto reader = agent::RingReader::OpenFile(writer.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->info().pid, static_cast<std::uint32_t>(getpid()));
  EXPECT_EQ((*reader)->info().mode, "passthrough");
  ASSERT_FALSE((*reader)->info().command_line.empty());
  EXPECT_NE((*reader)->info().command_line[0].find("ring_writer_test"), std::string::npos);
  // One reader at a time.
  auto second = agent::RingReader::OpenFile(writer.path());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(RingWriterTest, OpenRejectsBadArguments) {
  TempDir dir;
  RingWriter writer;
  EXPECT_EQ(writer.Open({.dir = dir.path().c_str(), .capacity = 100}), RingError::kInvalidArgument);
  EXPECT_EQ(writer.Open({.dir = dir.path().c_str(), .capacity = 32}), RingError::kInvalidArgument);
  EXPECT_EQ(writer.Open({.dir = "/nonexistent/vramscope"}), RingError::kCannotCreate);
  EXPECT_FALSE(writer.is_open());
  EXPECT_FALSE(writer.RecordAlloc(0, 1, 2, 3, VRAMSCOPE_RING_ALLOC_POOLED));
  ASSERT_EQ(writer.Open({.dir = dir.path().c_str(), .capacity = 64}), RingError::kOk);
  EXPECT_EQ(writer.Open({.dir = dir.path().c_str(), .capacity = 64}), RingError::kAlreadyOpen);
}

TEST(RingWriterTest, OpenNeedsADirectoryAndCanCreateRelativeToADescriptor) {
  RingWriter writer;
  // Which directory is ChooseRingDir's decision (ring_dir.h), never a fallback in the writer.
  EXPECT_EQ(writer.Open({}), RingError::kInvalidArgument);
  TempDir dir;
  const RingDirCheck check = CheckRingDir(dir.path().c_str());
  ASSERT_EQ(check.verdict, RingDirVerdict::kSafe);
  ASSERT_GE(check.fd, 0);
  ASSERT_EQ(writer.Open({.dir = dir.path().c_str(), .dir_fd = check.fd}), RingError::kOk);
  close(check.fd);
  const std::string path = writer.path();
  EXPECT_EQ(path.rfind(dir.path() + "/vramscope.", 0), 0u) << path;
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(RingWriterTest, CountersFollowTheKindRule) {
  TempDir dir;
  RingWriter writer;
  ASSERT_EQ(writer.Open({.dir = dir.path().c_str()}), RingError::kOk);
  EXPECT_TRUE(writer.RecordPoolReserve(1, 0x1000, 4096));
  EXPECT_TRUE(writer.RecordAlloc(1, 0x1000, 1000, 1024, VRAMSCOPE_RING_ALLOC_POOLED));
  EXPECT_TRUE(writer.RecordAlloc(1, 0x9000, 300, 300, VRAMSCOPE_RING_ALLOC_DRIVER));
  EXPECT_TRUE(writer.RecordAlloc(1, 0x7000, 50, 50, VRAMSCOPE_RING_ALLOC_HOST));
  EXPECT_TRUE(writer.RecordFree(1, 0x1000, 1000, 1024, VRAMSCOPE_RING_ALLOC_POOLED));
  EXPECT_TRUE(writer.RecordFree(1, 0x9000, 300, 300, VRAMSCOPE_RING_ALLOC_DRIVER));
  const vramscope_ring_device_counters& c = writer.header()->devices[1];
  EXPECT_EQ(c.peak_requested_bytes, 1300u);
  EXPECT_EQ(c.peak_allocated_bytes, 1324u);
  EXPECT_EQ(c.peak_reserved_bytes, 4396u);
  EXPECT_EQ(c.current_requested_bytes, 0u);
  EXPECT_EQ(c.current_allocated_bytes, 0u);
  EXPECT_EQ(c.current_reserved_bytes, 4096u);
  EXPECT_EQ(c.alloc_count, 3u);
  EXPECT_EQ(c.free_count, 2u);
  // A free never seen allocated saturates at zero instead of wrapping.
  writer.OnFree(1, 5000, 5000);
  EXPECT_EQ(c.current_requested_bytes, 0u);
  // Devices beyond the table are recorded but not counted.
  EXPECT_TRUE(writer.RecordAlloc(40, 0x1, 10, 10, VRAMSCOPE_RING_ALLOC_POOLED));
}

TEST(RingWriterTest, EveryKindRoundTripsThroughTheReader) {
  TempDir dir;
  RingWriter writer;
  ASSERT_EQ(writer.Open({.dir = dir.path().c_str()}), RingError::kOk);
  const std::uint8_t uuid[16] = {0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  writer.SetDeviceInfo(0, "NVIDIA H200", uuid, 141ull << 30);
  ASSERT_TRUE(writer.RecordPoolReserve(0, 0x10000, 1 << 20));
  ASSERT_TRUE(writer.RecordAlloc(0, 0x10000, 1000, 1024, VRAMSCOPE_RING_ALLOC_POOLED, 7, 3, 99));
  const std::string long_name(100, 'n');
  const std::string domain = "train";
  ASSERT_TRUE(writer.RecordNvtxPush(0, 3, 2, 5, long_name.data(), long_name.size(), domain.data(),
                                    domain.size()));
  ASSERT_TRUE(writer.RecordNvtxPush(0, 4, 3, 0, "fwd", 3, nullptr, 0));
  ASSERT_TRUE(writer.RecordNvtxPop(0, 4));
  ASSERT_TRUE(writer.RecordFree(0, 0x10000, 1000, 1024, VRAMSCOPE_RING_ALLOC_POOLED, 7));
  ASSERT_TRUE(writer.RecordOom(0, 1 << 30, 1 << 29, 1 << 28, 2));
  vramscope_ring_pool_state_payload state = {1, 2, 3, 4, 5};
  ASSERT_TRUE(writer.RecordPoolState(0, state));
  vramscope_ring_cupti_payload cupti = {0xabc, 64, 0, 9, 2, 0};
  ASSERT_TRUE(writer.RecordCuptiMemory(0, 1, 12345, cupti));
  ASSERT_TRUE(writer.RecordPoolRelease(0, 0x10000, 1 << 20));
  writer.MarkExited(3);

  auto reader = agent::RingReader::OpenFile(writer.path(), DeadWriter());
  ASSERT_TRUE(reader.ok()) << reader.status();
  google::protobuf::RepeatedPtrField<v1::Event> events;
  auto stats = (*reader)->Drain(&events);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->finished);
  EXPECT_EQ(stats->dropped, 0u);
  ASSERT_EQ(events.size(), 12);
  const v1::ProcessStartEvent& start = events[0].process_start();
  EXPECT_EQ(start.pid(), static_cast<std::uint32_t>(getpid()));
  ASSERT_EQ(start.devices_size(), 1);
  EXPECT_EQ(start.devices(0).name(), "NVIDIA H200");
  EXPECT_EQ(start.devices(0).uuid(), "GPU-deadbeef-0102-0304-0506-0708090a0b0c");
  EXPECT_EQ(start.devices(0).total_memory_bytes(), 141ull << 30);
  EXPECT_EQ(events[1].pool_reserve().bytes(), 1u << 20);
  const v1::AllocEvent& alloc = events[2].alloc();
  EXPECT_EQ(alloc.address(), 0x10000u);
  EXPECT_EQ(alloc.requested_bytes(), 1000u);
  EXPECT_EQ(alloc.allocated_bytes(), 1024u);
  EXPECT_EQ(alloc.kind(), v1::ALLOCATION_KIND_POOLED);
  EXPECT_EQ(alloc.stream(), 7u);
  EXPECT_EQ(alloc.nvtx_range(), 3u);
  EXPECT_EQ(alloc.site(), 99u);
  EXPECT_EQ(events[2].thread_id(), static_cast<std::uint32_t>(gettid()));
  EXPECT_GE(events[2].time_ns(), (*reader)->info().start_monotonic_ns);
  EXPECT_EQ(events[3].nvtx_push().name(), long_name);
  EXPECT_EQ(events[3].nvtx_push().domain(), "train");
  EXPECT_EQ(events[3].nvtx_push().range_id(), 3u);
  EXPECT_EQ(events[3].nvtx_push().parent_range_id(), 2u);
  EXPECT_EQ(events[3].nvtx_push().category(), 5u);
  EXPECT_EQ(events[4].nvtx_push().name(), "fwd");
  EXPECT_EQ(events[4].nvtx_push().domain(), "");
  EXPECT_EQ(events[5].nvtx_pop().range_id(), 4u);
  EXPECT_EQ(events[6].free().allocated_bytes(), 1024u);
  EXPECT_EQ(events[7].oom().verdict(), v1::OOM_VERDICT_CAPACITY);
  EXPECT_EQ(events[7].oom().largest_free_block_bytes(), 1u << 28);
  EXPECT_EQ(events[8].pool_state().unreleasable_free_bytes(), 4u);
  EXPECT_EQ(events[8].pool_state().reserved_bytes(), 5u);
  EXPECT_EQ(events[9].cupti_memory().operation(), v1::CuptiMemoryEvent::OPERATION_ALLOCATION);
  EXPECT_EQ(events[9].time_ns(), 12345u);
  EXPECT_EQ(events[10].pool_release().bytes(), 1u << 20);
  EXPECT_EQ(events[11].process_exit().exit_code(), 3);
  EXPECT_FALSE(events[11].process_exit().killed());

  const auto counters = (*reader)->Counters();
  ASSERT_EQ(counters.size(), 1u);
  EXPECT_EQ(counters[0].peak_reserved_bytes(), 1u << 20);
  EXPECT_EQ(counters[0].peak_allocated_bytes(), 1024u);
  EXPECT_EQ(counters[0].records_written(), 13u);  // 11 records, the long NVTX push 3 slots
  EXPECT_EQ(counters[0].records_dropped(), 0u);
}

TEST(RingWriterTest, NvtxTextIsTruncatedToWhatTheRecordsCarry) {
  TempDir dir;
  RingWriter writer;
  ASSERT_EQ(writer.Open({.dir = dir.path().c_str()}), RingError::kOk);
  const std::string name(500, 'x');
  const std::string domain(50, 'd');
  ASSERT_TRUE(
      writer.RecordNvtxPush(0, 1, 0, 0, name.data(), name.size(), domain.data(), domain.size()));
  auto reader = agent::RingReader::OpenFile(writer.path(), DeadWriter());
  ASSERT_TRUE(reader.ok());
  google::protobuf::RepeatedPtrField<v1::Event> events;
  ASSERT_TRUE((*reader)->Drain(&events).ok());
  ASSERT_GE(events.size(), 2);
  EXPECT_EQ(events[1].nvtx_push().name(), name.substr(0, VRAMSCOPE_RING_MAX_NVTX_TEXT));
  EXPECT_EQ(events[1].nvtx_push().domain(), "");
}

TEST(RingWriterTest, CloseKeepsTheFileForTheReader) {
  TempDir dir;
  std::string path;
  {
    RingWriter writer;
    ASSERT_EQ(writer.Open({.dir = dir.path().c_str()}), RingError::kOk);
    path = writer.path();
    ASSERT_TRUE(writer.RecordAlloc(0, 1, 8, 8, VRAMSCOPE_RING_ALLOC_POOLED));
  }
  auto reader = agent::RingReader::OpenFile(path, DeadWriter());
  ASSERT_TRUE(reader.ok()) << reader.status();
  google::protobuf::RepeatedPtrField<v1::Event> events;
  auto stats = (*reader)->Drain(&events);
  ASSERT_TRUE(stats.ok());
  EXPECT_TRUE(stats->finished);
  ASSERT_EQ(events.size(), 3);  // start, alloc, exit (killed: no exit path ran)
  EXPECT_TRUE(events[2].process_exit().killed());
}

std::uint64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

// A writer gone without its exit path: killed and vanished, signal unknown, and timed no
// earlier than its last event; when the reader saw it alive before, at the drain that found it
// gone (not at its last event, which may be long before).
TEST(RingWriterTest, VanishedWriterEndsWhenTheReaderFoundItGone) {
  TempDir dir;
  RingWriter writer;
  ASSERT_EQ(writer.Open({.dir = dir.path().c_str()}), RingError::kOk);
  ASSERT_TRUE(writer.RecordAlloc(0, 1, 8, 8, VRAMSCOPE_RING_ALLOC_POOLED));
  bool alive = true;
  agent::RingReader::Options options;
  options.writer_alive = [&alive](const agent::RingInfo&) { return alive; };
  auto reader = agent::RingReader::OpenFile(writer.path(), options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  google::protobuf::RepeatedPtrField<v1::Event> events;
  ASSERT_TRUE((*reader)->Drain(&events).ok());
  ASSERT_FALSE((*reader)->finished());
  ASSERT_EQ(events.size(), 2);  // start, alloc
  const std::uint64_t last_event = events[1].time_ns();
  alive = false;
  const std::uint64_t before_drain = MonotonicNs();
  ASSERT_GT(before_drain, last_event);
  events.Clear();
  ASSERT_TRUE((*reader)->Drain(&events).ok());
  ASSERT_TRUE((*reader)->finished());
  ASSERT_EQ(events.size(), 1);
  const v1::ProcessExitEvent& exit = events[0].process_exit();
  EXPECT_TRUE(exit.killed());
  EXPECT_TRUE(exit.vanished());
  EXPECT_EQ(exit.signal(), 0);
  EXPECT_GE(events[0].time_ns(), before_drain);
  EXPECT_LE(events[0].time_ns(), MonotonicNs());
}

// Found already gone (never seen alive): its last event is all the reader knows.
TEST(RingWriterTest, WriterFoundGoneEndsAtItsLastEvent) {
  TempDir dir;
  RingWriter writer;
  ASSERT_EQ(writer.Open({.dir = dir.path().c_str()}), RingError::kOk);
  ASSERT_TRUE(writer.RecordAlloc(0, 1, 8, 8, VRAMSCOPE_RING_ALLOC_POOLED));
  auto reader = agent::RingReader::OpenFile(writer.path(), DeadWriter());
  ASSERT_TRUE(reader.ok()) << reader.status();
  google::protobuf::RepeatedPtrField<v1::Event> events;
  ASSERT_TRUE((*reader)->Drain(&events).ok());
  ASSERT_EQ(events.size(), 3);
  EXPECT_TRUE(events[2].process_exit().vanished());
  EXPECT_EQ(events[2].time_ns(), events[1].time_ns());
}

// An exit record: exited with its code, not vanished.
TEST(RingWriterTest, ExitRecordIsNotVanished) {
  TempDir dir;
  RingWriter writer;
  ASSERT_EQ(writer.Open({.dir = dir.path().c_str()}), RingError::kOk);
  writer.MarkExited(4);
  auto reader = agent::RingReader::OpenFile(writer.path(), DeadWriter());
  ASSERT_TRUE(reader.ok()) << reader.status();
  google::protobuf::RepeatedPtrField<v1::Event> events;
  ASSERT_TRUE((*reader)->Drain(&events).ok());
  ASSERT_EQ(events.size(), 2);
  EXPECT_FALSE(events[1].process_exit().killed());
  EXPECT_FALSE(events[1].process_exit().vanished());
  EXPECT_EQ(events[1].process_exit().exit_code(), 4);
}

TEST(RingWriterTest, DeviceDescribedLaterRepeatsProcessStart) {
  TempDir dir;
  RingWriter writer;
  ASSERT_EQ(writer.Open({.dir = dir.path().c_str()}), RingError::kOk);
  auto reader = agent::RingReader::OpenFile(writer.path());
  ASSERT_TRUE(reader.ok());
  google::protobuf::RepeatedPtrField<v1::Event> events;
  ASSERT_TRUE((*reader)->Drain(&events).ok());
  ASSERT_EQ(events.size(), 1);
  EXPECT_EQ(events[0].process_start().devices_size(), 0);
  ASSERT_TRUE((*reader)->Drain(&events).ok());
  EXPECT_EQ(events.size(), 1);  // nothing new
  writer.SetDeviceInfo(1, "second", nullptr, 1 << 30);
  ASSERT_TRUE((*reader)->Drain(&events).ok());
  ASSERT_EQ(events.size(), 2);
  ASSERT_EQ(events[1].process_start().devices_size(), 1);
  EXPECT_EQ(events[1].process_start().devices(0).ordinal(), 1u);
}

TEST(RingDirectoryTest, ScanReturnsEachRingOnceAndSkipsTemporaryNames) {
  TempDir dir;
  agent::RingDirectory rings(dir.path());
  auto empty = rings.Scan();
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  RingWriter first;
  ASSERT_EQ(first.Open({.dir = dir.path().c_str()}), RingError::kOk);
  // A writer still initialising (".tmp") and an unrelated file are not rings.
  const std::string tmp = dir.path() + "/vramscope.0.1.2.ring.tmp";
  const std::string other = dir.path() + "/notes.txt";
  for (const std::string& path : {tmp, other}) {
    FILE* f = fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fclose(f);
  }
  auto found = rings.Scan();
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->size(), 1u);
  EXPECT_EQ((*found)[0], first.path());
  EXPECT_TRUE(rings.Scan()->empty());  // seen already
  RingWriter second;
  ASSERT_EQ(second.Open({.dir = dir.path().c_str()}), RingError::kOk);
  found = rings.Scan();
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->size(), 1u);
  EXPECT_EQ((*found)[0], second.path());
  rings.Forget(second.path());
  EXPECT_EQ(rings.Scan()->size(), 1u);
  EXPECT_EQ(agent::RingDirectory("/nonexistent/dir").Scan().status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace vramscope::interposer
