// The run history in a real PostgreSQL server (postgres_server.h): the store contract, and a
// server stopped while processes finish and started again: no run is lost.
#include <gtest/gtest.h>

#include "history/history_writer.h"
#include "history/postgres_store.h"
#include "tests/collector/history_contract.h"
#include "tests/collector/postgres_server.h"
#include "tests/collector/test_util.h"
#include "vramscope/collector/collector.h"

namespace vramscope::collector {
namespace {

class HistoryPostgres : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = server_.Init();
    // Without the Debian package (or a user to run it as) there is nothing to test against.
    if (!why.empty()) GTEST_SKIP() << "NO POSTGRESQL SERVER, SKIPPED: " << why;
    ASSERT_TRUE(server_.Start()) << server_.Log();
  }
  testing::PostgresServer server_;
};

TEST_F(HistoryPostgres, StoreContract) {
  absl::StatusOr<std::unique_ptr<HistoryStore>> store = OpenPostgresStore(server_.Uri());
  ASSERT_TRUE(store.ok());
  testing::CheckStoreContract(**store);
}

// Finishes process `pid` at the collector (start batch with a label, then its exit).
void FinishProcess(Collector& collector, uint32_t pid) {
  const v1::ProcessKey key = testing::Key(pid);
  v1::EventBatch first = testing::Batch(key, 1, 3);
  (*first.mutable_events(0)->mutable_process_start()->mutable_labels())["job"] = "pg";
  ASSERT_TRUE(collector.Ingest(first).ok());
  ASSERT_TRUE(collector.Ingest(testing::ExitBatch(key, 2, 0)).ok());
}

TEST_F(HistoryPostgres, ServerStoppedMidRunLosesNoRun) {
  testing::TempDir data;
  CollectorOptions options;
  options.data_dir = data.path();
  options.database = server_.Uri();
  options.history_retry_max = absl::Milliseconds(50);
  absl::StatusOr<std::unique_ptr<Collector>> collector = Collector::Open(options);
  ASSERT_TRUE(collector.ok()) << collector.status();
  HistoryWriter* history = (*collector)->history();
  FinishProcess(**collector, 1);
  ASSERT_TRUE(history->WaitIdle(absl::Seconds(60)));
  // Process 2 is running when the server goes away; it and process 3 finish during the outage.
  const v1::ProcessKey running = testing::Key(2);
  ASSERT_TRUE((*collector)->Ingest(testing::Batch(running, 1, 3)).ok());
  ASSERT_TRUE(server_.Stop()) << server_.Log();
  ASSERT_TRUE((*collector)->Ingest(testing::ExitBatch(running, 2, 0)).ok());
  FinishProcess(**collector, 3);
  EXPECT_EQ(history->pending(), 2u);  // the rows wait on disk; ingest went on
  EXPECT_FALSE(history->store()->List({}).ok());
  ASSERT_TRUE(server_.Start()) << server_.Log();
  ASSERT_TRUE(history->WaitIdle(absl::Seconds(60)));
  absl::StatusOr<v1::ListRunsResponse> runs = history->store()->List({});
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->runs_size(), 3);
  EXPECT_EQ(runs->runs(0).process().pid(), 3u);
  EXPECT_EQ(runs->runs(1).process().pid(), 2u);
  EXPECT_EQ(runs->runs(2).process().pid(), 1u);
  EXPECT_EQ(runs->runs(0).labels().at("job"), "pg");
}

}  // namespace
}  // namespace vramscope::collector
