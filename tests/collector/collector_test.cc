// The collector core without gRPC: sequence de-duplication, the append-only logs, rebuilding
// after a restart, damaged data directories, and a full disk.
#include "vramscope/collector/collector.h"

#include <errno.h>
#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "tests/collector/test_util.h"
#include "vramscope/collector/record_log.h"
#include "vramscope/log.h"

namespace vramscope::collector {
namespace {

using ::google::protobuf::util::MessageDifferencer;

using ::testing::HasSubstr;
using ::vramscope::testing::Batch;
using ::vramscope::testing::ExitBatch;
using ::vramscope::testing::Key;
using ::vramscope::testing::ReadFile;
using ::vramscope::testing::TempDir;
using ::vramscope::testing::WriteFile;

class CollectorTest : public ::testing::Test {
 protected:
  void SetUp() override { SetMinLogLevel(LogLevel::kError); }

  std::unique_ptr<Collector> Open(LoadReport* report = nullptr, CollectorOptions options = {}) {
    options.data_dir = dir_.path();
    options.fsync = false;
    absl::StatusOr<std::unique_ptr<Collector>> collector =
        Collector::Open(std::move(options), report);
    EXPECT_TRUE(collector.ok()) << collector.status();
    return collector.ok() ? std::move(*collector) : nullptr;
  }

  std::string OnlyLog() {
    std::vector<std::string> logs;
    for (const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
      if (entry.path().extension() == ".vslog") logs.push_back(entry.path().string());
    }
    EXPECT_EQ(logs.size(), 1u);
    return logs.empty() ? "" : logs[0];
  }

