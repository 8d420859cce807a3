// The Prometheus exposition (collector/metrics.cc) over a collector core fed synthetic batches:
// values equal the reports', run labels renamed and escaped, host sums, retention of finished
// processes, a reused pid, and `promtool check metrics` on the text.
#include "vramscope/collector/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>
#include <stdio.h>
#include <sys/wait.h>

#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "tests/collector/test_util.h"
#include "vramscope/log.h"

namespace vramscope::collector {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::vramscope::testing::Batch;
using ::vramscope::testing::Env;
using ::vramscope::testing::ExitBatch;
using ::vramscope::testing::Key;
using ::vramscope::testing::TempDir;
using ::vramscope::testing::WriteFile;

// A first batch: the start (with `labels`) and `allocs` allocations of 500 bytes on `device`.
v1::EventBatch StartBatch(const v1::ProcessKey& key, std::map<std::string, std::string> labels,
                          int allocs = 2, uint32_t device = 0) {
  v1::EventBatch batch = Batch(key, 1, allocs + 1);
  v1::ProcessStartEvent* start = batch.mutable_events(0)->mutable_process_start();
  start->set_command_line(0, "/opt/jobs/train.py");
  for (const auto& [name, value] : labels) (*start->mutable_labels())[name] = value;
  for (int i = 1; i < batch.events_size(); ++i) batch.mutable_events(i)->set_device(device);
  batch.mutable_counters(0)->set_device(device);
  return batch;
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetMinLogLevel(LogLevel::kError);
    CollectorOptions options;
    options.data_dir = dir_.path();
    absl::StatusOr<std::unique_ptr<Collector>> collector = Collector::Open(options);
    ASSERT_TRUE(collector.ok()) << collector.status();
    collector_ = std::move(*collector);
    MetricsOptions metrics_options;
    metrics_options.retention = absl::Seconds(60);
    metrics_options.now_ns = [this] { return now_ns_.load(); };
    metrics_ = std::make_unique<CollectorMetrics>(collector_.get(), metrics_options);
  }

  void Ingest(const v1::EventBatch& batch) {
    absl::StatusOr<uint64_t> acked = collector_->Ingest(batch);
    ASSERT_TRUE(acked.ok()) << acked.status();
  }

  // The samples of family `name` whose labels include every one of `want`, as label maps.
  std::vector<std::pair<std::map<std::string, std::string>, double>> Samples(
      const std::string& name, const std::map<std::string, std::string>& want = {}) const {
    std::vector<std::pair<std::map<std::string, std::string>, double>> out;
    for (const prometheus::MetricFamily& family : metrics_->Collect()) {
      if (family.name != name) continue;
      for (const prometheus::ClientMetric& metric : family.metric) {
        std::map<std::string, std::string> labels;
        for (const auto& label : metric.label) labels[label.name] = label.value;
        bool match = true;
        for (const auto& [k, v] : want) match = match && labels.count(k) && labels[k] == v;
        const double value = family.type == prometheus::MetricType::Counter ? metric.counter.value
                                                                            : metric.gauge.value;
        if (match) out.emplace_back(labels, value);
      }
    }
    return out;
  }

  double Value(const std::string& name, const std::map<std::string, std::string>& want) const {
    auto samples = Samples(name, want);
    EXPECT_EQ(samples.size(), 1u) << name;
    return samples.empty() ? -1 : samples[0].second;
  }

  // What the collector serves.
  std::string Text() const { return metrics_->Render(); }

  TempDir dir_;
  std::unique_ptr<Collector> collector_;
  std::unique_ptr<CollectorMetrics> metrics_;
  std::atomic<uint64_t> now_ns_{1800000000000000000ull};
};

