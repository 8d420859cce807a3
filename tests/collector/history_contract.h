// What every history store must do (history_store.h), run against SQLite
// (history_sqlite_test) and a real PostgreSQL server (history_postgres_test): rows round-trip,
// label filters, passing runs, since, idempotent inserts, hostile label values stay data.
#ifndef VRAMSCOPE_TESTS_COLLECTOR_HISTORY_CONTRACT_H_
#define VRAMSCOPE_TESTS_COLLECTOR_HISTORY_CONTRACT_H_

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "history/history_store.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::testing {

// A finished run's report: pid, start (ns), exit code, peak reserved on device 0, labels.
inline v1::Report RunReport(uint32_t pid, uint64_t start_ns, int exit_code, uint64_t peak,
                            const std::map<std::string, std::string>& labels) {
  v1::Report report;
  report.mutable_process()->set_host("node1");
  report.mutable_process()->set_pid(pid);
  report.mutable_process()->set_start_time_ns(start_ns);
  report.set_start_time_ns(start_ns);
  report.set_end_time_ns(start_ns + 1000);
  report.set_finished(true);
  report.set_exit_code(exit_code);
  report.add_command_line("./train");
  report.add_command_line("--steps=3");
  for (const auto& [key, value] : labels) (*report.mutable_labels())[key] = value;
  v1::DeviceReport* device = report.add_devices();
  device->mutable_device()->set_ordinal(0);
  device->set_peak_requested_bytes(peak / 2);
  device->set_peak_allocated_bytes(peak / 2 + 512);
  device->set_peak_reserved_bytes(peak);
  device->mutable_fragmentation_at_peak()->set_external_fragmentation(0.25);
  device->set_alloc_count(7);
  device->add_ooms()->set_requested_bytes(1);
  device->mutable_cupti()->set_peak_bytes(peak + 4096);
  return report;
}

inline v1::ListRunsRequest ByLabels(const std::map<std::string, std::string>& labels) {
  v1::ListRunsRequest request;
  for (const auto& [key, value] : labels) (*request.mutable_labels())[key] = value;
  return request;
}

inline void CheckStoreContract(collector::HistoryStore& store) {
  // A value with quotes, a newline, UTF-8 and SQL in it is data, never SQL.
  const std::string hostile = "it's \"x\"\n'); DROP TABLE runs; -- \xc3\xa9";
  ASSERT_TRUE(store.Insert(RunReport(1, 1000, 0, 100, {{"job", "a"}, {"note", hostile}})).ok());
  ASSERT_TRUE(store.Insert(RunReport(2, 2000, 1, 200, {{"job", "a"}})).ok());
  ASSERT_TRUE(store.Insert(RunReport(3, 3000, 0, 300, {{"job", "b"}})).ok());
  // The same run again (a retried write) stores nothing new.
  ASSERT_TRUE(store.Insert(RunReport(1, 1000, 0, 100, {{"job", "a"}, {"note", hostile}})).ok());

  absl::StatusOr<v1::ListRunsResponse> all = store.List({});
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->runs_size(), 3);
  EXPECT_EQ(all->runs(0).process().pid(), 3u);  // most recent first
  const v1::RunSummary& first = all->runs(2);
  EXPECT_EQ(first.labels().at("note"), hostile);
  EXPECT_EQ(first.command_line_size(), 2);
  ASSERT_EQ(first.devices_size(), 1);
  EXPECT_EQ(first.devices(0).peak_reserved_bytes(), 100u);
  EXPECT_EQ(first.devices(0).peak_requested_bytes(), 50u);
  EXPECT_EQ(first.devices(0).fragmentation_at_peak(), 0.25);
  EXPECT_EQ(first.devices(0).oom_count(), 1u);
  EXPECT_EQ(first.devices(0).cupti_peak_bytes(), 100u + 4096);

  absl::StatusOr<v1::ListRunsResponse> job_a = store.List(ByLabels({{"job", "a"}}));
  ASSERT_TRUE(job_a.ok());
  EXPECT_EQ(job_a->runs_size(), 2);
  absl::StatusOr<v1::ListRunsResponse> by_note = store.List(ByLabels({{"note", hostile}}));
  ASSERT_TRUE(by_note.ok());
  ASSERT_EQ(by_note->runs_size(), 1);
  EXPECT_EQ(by_note->runs(0).process().pid(), 1u);
  v1::ListRunsRequest passing = ByLabels({{"job", "a"}});
  passing.set_passing_only(true);
  absl::StatusOr<v1::ListRunsResponse> passed = store.List(passing);
  ASSERT_TRUE(passed.ok());
  ASSERT_EQ(passed->runs_size(), 1);
  EXPECT_EQ(passed->runs(0).process().pid(), 1u);
  v1::ListRunsRequest since;
  since.set_since_time_ns(2000);
  since.set_limit(1);
  absl::StatusOr<v1::ListRunsResponse> recent = store.List(since);
  ASSERT_TRUE(recent.ok());
  ASSERT_EQ(recent->runs_size(), 1);
  EXPECT_EQ(recent->runs(0).process().pid(), 3u);

  absl::StatusOr<v1::Report> report = store.Get(first.run_id());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->labels().at("note"), hostile);
  EXPECT_EQ(report->devices(0).alloc_count(), 7u);
  EXPECT_EQ(store.Get(999999).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<int> version = store.SchemaVersion();
  ASSERT_TRUE(version.ok());
  EXPECT_EQ(*version, 2);
  // The hostile value did not drop anything.
  EXPECT_EQ(store.List({})->runs_size(), 3);
}

}  // namespace vramscope::testing

#endif  // VRAMSCOPE_TESTS_COLLECTOR_HISTORY_CONTRACT_H_
