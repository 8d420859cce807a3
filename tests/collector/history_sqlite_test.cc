// The run history in SQLite: the store contract (history_contract.h), a version-1 database
// migrated on open, the writer's on-disk queue while the database refuses and after a restart,
// and the collector turning a finished process into a row: its report built on the writer's thread
// (not the ingest thread), and rebuilt from its log at start when a crash came first or when the
// collector stopped while it was deferred.
#include <absl/synchronization/notification.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "history/history_schema.h"
#include "history/history_writer.h"
#include "history/sqlite_store.h"
#include "tests/collector/history_contract.h"
#include "tests/collector/test_util.h"
#include "vramscope/collector/collector.h"

#include <sqlite3.h>

namespace vramscope::collector {
namespace {

using testing::RunReport;
using testing::TempDir;

TEST(HistorySqlite, StoreContract) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<HistoryStore>> store = OpenSqliteStore(dir.path() + "/h.sqlite");
  ASSERT_TRUE(store.ok()) << store.status();
  testing::CheckStoreContract(**store);
}

// A database left by a version-1 collector (no passed column) is migrated when opened; its
// rows keep their data and gain the passed flag.
TEST(HistorySqlite, OldVersionIsMigrated) {
  TempDir dir;
  const std::string path = dir.path() + "/h.sqlite";
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  for (const std::string& sql : MigrationStatements(0, SqlDialect::kSqlite)) {
    ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sql;
  }
  v1::RunSummary summary;
  summary.mutable_process()->set_pid(42);
  const std::string blob = summary.SerializeAsString();
  sqlite3_stmt* insert = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db,
                               "INSERT INTO runs (host, pid, start_time_ns, end_time_ns, "
                               "exit_code, killed, signal, vanished, command_line, summary, "
                               "report) VALUES ('h', 42, 5, 6, 0, 0, 0, 0, 'x', ?, x'')",
                               -1, &insert, nullptr),
            SQLITE_OK);
  sqlite3_bind_blob(insert, 1, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  ASSERT_EQ(sqlite3_step(insert), SQLITE_DONE);
  sqlite3_finalize(insert);
  sqlite3_close(db);

  absl::StatusOr<std::unique_ptr<HistoryStore>> store = OpenSqliteStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(*(*store)->SchemaVersion(), kSchemaVersion);
  v1::ListRunsRequest passing;
  passing.set_passing_only(true);
  absl::StatusOr<v1::ListRunsResponse> runs = (*store)->List(passing);
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->runs_size(), 1);
  EXPECT_EQ(runs->runs(0).process().pid(), 42u);
}

// A store whose database can be switched off: Insert fails UNAVAILABLE meanwhile.
class SwitchableStore : public HistoryStore {
 public:
  explicit SwitchableStore(std::unique_ptr<HistoryStore> inner) : inner_(std::move(inner)) {}
  absl::Status InsertRow(const v1::RunSummary& run, absl::string_view report) override {
    if (!up) return absl::UnavailableError("down");
    return inner_->InsertRow(run, report);
  }
  absl::StatusOr<v1::ListRunsResponse> List(const v1::ListRunsRequest& r) override {
    return inner_->List(r);
  }
  absl::StatusOr<v1::Report> Get(int64_t id) override { return inner_->Get(id); }
  absl::StatusOr<int> SchemaVersion() override { return inner_->SchemaVersion(); }
  std::atomic<bool> up{true};

 private:
  std::unique_ptr<HistoryStore> inner_;
};

