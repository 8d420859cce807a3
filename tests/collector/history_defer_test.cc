// The history writer's deferral and hand-off (collector/README.md "Run history"): while ingest
// stores batches the writer builds and writes nothing; it writes once ingest has been quiet for
// the quiet period, or anyway once the oldest run waited max_defer or more than max_waiting runs
// wait; a built run's row goes to the store without a queue file. The writer's clock and its
// activity signal (Collector::batches_stored in the collector) are the test's: time moves only when
// the test moves it, and the test waits for the writer to have read the signal (no sleeps).
#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <mutex>

#include "history/history_writer.h"
#include "history/sqlite_store.h"
#include "tests/collector/history_contract.h"
#include "tests/collector/test_util.h"

namespace vramscope::collector {
namespace {

using testing::RunReport;
using testing::TempDir;

// Ingest as the writer sees it: a count of stored batches, and a clock.
class FakeIngest {
 public:
  absl::Time Now() {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  uint64_t Activity() {
    std::lock_guard<std::mutex> lock(mu_);
    ++reads_;
    changed_.notify_all();
    return batches_;
  }
  // A batch stored `later` after the last one.
  void Batch(absl::Duration later) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += later;
    ++batches_;
  }
  void Advance(absl::Duration later) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += later;
  }
  // Returns once the writer has read the activity twice since the call: its first read was
  // after what the test set, and it has acted on it (built or not) before the second. False:
  // it did not within a minute (a writer that never asks).
  [[nodiscard]] bool WaitForWriter() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = reads_ + 2;
    return changed_.wait_for(lock, std::chrono::seconds(60), [&] { return reads_ >= target; });
  }
  HistoryWriterOptions Options(const std::string& queue_dir) {
    HistoryWriterOptions options{.queue_dir = queue_dir, .rebuild = {}};
    options.activity = [this] { return Activity(); };
    options.now = [this] { return Now(); };
    options.quiet = absl::Milliseconds(100);
    options.max_defer = absl::Seconds(10);
    options.poll = absl::Milliseconds(1);  // real time between reads: only the pace of the test
    return options;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
  uint64_t batches_ = 0;
  uint64_t reads_ = 0;
};

std::function<v1::Report()> Build(uint32_t pid) {
  return [pid] { return RunReport(pid, pid * 1000, 0, 100, {}); };
}

TEST(HistoryDefer, WaitsWhileBatchesArriveAndWritesOnceQuiet) {
  TempDir dir;
  FakeIngest ingest;
  absl::StatusOr<std::unique_ptr<HistoryWriter>> writer = HistoryWriter::Start(
      ingest.Options(dir.path() + "/queue"), *OpenSqliteStore(dir.path() + "/h.sqlite"));
  ASSERT_TRUE(writer.ok()) << writer.status();
  ingest.Batch(absl::ZeroDuration());  // the batch that ended the process
  ASSERT_TRUE((*writer)->EnqueueBuild("/nowhere/1.vslog", Build(1)).ok());
  // A batch every 50 ms for a second (fake time): never quiet for 100 ms, nothing written.
  for (int i = 0; i < 20; ++i) {
    ingest.Batch(absl::Milliseconds(50));
    ASSERT_TRUE(ingest.WaitForWriter());
    ASSERT_EQ((*writer)->written(), 0u) << "after " << (i + 1) * 50 << " ms of batches";
    ASSERT_EQ((*writer)->pending(), 1u);
  }
  // Quiet: 100 ms with no batch.
  ingest.Advance(absl::Milliseconds(100));
  ASSERT_TRUE((*writer)->WaitIdle(absl::Seconds(30)));
  const HistoryWriterStats stats = (*writer)->stats();
  EXPECT_EQ(stats.written, 1u);
  EXPECT_EQ(stats.deferred, 1u);
  EXPECT_EQ(stats.forced, 0u);
  EXPECT_EQ(stats.longest_deferral, absl::Milliseconds(1100));
  EXPECT_EQ((*writer)->store()->List({})->runs_size(), 1);
  EXPECT_EQ(testing::ReadFile(dir.path() + "/queue/journal"), "");
}

TEST(HistoryDefer, WritesAnywayOnceTheOldestRunWaitedMaxDefer) {
  TempDir dir;
  FakeIngest ingest;
  HistoryWriterOptions options = ingest.Options(dir.path() + "/queue");
  options.max_defer = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<HistoryWriter>> writer =
      HistoryWriter::Start(options, *OpenSqliteStore(dir.path() + "/h.sqlite"));
  ASSERT_TRUE(writer.ok()) << writer.status();
  ingest.Batch(absl::ZeroDuration());
  ASSERT_TRUE((*writer)->EnqueueBuild("/nowhere/1.vslog", Build(1)).ok());
  for (int i = 0; i < 19; ++i) {
    ingest.Batch(absl::Milliseconds(50));
    ASSERT_TRUE(ingest.WaitForWriter());
    ASSERT_EQ((*writer)->written(), 0u) << "after " << (i + 1) * 50 << " ms of batches";
  }
  // Batches still arrive, but the run has waited 1 s: it is written.
  ingest.Batch(absl::Milliseconds(50));
  ASSERT_TRUE((*writer)->WaitIdle(absl::Seconds(30)));
  const HistoryWriterStats stats = (*writer)->stats();
  EXPECT_EQ(stats.written, 1u);
  EXPECT_EQ(stats.deferred, 1u);
  EXPECT_EQ(stats.forced, 1u);
  EXPECT_EQ(stats.longest_deferral, absl::Seconds(1));
  EXPECT_EQ((*writer)->store()->List({})->runs_size(), 1);
}

TEST(HistoryDefer, WritesAnywayWhenMoreThanMaxWaitingRunsWait) {
  TempDir dir;
  FakeIngest ingest;
  HistoryWriterOptions options = ingest.Options(dir.path() + "/queue");
  options.max_waiting = 2;
  absl::StatusOr<std::unique_ptr<HistoryWriter>> writer =
      HistoryWriter::Start(options, *OpenSqliteStore(dir.path() + "/h.sqlite"));
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (uint32_t pid = 1; pid <= 2; ++pid) {
    ingest.Batch(absl::Milliseconds(10));
    ASSERT_TRUE((*writer)->EnqueueBuild("/nowhere/run.vslog", Build(pid)).ok());
  }
  ingest.Batch(absl::Milliseconds(10));
  ASSERT_TRUE(ingest.WaitForWriter());
  EXPECT_EQ((*writer)->written(), 0u);
  // A third waiting run (more than two engines held): the oldest is built and written, ingest
  // busy.
  ingest.Batch(absl::Milliseconds(10));
  ASSERT_TRUE((*writer)->EnqueueBuild("/nowhere/run.vslog", Build(3)).ok());
  ASSERT_TRUE(ingest.WaitForWriter());
  EXPECT_EQ((*writer)->written(), 1u);
  EXPECT_EQ((*writer)->pending(), 2u);
  EXPECT_EQ((*writer)->stats().forced, 1u);
  ingest.Advance(absl::Milliseconds(100));
  ASSERT_TRUE((*writer)->WaitIdle(absl::Seconds(30)));
  EXPECT_EQ((*writer)->stats().written, 3u);
}

// Records, for each row inserted, whether a queue file existed then.
class FileWatchingStore : public HistoryStore {
 public:
  FileWatchingStore(std::unique_ptr<HistoryStore> inner, std::string queue_dir)
      : inner_(std::move(inner)), queue_dir_(std::move(queue_dir)) {}
  absl::Status InsertRow(const v1::RunSummary& run, absl::string_view report) override {
    for (const auto& entry : std::filesystem::directory_iterator(queue_dir_)) {
      if (entry.path().extension() == ".run") ++rows_with_a_file;
    }
    return inner_->InsertRow(run, report);
  }
  absl::StatusOr<v1::ListRunsResponse> List(const v1::ListRunsRequest& r) override {
    return inner_->List(r);
  }
  absl::StatusOr<v1::Report> Get(int64_t id) override { return inner_->Get(id); }
  absl::StatusOr<int> SchemaVersion() override { return inner_->SchemaVersion(); }
  std::atomic<int> rows_with_a_file{0};

