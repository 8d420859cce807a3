// The collector core without gRPC: sequence de-duplication, the append-only logs, rebuilding
// after a restart, damaged data directories, and a full disk.
#include "vramscope/collector/collector.h"

#include <errno.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/collector/test_util.h"
#include "vramscope/collector/log.h"
#include "vramscope/collector/record_log.h"

namespace vramscope::collector {
namespace {

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

}  // namespace
}  // namespace vramscope::collector