TEST_F(MetricsTest, ProcessFiguresAreTheReportsFigures) {
  const v1::ProcessKey key = Key(42);
  Ingest(StartBatch(key, {{"job", "nightly"}}, 5, 3));
  v1::EventBatch second = Batch(key, 2, 3, 0x900000);
  for (v1::Event& event : *second.mutable_events()) event.set_device(3);
  second.mutable_counters(0)->set_device(3);
  v1::Event* oom = second.add_events();
  oom->set_device(3);
  oom->mutable_oom()->set_requested_bytes(1 << 30);
  Ingest(second);
  absl::StatusOr<v1::Report> report = collector_->GetReport(key);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->devices_size(), 1);
  const v1::DeviceReport& d = report->devices(0);
  EXPECT_EQ(report->labels().at("job"), "nightly");

  const std::map<std::string, std::string> labels = {{"host", "node1"},
                                                     {"pid", "42"},
                                                     {"device", "3"},
                                                     {"comm", "train.py"},
                                                     {"label_job", "nightly"}};
  EXPECT_EQ(Value("vramscope_process_requested_bytes", labels), d.current_requested_bytes());
  EXPECT_EQ(Value("vramscope_process_peak_requested_bytes", labels), d.peak_requested_bytes());
  EXPECT_EQ(Value("vramscope_process_allocated_bytes", labels), d.current_allocated_bytes());
  EXPECT_EQ(Value("vramscope_process_peak_allocated_bytes", labels), d.peak_allocated_bytes());
  EXPECT_EQ(Value("vramscope_process_reserved_bytes", labels), d.current_reserved_bytes());
  EXPECT_EQ(Value("vramscope_process_peak_reserved_bytes", labels), d.peak_reserved_bytes());
  EXPECT_EQ(d.peak_reserved_bytes(), 2u << 20);  // the ring counters' peak
  EXPECT_EQ(Value("vramscope_process_allocations_total", labels), 8);
  EXPECT_EQ(Value("vramscope_process_frees_total", labels), 0);
  EXPECT_EQ(Value("vramscope_process_ooms_total", labels), 1);
  EXPECT_EQ(Value("vramscope_process_dropped_events_total", labels), 0);
  EXPECT_EQ(Value("vramscope_process_finished", {{"pid", "42"}}), 0);
  // No CUPTI records: no CUPTI samples.
  EXPECT_TRUE(Samples("vramscope_process_cupti_device_bytes").empty());

  EXPECT_EQ(Value("vramscope_collector_batches_ingested_total", {}), 2);
  EXPECT_EQ(Value("vramscope_collector_events_ingested_total", {}), 10);
  EXPECT_EQ(Value("vramscope_collector_stored_bytes", {}), collector_->disk_bytes());
  EXPECT_EQ(Value("vramscope_collector_processes", {{"state", "live"}}), 1);

  // The same labels reach ListProcesses and Watch.
  EXPECT_EQ(collector_->ListProcesses(false).processes(0).labels().at("job"), "nightly");
  EXPECT_EQ(collector_->Snapshot({}).processes(0).labels().at("job"), "nightly");
}

TEST_F(MetricsTest, RunLabelsAreRenamedAndTheirValuesEscaped) {
  EXPECT_EQ(RunLabelName("job"), "label_job");
  EXPECT_EQ(RunLabelName("git.commit-id"), "label_git_commit_id");
  EXPECT_EQ(RunLabelName("host"), "label_host");
  EXPECT_EQ(RunLabelName("9lives\xC3\xA9"), "label_9lives__");
  // "a-b" and "a.b" rename alike: the first by name is kept, so no sample has a label twice.
  Ingest(StartBatch(Key(7), {{"note", "say \"hi\"\nback\\slash \xE2\x9C\x93 gr\xC3\xBC\xC3\x9F"},
                             {"host", "not the host"},
                             {"a-b", "first"},
                             {"a.b", "second"}}));
  const std::string text = Text();
  EXPECT_THAT(
      text,
      HasSubstr("label_note=\"say \\\"hi\\\"\\nback\\\\slash \xE2\x9C\x93 gr\xC3\xBC\xC3\x9F\""));
  EXPECT_THAT(text, HasSubstr("host=\"node1\""));
  EXPECT_THAT(text, HasSubstr("label_host=\"not the host\""));
  EXPECT_THAT(text, HasSubstr("label_a_b=\"first\""));
  EXPECT_THAT(text, Not(HasSubstr("\"second\"")));
}