TEST(HistoryWriter, RowsWaitOnDiskWhileTheDatabaseIsDownAndSurviveARestart) {
  TempDir dir;
  const std::string db = dir.path() + "/h.sqlite";
  const HistoryWriterOptions options{.queue_dir = dir.path() + "/queue",
                                     .retry_min = absl::Milliseconds(5),
                                     .retry_max = absl::Milliseconds(20),
                                     .rebuild = {}};
  {
    auto store = std::make_unique<SwitchableStore>(*OpenSqliteStore(db));
    SwitchableStore* raw = store.get();
    raw->up = false;
    absl::StatusOr<std::unique_ptr<HistoryWriter>> writer =
        HistoryWriter::Start(options, std::move(store));
    ASSERT_TRUE(writer.ok()) << writer.status();
    for (uint32_t pid = 1; pid <= 3; ++pid) {
      ASSERT_TRUE((*writer)->Enqueue(RunReport(pid, pid * 1000, 0, 100, {})).ok());
    }
    EXPECT_FALSE((*writer)->WaitIdle(absl::Milliseconds(50)));
    EXPECT_EQ((*writer)->pending(), 3u);
    EXPECT_EQ(raw->List({})->runs_size(), 0);
    raw->up = true;  // the database is back: the rows go in, in order
    ASSERT_TRUE((*writer)->WaitIdle(absl::Seconds(30)));
    EXPECT_EQ(raw->List({})->runs_size(), 3);
    raw->up = false;
    ASSERT_TRUE((*writer)->Enqueue(RunReport(4, 4000, 0, 100, {})).ok());
    // The collector stops with the row still queued.
  }
  absl::StatusOr<std::unique_ptr<HistoryWriter>> again =
      HistoryWriter::Start(options, *OpenSqliteStore(db));
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->WaitIdle(absl::Seconds(30)));
  absl::StatusOr<v1::ListRunsResponse> runs = (*again)->store()->List({});
  ASSERT_EQ(runs->runs_size(), 4);
  EXPECT_EQ(runs->runs(0).process().pid(), 4u);
}

TEST(HistoryCollector, AFinishedProcessBecomesARowWithItsLabels) {
  TempDir dir;
  CollectorOptions options;
  options.data_dir = dir.path();
  options.database = "";  // SQLite in the data directory
  absl::StatusOr<std::unique_ptr<Collector>> collector = Collector::Open(options);
  ASSERT_TRUE(collector.ok()) << collector.status();
  const v1::ProcessKey key = testing::Key(77);
  v1::EventBatch first = testing::Batch(key, 1, 5);
  (*first.mutable_events(0)->mutable_process_start()->mutable_labels())["job"] = "train";
  ASSERT_TRUE((*collector)->Ingest(first).ok());
  ASSERT_TRUE((*collector)->Ingest(testing::ExitBatch(key, 2, 0)).ok());
  HistoryWriter* history = (*collector)->history();
  ASSERT_NE(history, nullptr);
  ASSERT_TRUE(history->WaitIdle(absl::Seconds(30)));
  absl::StatusOr<v1::ListRunsResponse> runs = history->store()->List({});
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->runs_size(), 1);
  EXPECT_EQ(runs->runs(0).process().pid(), 77u);
  EXPECT_EQ(runs->runs(0).labels().at("job"), "train");
  ASSERT_EQ(runs->runs(0).devices_size(), 1);
  EXPECT_EQ(runs->runs(0).devices(0).alloc_count(), 4u);
  absl::StatusOr<v1::Report> report = history->store()->Get(runs->runs(0).run_id());
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->labels().at("job"), "train");
  EXPECT_TRUE(report->finished());
}

// EnqueueBuild returns before the report is built: the writer's thread builds it (the ingest
// thread only appends a journal line), and the journal is emptied once every run is built.
TEST(HistoryWriter, EnqueueBuildBuildsOnTheWritersThread) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<HistoryWriter>> writer =
      HistoryWriter::Start({.queue_dir = dir.path() + "/queue", .rebuild = {}},
                           *OpenSqliteStore(dir.path() + "/h.sqlite"));
  ASSERT_TRUE(writer.ok()) << writer.status();
  absl::Notification release;
  std::thread::id built_on;
  int built_at_priority = 0;
  ASSERT_TRUE((*writer)
                  ->EnqueueBuild("/nowhere/run.vslog",
                                 [&] {
                                   release.WaitForNotification();
                                   built_on = std::this_thread::get_id();
                                   built_at_priority = getpriority(PRIO_PROCESS, gettid());
                                   return RunReport(5, 5000, 0, 100, {});
                                 })
                  .ok());
  // Here the report is not built yet (the builder waits for `release`): only the journal knows.
  EXPECT_EQ((*writer)->pending(), 1u);
  EXPECT_NE(testing::ReadFile(dir.path() + "/queue/journal").find("/nowhere/run.vslog"),
            std::string::npos);
  release.Notify();
  ASSERT_TRUE((*writer)->WaitIdle(absl::Seconds(30)));
  EXPECT_NE(built_on, std::this_thread::get_id());
  // At the lowest priority: history takes only the CPU ingest leaves.
  EXPECT_EQ(built_at_priority, 19);
  ASSERT_EQ((*writer)->store()->List({})->runs_size(), 1);
  EXPECT_EQ(testing::ReadFile(dir.path() + "/queue/journal"), "");
}