 private:
  std::unique_ptr<HistoryStore> inner_;
  const std::string queue_dir_;
};

// A freshly built run goes to the store as built: no queue file written and read back.
TEST(HistoryDefer, ABuiltRunGoesToTheStoreWithoutAQueueFile) {
  TempDir dir;
  const std::string queue = dir.path() + "/queue";
  auto store =
      std::make_unique<FileWatchingStore>(*OpenSqliteStore(dir.path() + "/h.sqlite"), queue);
  FileWatchingStore* raw = store.get();
  absl::StatusOr<std::unique_ptr<HistoryWriter>> writer =
      HistoryWriter::Start({.queue_dir = queue, .rebuild = {}}, std::move(store));
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (uint32_t pid = 1; pid <= 3; ++pid) {
    ASSERT_TRUE((*writer)->EnqueueBuild("/nowhere/run.vslog", Build(pid)).ok());
  }
  ASSERT_TRUE((*writer)->WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(raw->rows_with_a_file, 0);
  absl::StatusOr<v1::ListRunsResponse> runs = raw->List({});
  ASSERT_EQ(runs->runs_size(), 3);
  absl::StatusOr<v1::Report> report = raw->Get(runs->runs(0).run_id());
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->SerializeAsString(),
            Build(runs->runs(0).process().pid())().SerializeAsString());
}

}  // namespace
}  // namespace vramscope::collector