TEST_F(MetricsTest, HostSumsAddTheLiveProcessesPerDevice) {
  Ingest(StartBatch(Key(1), {}, 2, 0));
  Ingest(StartBatch(Key(2), {}, 3, 0));
  Ingest(StartBatch(Key(3), {}, 4, 1));
  Ingest(StartBatch(Key(4, "node2"), {}, 5, 0));
  Ingest(StartBatch(Key(5), {}, 7, 0));
  Ingest(ExitBatch(Key(5), 2, 0));  // finished: not in the sums
  EXPECT_EQ(Value("vramscope_host_requested_bytes", {{"host", "node1"}, {"device", "0"}}), 5 * 500);
  EXPECT_EQ(Value("vramscope_host_allocated_bytes", {{"host", "node1"}, {"device", "0"}}), 5 * 512);
  EXPECT_EQ(Value("vramscope_host_processes", {{"host", "node1"}, {"device", "0"}}), 2);
  EXPECT_EQ(Value("vramscope_host_requested_bytes", {{"host", "node1"}, {"device", "1"}}), 4 * 500);
  EXPECT_EQ(Value("vramscope_host_requested_bytes", {{"host", "node2"}, {"device", "0"}}), 5 * 500);
  EXPECT_EQ(Value("vramscope_collector_processes", {{"state", "finished"}}), 1);
}

TEST_F(MetricsTest, AFinishedProcessLeavesAfterTheRetention) {
  Ingest(StartBatch(Key(9), {}));
  Ingest(ExitBatch(Key(9), 2, 0));
  // The exit was stored at the real wall clock; the scrape clock is set from there.
  const uint64_t stored = collector_->Metrics(0).processes.at(0).finished_wall_ns;
  ASSERT_GT(stored, 0u);
  now_ns_ = stored + absl::ToInt64Nanoseconds(absl::Seconds(59));
  EXPECT_EQ(Value("vramscope_process_finished", {{"pid", "9"}}), 1);
  EXPECT_EQ(Samples("vramscope_process_reserved_bytes", {{"pid", "9"}}).size(), 1u);
  now_ns_ = stored + absl::ToInt64Nanoseconds(absl::Seconds(61));
  EXPECT_TRUE(Samples("vramscope_process_finished", {{"pid", "9"}}).empty());
  EXPECT_TRUE(Samples("vramscope_process_reserved_bytes", {{"pid", "9"}}).empty());
  // Still tracked (its report is there), only not exposed.
  EXPECT_EQ(Value("vramscope_collector_processes", {{"state", "finished"}}), 1);
  EXPECT_TRUE(collector_->GetReport(Key(9)).ok());
}

TEST_F(MetricsTest, AReusedPidShowsTheNewestProcessOnly) {
  v1::ProcessKey old_key = Key(11);
  v1::ProcessKey new_key = Key(11);
  new_key.set_start_time_ns(old_key.start_time_ns() + 1000);
  Ingest(StartBatch(old_key, {}, 2));
  Ingest(ExitBatch(old_key, 2, 0));
  Ingest(StartBatch(new_key, {}, 6));
  EXPECT_EQ(Value("vramscope_process_requested_bytes", {{"pid", "11"}}), 6 * 500);
  EXPECT_EQ(Value("vramscope_process_finished", {{"pid", "11"}}), 0);
}