// A run whose report was not built when the collector stopped (its journal line and its log are
// all there is) becomes a row at the next start, rebuilt from the log.
TEST(HistoryCollector, AnUnbuiltRunIsRebuiltFromItsLogAtStart) {
  TempDir dir;
  CollectorOptions options;
  options.data_dir = dir.path();
  const v1::ProcessKey key = testing::Key(78);
  {
    absl::StatusOr<std::unique_ptr<Collector>> collector = Collector::Open(options);  // no history
    ASSERT_TRUE(collector.ok()) << collector.status();
    v1::EventBatch first = testing::Batch(key, 1, 5);
    (*first.mutable_events(0)->mutable_process_start()->mutable_labels())["job"] = "crash";
    ASSERT_TRUE((*collector)->Ingest(first).ok());
    ASSERT_TRUE((*collector)->Ingest(testing::ExitBatch(key, 2, 0)).ok());
  }
  std::string log;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    if (entry.path().extension() == ".vslog") log = entry.path().string();
  }
  ASSERT_FALSE(log.empty());
  std::filesystem::create_directory(dir.path() + "/history-queue");
  testing::WriteFile(dir.path() + "/history-queue/journal", "7 " + log + "\n");
  options.database = "";
  absl::StatusOr<std::unique_ptr<Collector>> collector = Collector::Open(options);
  ASSERT_TRUE(collector.ok()) << collector.status();
  HistoryWriter* history = (*collector)->history();
  ASSERT_TRUE(history->WaitIdle(absl::Seconds(30)));
  absl::StatusOr<v1::ListRunsResponse> runs = history->store()->List({});
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->runs_size(), 1);
  EXPECT_EQ(runs->runs(0).process().pid(), 78u);
  EXPECT_EQ(runs->runs(0).labels().at("job"), "crash");
  EXPECT_EQ(runs->runs(0).devices(0).alloc_count(), 4u);
}

// A run the collector defers (batches keep it busy: here a quiet period of an hour) is only in the
// journal; the collector stops; the next one builds it from its log and writes its row.
TEST(HistoryCollector, ADeferredRunSurvivesAStop) {
  TempDir dir;
  CollectorOptions options;
  options.data_dir = dir.path();
  options.database = "";
  const v1::ProcessKey key = testing::Key(79);
  {
    CollectorOptions busy = options;
    busy.history_quiet = absl::Hours(1);
    busy.history_max_defer = absl::Hours(1);
    absl::StatusOr<std::unique_ptr<Collector>> collector = Collector::Open(busy);
    ASSERT_TRUE(collector.ok()) << collector.status();
    ASSERT_TRUE((*collector)->Ingest(testing::Batch(key, 1, 5)).ok());
    ASSERT_TRUE((*collector)->Ingest(testing::ExitBatch(key, 2, 0)).ok());
    HistoryWriter* history = (*collector)->history();
    EXPECT_FALSE(history->WaitIdle(absl::Milliseconds(300)));  // deferred, not lost
    EXPECT_EQ(history->pending(), 1u);
    EXPECT_EQ(history->store()->List({})->runs_size(), 0);
  }
  absl::StatusOr<std::unique_ptr<Collector>> collector = Collector::Open(options);
  ASSERT_TRUE(collector.ok()) << collector.status();
  ASSERT_TRUE((*collector)->history()->WaitIdle(absl::Seconds(30)));
  absl::StatusOr<v1::ListRunsResponse> runs = (*collector)->history()->store()->List({});
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->runs_size(), 1);
  EXPECT_EQ(runs->runs(0).process().pid(), 79u);
}

}  // namespace
}  // namespace vramscope::collector