  TempDir dir_;
};

TEST(RecordLogTest, Crc32MatchesZlib) {
  EXPECT_EQ(Crc32(""), 0u);
  EXPECT_EQ(Crc32("123456789"), 0xCBF43926u);
  EXPECT_EQ(Crc32("The quick brown fox jumps over the lazy dog"), 0x414FA339u);
  EXPECT_EQ(Crc32("56789", Crc32("1234")), 0xCBF43926u);
}

// The CRC-32 every log record carries, bit by bit from its definition (reflected polynomial
// 0xEDB88320, register and result inverted): logs written by any version verify the same.
uint32_t ReferenceCrc32(absl::string_view data, uint32_t crc) {
  uint32_t c = ~crc;
  for (const char byte : data) {
    c ^= static_cast<unsigned char>(byte);
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return ~c;
}

TEST(RecordLogTest, Crc32AgreesWithItsDefinitionAtEveryLengthAndAlignment) {
  std::mt19937_64 random(5);
  std::string bytes(70000, '\0');
  for (char& byte : bytes) byte = static_cast<char>(random());
  for (size_t offset = 0; offset < 16; ++offset) {
    for (size_t size : {size_t{0}, size_t{1}, size_t{3}, size_t{7}, size_t{8}, size_t{9},
                        size_t{31}, size_t{64}, size_t{255}, size_t{4097}, size_t{65536}}) {
      const absl::string_view data(bytes.data() + offset, size);
      ASSERT_EQ(Crc32(data), ReferenceCrc32(data, 0)) << offset << " " << size;
      ASSERT_EQ(Crc32(data, 0x12345678u), ReferenceCrc32(data, 0x12345678u));
    }
  }
}

// Watch's figures of a live process are kept between snapshots until its engine changes: every
// way it changes (a stored batch, a refused one's stand-in, a finish, a revival after it) shows
// in the next snapshot, and a snapshot without a change shows the same as the one before.
TEST_F(CollectorTest, SnapshotsFollowEveryChangeOfTheEngine) {
  auto collector = Open();
  const v1::ProcessKey key = Key(60);
  auto figures = [&] {
    const v1::StatsUpdate update = collector->Snapshot({});
    EXPECT_EQ(update.processes_size(), 1);
    return update.processes_size() == 1 ? update.processes(0) : v1::ProcessStats();
  };
  ASSERT_TRUE(collector->Ingest(Batch(key, 1, 10)).ok());
  const v1::ProcessStats first = figures();
  EXPECT_EQ(first.devices(0).alloc_count(), 9u);
  EXPECT_TRUE(MessageDifferencer::Equals(figures(), first));
  ASSERT_TRUE(collector->Ingest(Batch(key, 2, 10, 0x100000)).ok());
  const v1::ProcessStats second = figures();
  EXPECT_EQ(second.devices(0).alloc_count(), 19u);
  EXPECT_EQ(second.held(0).last(), 2u);
  // A refused batch: its sequence is held, its events counted as dropped.
  IngestMessage refused;
  refused.kind = IngestMessage::Kind::kRejected;
  refused.process = key;
  refused.key_usable = true;
  refused.sequence = 3;
  refused.events = 7;
  ASSERT_TRUE(collector->Refuse(refused, false, "").ok());
  const v1::ProcessStats third = figures();
  EXPECT_EQ(third.held(0).last(), 3u);
  EXPECT_EQ(third.devices(0).dropped_records(), 7u);
  ASSERT_TRUE(collector->Ingest(testing::ExitBatch(key, 4, 0)).ok());
  EXPECT_TRUE(figures().finished());
  // A late batch revives it: the rebuilt engine's figures, with the new batch.
  ASSERT_TRUE(collector->Ingest(Batch(key, 5, 10, 0x200000)).ok());
  const v1::ProcessStats revived = figures();
  EXPECT_EQ(revived.devices(0).alloc_count(), 29u);
  EXPECT_EQ(revived.held(0).last(), 5u);
}

TEST_F(CollectorTest, AcksInOrderAndIgnoresDuplicates) {
  auto collector = Open();
  const v1::ProcessKey key = Key(100);
  EXPECT_EQ(*collector->Ingest(Batch(key, 1, 10)), 1u);
  EXPECT_EQ(*collector->Ingest(Batch(key, 2, 10)), 2u);
  // A resend after a reconnect: acknowledged again, counted once.
  EXPECT_EQ(*collector->Ingest(Batch(key, 1, 10)), 2u);
  EXPECT_EQ(*collector->Ingest(Batch(key, 2, 10)), 2u);
  EXPECT_EQ(*collector->Ingest(Batch(key, 3, 10)), 3u);
  absl::StatusOr<v1::Report> report = collector->GetReport(key);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->events(), 30u);
  EXPECT_EQ(collector->batches_stored(), 3u);
  EXPECT_EQ(collector->batches_duplicate(), 2u);
  EXPECT_THAT(report->command_line(), ::testing::ElementsAre("./app", "--steps=3"));
}

TEST_F(CollectorTest, GapIsAnErrorThatNamesTheExpectedSequence) {
  auto collector = Open();
  const v1::ProcessKey key = Key(101);
  absl::StatusOr<uint64_t> acked = collector->Ingest(Batch(key, 2, 5));
  EXPECT_EQ(acked.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(acked.status().message(), HasSubstr("expects sequence 1, got 2"));
  ASSERT_TRUE(collector->Ingest(Batch(key, 1, 5)).ok());
  acked = collector->Ingest(Batch(key, 3, 5));
  EXPECT_EQ(acked.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(acked.status().message(), HasSubstr("resend from sequence 2"));
  EXPECT_EQ(collector->GetReport(key)->events(), 5u);
}

TEST_F(CollectorTest, RejectsBatchesWithoutProcessOrSequence) {
  auto collector = Open();
  v1::EventBatch no_process = Batch(Key(1), 1, 1);
  no_process.clear_process();
  EXPECT_EQ(collector->Ingest(no_process).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(collector->Ingest(Batch(Key(1), 0, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(collector->GetReport(Key(1)).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CollectorTest, ProbeAnswersTheStoredSequenceAndStoresNothing) {
  auto collector = Open();
  v1::EventBatch probe;
  *probe.mutable_process() = Key(30);
  EXPECT_EQ(*collector->Ingest(probe), 0u);
  EXPECT_EQ(collector->ListProcesses(true).processes_size(), 0);
  ASSERT_TRUE(collector->Ingest(Batch(Key(30), 1, 2)).ok());
  ASSERT_TRUE(collector->Ingest(Batch(Key(30), 2, 2)).ok());
  EXPECT_EQ(*collector->Ingest(probe), 2u);
  EXPECT_EQ(collector->GetReport(Key(30))->events(), 4u);
}

// A process that vanished (killed) is told so in ListProcesses, Watch's snapshot and its
// report, also after a restart (from the stored log), never as "exited 0".
TEST_F(CollectorTest, KilledProcessIsToldKilledEverywhere) {
  auto killed_batch = [](uint64_t sequence) {
    v1::EventBatch batch = ExitBatch(Key(40), sequence, 0);
    v1::ProcessExitEvent* exit = batch.mutable_events(0)->mutable_process_exit();
    exit->set_killed(true);
    exit->set_signal(9);
    exit->set_vanished(true);
    return batch;
  };
  auto expect_killed = [](Collector& collector) {
    const v1::ListProcessesResponse list = collector.ListProcesses(true);
    ASSERT_EQ(list.processes_size(), 1);
    EXPECT_TRUE(list.processes(0).finished());
    EXPECT_TRUE(list.processes(0).killed());
    EXPECT_EQ(list.processes(0).signal(), 9);
    EXPECT_TRUE(list.processes(0).vanished());
    const v1::StatsUpdate update = collector.Snapshot({});
    ASSERT_EQ(update.processes_size(), 1);
    EXPECT_TRUE(update.processes(0).killed());
    EXPECT_EQ(update.processes(0).signal(), 9);
    const absl::StatusOr<v1::Report> report = collector.GetReport(Key(40));
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->finished());
    EXPECT_TRUE(report->killed());
    EXPECT_EQ(report->signal(), 9);
    EXPECT_TRUE(report->vanished());
  };
  {
    auto collector = Open();
    ASSERT_TRUE(collector->Ingest(Batch(Key(40), 1, 3)).ok());
    ASSERT_TRUE(collector->Ingest(killed_batch(2)).ok());
    expect_killed(*collector);
  }
  auto reopened = Open();
  expect_killed(*reopened);
}

TEST_F(CollectorTest, ProbeOfAProcessLoadedAtStartAnswers) {
  {
    auto collector = Open();
    ASSERT_TRUE(collector->Ingest(Batch(Key(31), 1, 2)).ok());
  }
  // A restarted agent probes a restarted collector: the lookup must not take the process's lock
  // under the collector's, the reverse of the order loading took them in (Abseil's deadlock
  // detection aborts the process on such a cycle).
  auto collector = Open();
  v1::EventBatch probe;
  *probe.mutable_process() = Key(31);
  EXPECT_EQ(*collector->Ingest(probe), 1u);
}

TEST_F(CollectorTest, RestartRebuildsEveryProcess) {
  {
    auto collector = Open();
    for (uint64_t seq = 1; seq <= 5; ++seq)
      ASSERT_TRUE(collector->Ingest(Batch(Key(7), seq, 4)).ok());
    ASSERT_TRUE(collector->Ingest(Batch(Key(8), 1, 3)).ok());
    ASSERT_TRUE(collector->Ingest(ExitBatch(Key(8), 2, 3)).ok());
  }
  LoadReport load;
  auto collector = Open(&load);
  EXPECT_EQ(load.files_loaded, 2);
  EXPECT_EQ(load.batches, 7u);
  EXPECT_TRUE(load.errors.empty());
  EXPECT_EQ(collector->GetReport(Key(7))->events(), 20u);
  v1::Report finished = *collector->GetReport(Key(8));
  EXPECT_TRUE(finished.finished());
  EXPECT_EQ(finished.exit_code(), 3);
  // Sequences continue where the log ends; a resend of an old batch is a duplicate.
  EXPECT_EQ(*collector->Ingest(Batch(Key(7), 5, 4)), 5u);
  EXPECT_EQ(*collector->Ingest(Batch(Key(7), 6, 4)), 6u);
  EXPECT_EQ(collector->GetReport(Key(7))->events(), 24u);
  EXPECT_EQ(collector->ListProcesses(false).processes_size(), 1);
  EXPECT_EQ(collector->ListProcesses(true).processes_size(), 2);
}

TEST_F(CollectorTest, TornTailIsTruncatedAndTheRestKept) {
  {
    auto collector = Open();
    for (uint64_t seq = 1; seq <= 3; ++seq)
      ASSERT_TRUE(collector->Ingest(Batch(Key(9), seq, 4)).ok());
  }
  const std::string log = OnlyLog();
  const uint64_t good_size = std::filesystem::file_size(log);
  // A crash in the middle of the fourth write: header and part of the payload.
  std::string torn = FrameRecord(Batch(Key(9), 4, 4).SerializeAsString());
  WriteFile(log, ReadFile(log) + torn.substr(0, torn.size() / 2));

  LoadReport load;
  auto collector = Open(&load);
  ASSERT_EQ(load.warnings.size(), 1u);
  EXPECT_THAT(load.warnings[0], HasSubstr("torn record"));
  EXPECT_THAT(load.warnings[0], HasSubstr("up to sequence 3"));
  EXPECT_TRUE(load.errors.empty());
  EXPECT_EQ(std::filesystem::file_size(log), good_size);
  EXPECT_EQ(collector->GetReport(Key(9))->events(), 12u);
  // The agent resends the batch that was never acknowledged.
  EXPECT_EQ(*collector->Ingest(Batch(Key(9), 4, 4)), 4u);
  EXPECT_EQ(collector->GetReport(Key(9))->events(), 16u);
}

TEST_F(CollectorTest, CorruptRecordInTheMiddleKeepsThePrefixAndSavesTheRest) {
  {
    auto collector = Open();
    for (uint64_t seq = 1; seq <= 4; ++seq)
      ASSERT_TRUE(collector->Ingest(Batch(Key(10), seq, 4)).ok());
  }
  const std::string log = OnlyLog();
  std::string bytes = ReadFile(log);
  const size_t first = kLogMagic.size();
  const size_t second = first + kRecordHeaderBytes + Batch(Key(10), 1, 4).ByteSizeLong();
  bytes[second + kRecordHeaderBytes + 3] ^= 0x5A;  // flip bits inside batch 2's payload
  WriteFile(log, bytes);

  LoadReport load;
  auto collector = Open(&load);
  ASSERT_EQ(load.errors.size(), 1u) << ::testing::PrintToString(load.warnings);
  EXPECT_THAT(load.errors[0], HasSubstr("CRC mismatch"));
  EXPECT_THAT(load.errors[0], HasSubstr(".corrupt-"));
  EXPECT_EQ(collector->GetReport(Key(10))->events(), 4u);
  EXPECT_TRUE(std::filesystem::exists(log + ".corrupt-" + std::to_string(second)));
}

TEST_F(CollectorTest, GarbageFileIsReportedAndTheRestLoads) {
  {
    auto collector = Open();
    ASSERT_TRUE(collector->Ingest(Batch(Key(11), 1, 4)).ok());
  }
  WriteFile(dir_.path() + "/garbage.vslog", std::string(1000, '\x7f'));
  WriteFile(dir_.path() + "/empty.vslog", "");
  WriteFile(dir_.path() + "/notes.txt", "not ours");
  LoadReport load;
  auto collector = Open(&load);
  EXPECT_EQ(load.files_loaded, 1);
  EXPECT_EQ(load.files_skipped, 1);
  ASSERT_EQ(load.errors.size(), 1u);
  EXPECT_THAT(load.errors[0], HasSubstr("garbage.vslog: not a vramscope log"));
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/empty.vslog"));  // unfinished: removed
  EXPECT_EQ(collector->GetReport(Key(11))->events(), 4u);
  EXPECT_EQ(*collector->Ingest(Batch(Key(11), 2, 4)), 2u);
}

TEST_F(CollectorTest, DiskLimitRefusesWithoutAcking) {
  CollectorOptions options;
  const uint64_t one =
      kLogMagic.size() + FrameRecord(Batch(Key(12), 1, 50).SerializeAsString()).size();
  options.max_disk_bytes = one + 100;
  auto collector = Open(nullptr, options);
  ASSERT_EQ(*collector->Ingest(Batch(Key(12), 1, 50)), 1u);
  absl::StatusOr<uint64_t> refused = collector->Ingest(Batch(Key(12), 2, 50));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("--max-disk-bytes"));
  EXPECT_THAT(refused.status().message(), HasSubstr("not stored nor acknowledged"));
  // Still up and consistent: the same batch is accepted once space is available, and nothing
  // before it was lost.
  EXPECT_EQ(collector->GetReport(Key(12))->events(), 50u);
  EXPECT_EQ(collector->disk_bytes(), one);
}

TEST_F(CollectorTest, InjectedEnospcIsNotAckedAndLeavesNoPartialRecord) {
  std::atomic<bool> full{false};
  CollectorOptions options;
  options.write_fn = [&full](int fd, const void* data, size_t size) -> ssize_t {
    if (full.load()) {
      // Half the bytes reach the disk, then it is full: the worst case for the log.
      ssize_t n = ::write(fd, data, size / 2);
      if (n > 0 && static_cast<size_t>(n) < size) return n;
      errno = ENOSPC;
      return -1;
    }
    return ::write(fd, data, size);
  };
  auto collector = Open(nullptr, options);
  ASSERT_EQ(*collector->Ingest(Batch(Key(13), 1, 8)), 1u);
  const uint64_t size_before = std::filesystem::file_size(OnlyLog());
  full = true;
  absl::StatusOr<uint64_t> refused = collector->Ingest(Batch(Key(13), 2, 8));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("No space left on device"));
  EXPECT_EQ(std::filesystem::file_size(OnlyLog()), size_before);
  full = false;
  EXPECT_EQ(*collector->Ingest(Batch(Key(13), 2, 8)), 2u);
  collector.reset();
  LoadReport load;
  collector = Open(&load);
  EXPECT_TRUE(load.warnings.empty() && load.errors.empty());
  EXPECT_EQ(collector->GetReport(Key(13))->events(), 16u);
}

TEST_F(CollectorTest, MaxProcessesRefusesNewOnes) {
  CollectorOptions options;
  options.max_processes = 2;
  auto collector = Open(nullptr, options);
  ASSERT_TRUE(collector->Ingest(Batch(Key(1), 1, 1)).ok());
  ASSERT_TRUE(collector->Ingest(Batch(Key(2), 1, 1)).ok());
  absl::StatusOr<uint64_t> refused = collector->Ingest(Batch(Key(3), 1, 1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("--max-processes=2"));
  EXPECT_TRUE(collector->Ingest(Batch(Key(1), 2, 1)).ok());
}

TEST_F(CollectorTest, FinishedProcessesLeaveTheLiveTableAndStayReadable) {
  CollectorOptions options;
  options.max_processes = 2;
  auto collector = Open(nullptr, options);
  ASSERT_TRUE(collector->Ingest(Batch(Key(1), 1, 4)).ok());
  ASSERT_TRUE(collector->Ingest(Batch(Key(2), 1, 4)).ok());
  const v1::Report before = *collector->GetReport(Key(1));
  ASSERT_TRUE(collector->Ingest(ExitBatch(Key(1), 2, 7)).ok());
  ASSERT_TRUE(collector->Ingest(ExitBatch(Key(2), 2, 0)).ok());
  EXPECT_EQ(collector->live_processes(), 0u);
  EXPECT_EQ(collector->finished_processes(), 2u);
  // Two finished processes no longer block new ones at --max-processes=2.
  ASSERT_TRUE(collector->Ingest(Batch(Key(3), 1, 1)).ok());
  ASSERT_TRUE(collector->Ingest(Batch(Key(4), 1, 1)).ok());
  EXPECT_EQ(collector->Ingest(Batch(Key(5), 1, 1)).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Still readable: the report rebuilt from the log, the listing, a resend acknowledged.
  absl::StatusOr<v1::Report> after = collector->GetReport(Key(1));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->events(), before.events() + 1);
  EXPECT_TRUE(after->finished());
  EXPECT_EQ(after->exit_code(), 7);
  ASSERT_EQ(after->devices_size(), 1);
  EXPECT_EQ(after->devices(0).alloc_count(), before.devices(0).alloc_count());
  EXPECT_EQ(collector->ListProcesses(true).processes_size(), 4);
  EXPECT_EQ(collector->ListProcesses(false).processes_size(), 2);
  EXPECT_EQ(*collector->Ingest(ExitBatch(Key(1), 2, 7)), 2u);
  EXPECT_EQ(collector->Snapshot({}).processes_size(), 4);
  // A batch after the exit brings it back (there is room once one of the others finishes), and
  // as it is still finished it leaves again once stored.
  EXPECT_EQ(collector->Ingest(Batch(Key(1), 3, 2)).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(collector->Ingest(ExitBatch(Key(3), 2, 0)).ok());
  EXPECT_EQ(*collector->Ingest(Batch(Key(1), 3, 2)), 3u);
  EXPECT_EQ(collector->GetReport(Key(1))->events(), before.events() + 3);
  EXPECT_EQ(collector->live_processes(), 1u);  // Key(4)
  // After a restart, finished ones go straight to the finished table.
  collector.reset();
  collector = Open(nullptr, options);
  EXPECT_EQ(collector->live_processes(), 1u);
  EXPECT_EQ(collector->finished_processes(), 3u);
  EXPECT_EQ(collector->GetReport(Key(2))->exit_code(), 0);
}

TEST_F(CollectorTest, TakeoverStartsPastSequenceOneAndHoldsRanges) {
  auto collector = Open();
  // Without takeover (one collector) a process must start at 1.
  EXPECT_EQ(collector->Ingest(Batch(Key(8), 5, 3)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // On a failover stream: taken over at 5; later back after a gap (7, 8 went elsewhere).
  EXPECT_EQ(*collector->Ingest(Batch(Key(8), 5, 3), {}, /*takeover=*/true), 5u);
  EXPECT_EQ(*collector->Ingest(Batch(Key(8), 6, 3), {}, true), 6u);
  EXPECT_EQ(collector->Ingest(Batch(Key(8), 9, 3)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*collector->Ingest(Batch(Key(8), 9, 3), {}, true), 9u);
  EXPECT_EQ(*collector->Ingest(Batch(Key(8), 6, 3), {}, true), 9u);  // a resend: acknowledged
  auto held = [](const auto& message) {
    std::string out;
    for (const v1::SequenceRange& r : message.held()) {
      out += absl::StrCat("[", r.first(), ",", r.last(), "]");
    }
    return out;
  };
  EXPECT_EQ(held(*collector->GetReport(Key(8))), "[5,6][9,9]");
  EXPECT_EQ(collector->GetReport(Key(8))->events(), 9u);
  // A viewer merging collectors can leave out what another one counts.
  v1::SequenceRange skip;
  skip.set_first(6);
  skip.set_last(6);
  absl::StatusOr<v1::Report> less = collector->GetReport(Key(8), {skip});
  ASSERT_TRUE(less.ok()) << less.status();
  EXPECT_EQ(less->events(), 6u);
  EXPECT_EQ(held(*less), "[5,5][9,9]");
  EXPECT_EQ(held(collector->ListProcesses(true).processes(0)), "[5,6][9,9]");
  // The ranges come back from the log after a restart.
  collector.reset();
  LoadReport load;
  collector = Open(&load);
  EXPECT_TRUE(load.errors.empty());
  EXPECT_EQ(held(*collector->GetReport(Key(8))), "[5,6][9,9]");
  EXPECT_EQ(*collector->Ingest(Batch(Key(8), 10, 3)), 10u);
}

TEST_F(CollectorTest, SnapshotFiltersAndStripsHeavyFields) {
  auto collector = Open();
  ASSERT_TRUE(collector->Ingest(Batch(Key(21), 1, 3)).ok());
  ASSERT_TRUE(collector->Ingest(Batch(Key(22), 1, 3)).ok());
  v1::WatchRequest all;
  EXPECT_EQ(collector->Snapshot(all).processes_size(), 2);
  v1::WatchRequest one;
  *one.add_processes() = Key(22);
  v1::StatsUpdate update = collector->Snapshot(one);
  ASSERT_EQ(update.processes_size(), 1);
  EXPECT_EQ(update.processes(0).process().pid(), 22u);
  for (const v1::DeviceReport& device : update.processes(0).devices()) {
    EXPECT_EQ(device.timeline_size(), 0);
    EXPECT_EQ(device.leaks_size(), 0);
  }
}

// Everything in the data directory whose name ends in .vslog.
std::vector<std::string> Logs(const std::string& dir) {
  std::vector<std::string> logs;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".vslog") logs.push_back(entry.path().string());
  }
  std::sort(logs.begin(), logs.end());
  return logs;
}

TEST_F(CollectorTest, NonRegularFilesAreSkippedAndNeverFollowed) {
  // A real log with a torn tail elsewhere, and a link to it in the data directory: following it
  // would load someone else's file and truncate it.
  TempDir elsewhere;
  {
    CollectorOptions options;
    options.data_dir = elsewhere.path();
    auto other = *Collector::Open(options);
    ASSERT_TRUE(other->Ingest(Batch(Key(40), 1, 4)).ok());
  }
  const std::string target = Logs(elsewhere.path()).at(0);
  WriteFile(target, ReadFile(target) + "torn");
  const uint64_t target_size = std::filesystem::file_size(target);
  std::filesystem::create_symlink(target, dir_.path() + "/link.vslog");
  std::filesystem::create_directory(dir_.path() + "/dir.vslog");

  LoadReport load;
  auto collector = Open(&load);
  EXPECT_EQ(load.files_loaded, 0);
  EXPECT_EQ(load.files_skipped, 2);
  EXPECT_THAT(load.warnings, ::testing::UnorderedElementsAre(
                                 HasSubstr("dir.vslog: not a regular file (a directory)"),
                                 HasSubstr("link.vslog: not a regular file (a symbolic link)")));
  EXPECT_EQ(std::filesystem::file_size(target), target_size);
  EXPECT_EQ(collector->ListProcesses(true).processes_size(), 0);
  LogScan scan;
  EXPECT_EQ(ReadLog(dir_.path() + "/link.vslog", nullptr, &scan).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CollectorTest, SparseCorruptTailIsSetAsideWithoutWritingItsHoles) {
  {
    auto collector = Open();
    for (uint64_t seq = 1; seq <= 3; ++seq) {
      ASSERT_TRUE(collector->Ingest(Batch(Key(41), seq, 4)).ok());
    }
  }
  const std::string log = OnlyLog();
  const uint64_t good = std::filesystem::file_size(log);
  constexpr uint64_t kSize = uint64_t{8} << 30;
  ASSERT_EQ(::truncate(log.c_str(), static_cast<off_t>(kSize)), 0);  // a hole: no disk used

  LoadReport load;
  auto collector = Open(&load);
  ASSERT_EQ(load.errors.size(), 1u) << ::testing::PrintToString(load.warnings);
  EXPECT_THAT(load.errors[0], HasSubstr("kept sparse"));
  EXPECT_EQ(collector->GetReport(Key(41))->events(), 12u);
  EXPECT_EQ(std::filesystem::file_size(log), good);
  const std::string aside = log + ".corrupt-" + std::to_string(good);
  EXPECT_EQ(std::filesystem::file_size(aside), kSize - good);
  EXPECT_LT(testing::DiskUsage(dir_.path()), uint64_t{1} << 20);
  EXPECT_EQ(*collector->Ingest(Batch(Key(41), 4, 4)), 4u);
}

TEST_F(CollectorTest, LargeCorruptTailAfterASmallPrefixKeepsTheWholeOriginalAside) {
  CollectorOptions options;
  options.max_aside_copy_bytes = 4096;
  {
    auto collector = Open(nullptr, options);
    for (uint64_t seq = 1; seq <= 2; ++seq) {
      ASSERT_TRUE(collector->Ingest(Batch(Key(42), seq, 4)).ok());
    }
  }
  const std::string log = OnlyLog();
  const std::string prefix = ReadFile(log);
  ASSERT_LT(prefix.size(), 4096u);
  // 64 KiB of dense garbage: its length field (0x5a5a5a5a) is over the record limit.
  const std::string original = prefix + std::string(64 << 10, '\x5a');
  WriteFile(log, original);

  LoadReport load;
  auto collector = Open(&load, options);
  ASSERT_EQ(load.errors.size(), 1u);
  EXPECT_THAT(load.errors[0], HasSubstr("exceeds the"));
  EXPECT_THAT(load.errors[0], HasSubstr("the whole original file"));
  EXPECT_EQ(ReadFile(log), prefix);
  EXPECT_EQ(ReadFile(log + ".corrupt-" + std::to_string(prefix.size())), original);
  // The new file is the log now: appends go there and survive a restart.
  EXPECT_EQ(*collector->Ingest(Batch(Key(42), 3, 4)), 3u);
  collector.reset();
  LoadReport again;
  collector = Open(&again, options);
  EXPECT_TRUE(again.errors.empty() && again.warnings.empty());
  EXPECT_EQ(collector->GetReport(Key(42))->events(), 12u);
  EXPECT_FALSE(std::filesystem::exists(log + ".recovering"));
}

TEST_F(CollectorTest, LargeCorruptTailAfterALargePrefixIsCopiedUpToTheCap) {
  CollectorOptions options;
  options.max_aside_copy_bytes = 4096;
  {
    auto collector = Open(nullptr, options);
    for (uint64_t seq = 1; seq <= 20; ++seq) {
      ASSERT_TRUE(collector->Ingest(Batch(Key(43), seq, 20)).ok());
    }
  }
  const std::string log = OnlyLog();
  const std::string prefix = ReadFile(log);
  ASSERT_GT(prefix.size(), 4096u);
  WriteFile(log, prefix + std::string(64 << 10, '\x5a'));

  LoadReport load;
  auto collector = Open(&load, options);
  ASSERT_EQ(load.errors.size(), 1u);
  EXPECT_THAT(load.errors[0], HasSubstr("were dropped"));
  EXPECT_EQ(ReadFile(log), prefix);
  EXPECT_EQ(ReadFile(log + ".corrupt-" + std::to_string(prefix.size())), std::string(4096, '\x5a'));
  EXPECT_EQ(collector->GetReport(Key(43))->events(), 400u);
}

TEST_F(CollectorTest, ProcessesAlikeInTheirFirst64HostBytesGetTheirOwnLogs) {
  // Same pid and start; hosts alike up to 64 bytes, or alike once sanitised, or hostile.
  std::vector<v1::ProcessKey> keys;
  for (int i = 0; i <= 100; ++i) keys.push_back(Key(77, std::string(64, 'h') + std::to_string(i)));
  for (std::string host :
       {std::string("../../escape"), std::string("a/b"), std::string(".."), std::string("."),
        std::string(""), std::string("nul\0byte", 8), std::string("nul\0bytf", 8),
        std::string("\x01\n\t\x7f"), std::string("h\xc3\xa9te"), std::string(255, '/')}) {
    keys.push_back(Key(77, host));
  }
  {
    auto collector = Open();
    for (const v1::ProcessKey& key : keys) {
      ASSERT_TRUE(collector->Ingest(Batch(key, 1, 4)).ok()) << key.ShortDebugString();
      ASSERT_TRUE(collector->Ingest(Batch(key, 2, 4)).ok()) << key.ShortDebugString();
    }
    // A host longer than any host name (255 bytes) is refused, not filed.
    const absl::Status huge =
        collector->Ingest(Batch(Key(77, std::string(10 << 20, 'h')), 1, 4)).status();
    EXPECT_EQ(huge.code(), absl::StatusCode::kInvalidArgument) << huge;
  }
  const std::vector<std::string> logs = Logs(dir_.path());
  ASSERT_EQ(logs.size(), keys.size());
  for (const std::string& log : logs) {
    const std::string name = std::filesystem::path(log).filename().string();
    EXPECT_LE(name.size(), 120u) << name;
    EXPECT_NE(name[0], '.') << name;
    for (char c : name) {
      EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')
          << name;
    }
  }
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(dir_.path()).parent_path() /
                                       "escape_77_1700000000000000077.vslog"));
  LoadReport load;
  auto collector = Open(&load);
  EXPECT_EQ(load.files_loaded, static_cast<int>(keys.size()));
  EXPECT_TRUE(load.errors.empty()) << ::testing::PrintToString(load.errors);
  for (const v1::ProcessKey& key : keys) {
    EXPECT_EQ(collector->GetReport(key)->events(), 8u) << key.ShortDebugString();
  }
}

TEST_F(CollectorTest, LogsNamedTheOldWayStillRecoverAndGrow) {
  // Before names carried a hash: <host>_<pid>_<start>.vslog, and -N on a clash.
  const std::vector<std::pair<v1::ProcessKey, std::string>> old = {
      {Key(50), "node1_50_1700000000000000050.vslog"},
      {Key(51), "node1_51_1700000000000000051-1.vslog"},
  };
  for (const auto& [key, name] : old) {
    WriteFile(dir_.path() + "/" + name, std::string(kLogMagic) +
                                            FrameRecord(Batch(key, 1, 4).SerializeAsString()) +
                                            FrameRecord(Batch(key, 2, 4).SerializeAsString()));
  }
  LoadReport load;
  auto collector = Open(&load);
  EXPECT_EQ(load.files_loaded, 2);
  const uint64_t before = std::filesystem::file_size(dir_.path() + "/" + old[0].second);
  EXPECT_EQ(*collector->Ingest(Batch(Key(50), 3, 4)), 3u);
  EXPECT_GT(std::filesystem::file_size(dir_.path() + "/" + old[0].second), before);
  EXPECT_EQ(Logs(dir_.path()).size(), 2u);
  EXPECT_EQ(collector->GetReport(Key(51))->events(), 8u);
}

TEST_F(CollectorTest, TakenLogNameFallsBackToAFreshOne) {
  std::string name;
  {
    TempDir elsewhere;
    CollectorOptions options;
    options.data_dir = elsewhere.path();
    auto other = *Collector::Open(options);
    ASSERT_TRUE(other->Ingest(Batch(Key(60), 1, 4)).ok());
    name = std::filesystem::path(Logs(elsewhere.path()).at(0)).filename().string();
  }
  WriteFile(dir_.path() + "/" + name, "squatter");
  {
    auto collector = Open();
    ASSERT_TRUE(collector->Ingest(Batch(Key(60), 1, 4)).ok());
  }
  EXPECT_EQ(ReadFile(dir_.path() + "/" + name), "squatter");
  ASSERT_EQ(Logs(dir_.path()).size(), 2u);
  LoadReport load;
  auto collector = Open(&load);
  EXPECT_EQ(load.files_loaded, 1);
  EXPECT_EQ(load.files_skipped, 1);  // the squatter, not a log
  EXPECT_EQ(collector->GetReport(Key(60))->events(), 4u);
}

TEST_F(CollectorTest, DataDirectoryAndLogsAreTheOwnersOnly) {
  CollectorOptions options;
  options.data_dir = dir_.path() + "/a/data";
  auto collector = *Collector::Open(options);
  ASSERT_TRUE(collector->Ingest(Batch(Key(61), 1, 4)).ok());
  struct stat st {};
  ASSERT_EQ(::stat(options.data_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  ASSERT_EQ(::stat(Logs(options.data_dir).at(0).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

}  // namespace
}  // namespace vramscope::collector