TEST_F(MetricsTest, IngestLagIsAHistogramOfStoredBatches) {
  Ingest(StartBatch(Key(5), {}));  // events of 2023 (Key's start time): a long lag
  const std::string text = Text();
  EXPECT_THAT(text, HasSubstr("vramscope_collector_ingest_lag_seconds_count 1"));
  EXPECT_THAT(text, HasSubstr("vramscope_collector_ingest_lag_seconds_bucket{le=\"60\"} 0"));
  EXPECT_THAT(text, HasSubstr("vramscope_collector_ingest_lag_seconds_bucket{le=\"+Inf\"} 1"));
}

TEST_F(MetricsTest, PromtoolAcceptsTheExposition) {
  const std::string promtool = Env("VRAMSCOPE_PROMTOOL");
  ASSERT_FALSE(promtool.empty()) << "VRAMSCOPE_PROMTOOL is not set (meson sets it)";
  Ingest(StartBatch(Key(1), {{"job", "a \"b\"\nc \xE2\x9C\x93"}, {"x.y", "1"}}, 3, 0));
  Ingest(StartBatch(Key(2, "node2"), {}, 3, 2));
  Ingest(ExitBatch(Key(2, "node2"), 2, 1));
  const std::string path = dir_.path() + "/exposition.txt";
  WriteFile(path, Text());
  const std::string command = promtool + " check metrics < " + path + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  const int status = ::pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_EQ(output, "") << output;
}

TEST_F(MetricsTest, TheServedTextIsWhatPrometheusCppWouldWrite) {
  Ingest(StartBatch(Key(1), {{"job", "a \"b\"\nc \\ \xE2\x9C\x93"}, {"x.y", "1"}}, 3, 0));
  Ingest(StartBatch(Key(2, "node\"2\n"), {}, 3, 2));
  v1::EventBatch more = Batch(Key(2, "node\"2\n"), 2, 2, 0x800000);
  v1::Event* cupti = more.add_events();
  cupti->set_device(2);
  cupti->mutable_cupti_memory()->set_operation(v1::CuptiMemoryEvent::OPERATION_ALLOCATION);
  cupti->mutable_cupti_memory()->set_address(0x5000);
  cupti->mutable_cupti_memory()->set_bytes(3 << 20);
  cupti->mutable_cupti_memory()->set_memory_kind(3);  // device
  v1::Event* pool = more.add_events();
  pool->set_device(2);
  pool->mutable_pool_state()->set_free_bytes(3000);
  pool->mutable_pool_state()->set_largest_free_block_bytes(1000);  // fragmentation 2/3
  more.mutable_counters(0)->set_device(2);
  Ingest(more);
  Ingest(StartBatch(Key(3), {}, 1, 1));
  Ingest(ExitBatch(Key(3), 2, 0));
  const std::string text = Text();
  EXPECT_EQ(text, prometheus::TextSerializer().Serialize(metrics_->Collect()));
  EXPECT_THAT(text, HasSubstr("vramscope_process_cupti_device_bytes{"));
  EXPECT_THAT(text, HasSubstr("} 0.6666666666666667\n"));
  EXPECT_THAT(text, HasSubstr("host=\"node\\\"2\\n\""));
}

TEST(MetricsListenTest, BarePortsAreLoopback) {
  EXPECT_EQ(*MetricsListenAddress("9400"), "127.0.0.1:9400");
  EXPECT_EQ(*MetricsListenAddress(":9400"), "127.0.0.1:9400");
  EXPECT_EQ(*MetricsListenAddress("0.0.0.0:9400"), "0.0.0.0:9400");
  EXPECT_EQ(*MetricsListenAddress("[::1]:0"), "[::1]:0");
  EXPECT_FALSE(MetricsListenAddress("host:").ok());
  EXPECT_FALSE(MetricsListenAddress("host:70000").ok());
  EXPECT_FALSE(MetricsListenAddress("").ok());
  EXPECT_FALSE(MetricsListenAddress("x").ok());
}

}  // namespace
}  // namespace vramscope::collector
