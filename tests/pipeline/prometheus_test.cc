// The metrics end to end: vramscope-collector --metrics-listen, scraped every second by a real
// Prometheus server (Debian's /usr/bin/prometheus, a generated config, loopback only), while
// traced programs stream to the collector through `vramscope run --collector` (run_fake_app
// writes its ring as the shim does). Values are read back through Prometheus's query API:
// live peaks and host sums, a program's peak in the first sample scraped at most one scrape
// interval (plus the ingest allowance) after the program recorded it (raw samples, `[1m]`), a
// killed program's figures equal to the collector's report, its series gone once
// --metrics-retention passed; every query of the Grafana dashboard evaluates; `promtool check
// metrics` accepts the collector's /metrics as served.
#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_replace.h>
#include <absl/strings/str_split.h>
#include <absl/time/clock.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <google/protobuf/struct.pb.h>

#include "tests/collector/test_util.h"
#include "tests/pipeline/http_get.h"
#include "tests/pipeline/subprocess.h"
#include "vramscope/v1/collector.grpc.pb.h"

namespace vramscope::testing {
namespace {

using google::protobuf::Value;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// One series of a query's answer: its labels and value.
struct Sample {
  std::map<std::string, std::string> labels;
  double value = 0;
};

// The port written to `path` by a daemon, once it exists (0 after `timeout`).
int WaitForPortFile(const std::string& path, absl::Duration timeout = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + timeout;
  int port = 0;
  while (absl::Now() < deadline) {
    std::string text = ReadFile(path);
    if (!text.empty() && absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port)) return port;
    absl::SleepFor(absl::Milliseconds(20));  // polling for the file
  }
  return 0;
}

class PrometheusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* variable :
         {"VRAMSCOPE_COLLECTOR", "VRAMSCOPE_CLI", "VRAMSCOPE_FAKE_APP", "VRAMSCOPE_SHIM",
          "VRAMSCOPE_PROMETHEUS", "VRAMSCOPE_PROMTOOL", "VRAMSCOPE_DASHBOARD"}) {
      ASSERT_FALSE(Env(variable).empty()) << variable << " is not set (meson sets it)";
    }
    ASSERT_TRUE(collector_.Start(
        {Env("VRAMSCOPE_COLLECTOR"), "--listen=127.0.0.1:0", "--data-dir=" + dir_.path() + "/data",
         "--port-file=" + dir_.path() + "/grpc.port", "--metrics-listen=127.0.0.1:0",
         "--metrics-retention=3s", "--metrics-port-file=" + dir_.path() + "/metrics.port"}));
    grpc_port_ = WaitForPortFile(dir_.path() + "/grpc.port");
    metrics_port_ = WaitForPortFile(dir_.path() + "/metrics.port");
    ASSERT_GT(grpc_port_, 0) << collector_.output();
    ASSERT_GT(metrics_port_, 0) << collector_.output();
    StartPrometheus();
  }

  // Prometheus takes a port but does not say which it bound: a free one is picked, and another
  // if something took it in between.
  void StartPrometheus() {
    WriteFile(dir_.path() + "/prometheus.yml",
              absl::StrCat("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                           "scrape_configs:\n  - job_name: vramscope\n    static_configs:\n"
                           "      - targets: ['127.0.0.1:",
                           metrics_port_, "']\n"));
    for (int attempt = 0; attempt < 5; ++attempt) {
      prometheus_port_ = FreeLoopbackPort();
      prometheus_ = std::make_unique<Subprocess>();
      ASSERT_TRUE(prometheus_->Start(
          {Env("VRAMSCOPE_PROMETHEUS"), "--config.file=" + dir_.path() + "/prometheus.yml",
           "--storage.tsdb.path=" + dir_.path() + "/tsdb",
           absl::StrCat("--web.listen-address=127.0.0.1:", prometheus_port_), "--log.level=warn"}));
      const absl::Time deadline = absl::Now() + absl::Seconds(60);
      while (absl::Now() < deadline) {
        if (HttpGet(prometheus_port_, "/-/ready").status == 200) return;
        if (prometheus_->output().find("level=error") != std::string::npos) break;
        absl::SleepFor(absl::Milliseconds(50));  // polling for readiness
      }
      prometheus_.reset();  // killed: try another port
    }
    FAIL() << "Prometheus did not start";
  }

  // An instant query's series ("status" must be "success").
  std::vector<Sample> Query(const std::string& promql) {
    const HttpResponse response =
        HttpGet(prometheus_port_, "/api/v1/query?query=" + UrlEncode(promql));
    Value answer;
    if (response.status != 200 ||
        !google::protobuf::util::JsonStringToMessage(response.body, &answer).ok()) {
      ADD_FAILURE() << promql << ": HTTP " << response.status << " " << response.body;
      return {};
    }
    const auto& fields = answer.struct_value().fields();
    EXPECT_EQ(fields.at("status").string_value(), "success") << promql << ": " << response.body;
    std::vector<Sample> samples;
    const Value& data = fields.at("data");
    for (const Value& series : data.struct_value().fields().at("result").list_value().values()) {
      const auto& s = series.struct_value().fields();
      Sample& sample = samples.emplace_back();
      for (const auto& [name, value] : s.at("metric").struct_value().fields()) {
        sample.labels[name] = value.string_value();
      }
      const std::string& text = s.at("value").list_value().values(1).string_value();
      EXPECT_TRUE(absl::SimpleAtod(text, &sample.value)) << text;
    }
    return samples;
  }

  // The raw samples of a range selector (`metric{...}[1m]`) of one series: (scrape time in s,
  // value), oldest first; empty unless exactly one series answers.
  std::vector<std::pair<double, double>> RawSamples(const std::string& selector) {
    const HttpResponse response =
        HttpGet(prometheus_port_, "/api/v1/query?query=" + UrlEncode(selector));
    Value answer;
    if (response.status != 200 ||
        !google::protobuf::util::JsonStringToMessage(response.body, &answer).ok()) {
      ADD_FAILURE() << selector << ": HTTP " << response.status << " " << response.body;
      return {};
    }
    const auto& data = answer.struct_value().fields().at("data").struct_value().fields();
    EXPECT_EQ(data.at("resultType").string_value(), "matrix") << response.body;
    const auto& result = data.at("result").list_value().values();
    if (result.size() != 1) return {};
    std::vector<std::pair<double, double>> samples;
    for (const Value& point :
         result[0].struct_value().fields().at("values").list_value().values()) {
      double value = 0;
      EXPECT_TRUE(absl::SimpleAtod(point.list_value().values(1).string_value(), &value));
      samples.emplace_back(point.list_value().values(0).number_value(), value);
    }
    return samples;
  }

  // Queries until `done` holds for the answer or `timeout` passes; the last answer.
  template <typename Done>
  std::vector<Sample> QueryUntil(const std::string& promql, Done done,
                                 absl::Duration timeout = absl::Seconds(60)) {
    const absl::Time deadline = absl::Now() + timeout;
    std::vector<Sample> samples = Query(promql);
    while (!done(samples) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(100));  // polling Prometheus
      samples = Query(promql);
    }
    EXPECT_TRUE(done(samples)) << promql << " did not get there in time";
    return samples;
  }

  // Ends the traced programs still running (`vramscope run` passes SIGTERM on to its program).
  void TearDown() override {
    for (const std::unique_ptr<Subprocess>& run : runs_) {
      run->Kill(SIGTERM);
      run->Wait();
    }
  }

  // `vramscope run --collector` over the fake program: ALLOCS blocks of 1 MB, held for a minute
  // (or until TearDown). `peak_time_file`: the program writes its pid and the wall-clock time of
  // its peak (its last allocation) there.
  Subprocess* Traced(int allocs, const std::string& peak_time_file = "") {
    Subprocess* run = runs_.emplace_back(std::make_unique<Subprocess>()).get();
    std::vector<std::string> command = {Env("VRAMSCOPE_CLI"),
                                        "run",
                                        "--collector",
                                        absl::StrCat("127.0.0.1:", grpc_port_),
                                        "--",
                                        Env("VRAMSCOPE_FAKE_APP"),
                                        "--allocs",
                                        absl::StrCat(allocs),
                                        "--size",
                                        "1000000",
                                        "--linger-ms",
                                        "60000"};
    if (!peak_time_file.empty()) {
      command.push_back("--peak-time-file");
      command.push_back(peak_time_file);
    }
    EXPECT_TRUE(run->Start(command));
    return run;
  }

  v1::Report CollectorReport(uint32_t pid) {
    auto stub = v1::Collector::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", grpc_port_),
                                                           grpc::InsecureChannelCredentials()));
    grpc::ClientContext list_context;
    v1::ListProcessesRequest list_request;
    list_request.set_include_finished(true);
    v1::ListProcessesResponse list;
    EXPECT_TRUE(stub->ListProcesses(&list_context, list_request, &list).ok());
    v1::GetReportRequest request;
    for (const v1::ProcessSummary& summary : list.processes()) {
      if (summary.process().pid() == pid) *request.mutable_process() = summary.process();
    }
    grpc::ClientContext context;
    v1::Report report;
    EXPECT_TRUE(stub->GetReport(&context, request, &report).ok()) << pid;
    return report;
  }

  TempDir dir_;
  Subprocess collector_;
  std::unique_ptr<Subprocess> prometheus_;
  std::vector<std::unique_ptr<Subprocess>> runs_;
  int grpc_port_ = 0, metrics_port_ = 0, prometheus_port_ = 0;
};

TEST_F(PrometheusTest, PrometheusSeesLivePeaksHostSumsAndRetention) {
  Subprocess* big = Traced(8);  // one 8 MiB pool segment
  const std::string peaks = "vramscope_process_peak_reserved_bytes{comm=\"run_fake_app\"}";
  // Prometheus's first scrape of a new target can take seconds (target discovery); from then on
  // it scrapes every second.
  QueryUntil(peaks, [](const auto& s) { return s.size() == 1 && s[0].value == 8 * kMiB; });
  // The small one records when its peak happened (its last allocation, wall clock).
  const std::string peak_file = dir_.path() + "/peak.time";
  Traced(4, peak_file);  // one 4 MiB pool segment
  std::vector<Sample> live = QueryUntil(peaks, [](const std::vector<Sample>& s) {
    return s.size() == 2 && s[0].value + s[1].value == 12 * kMiB;
  });
  ASSERT_EQ(live.size(), 2u);
  // Prometheus sees the peak within one scrape interval of it happening: the first scraped
  // sample showing it is stamped at most the interval (1 s) plus the time the peak takes to
  // reach the collector's exposition after it: the drain's poll period in `vramscope run` (10
  // ms, kPollIntervalMs in viewer-cli/run/run_command.cc), then one batch over loopback gRPC and
  // its ingest (milliseconds; 190 ms allowed for a loaded 2-core machine): 200 ms in all.
  constexpr absl::Duration kScrapeInterval = absl::Seconds(1);
  constexpr absl::Duration kIngestAllowance = absl::Milliseconds(10 + 190);
  int peak_pid = 0;
  int64_t peak_ns = 0;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(30); absl::Now() < deadline;) {
    const std::vector<std::string> fields = absl::StrSplit(ReadFile(peak_file), ' ');
    if (fields.size() == 2 && absl::SimpleAtoi(fields[0], &peak_pid) &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(fields[1]), &peak_ns)) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));  // polling for the file
  }
  ASSERT_GT(peak_ns, 0) << peak_file << " not written";
  const std::vector<std::pair<double, double>> samples = RawSamples(
      absl::StrCat("vramscope_process_peak_requested_bytes{pid=\"", peak_pid, "\"}[1m]"));
  ASSERT_FALSE(samples.empty()) << "no series for pid " << peak_pid;
  const auto first = std::find_if(samples.begin(), samples.end(),
                                  [](const auto& s) { return s.second == 4 * 1000000.0; });
  ASSERT_NE(first, samples.end()) << "no sample shows the peak of 4,000,000 bytes";
  const absl::Duration delay = absl::Milliseconds(first->first * 1e3) - absl::Nanoseconds(peak_ns);
  std::printf(
      "a program's peak in Prometheus: first scraped sample showing it %.0f ms after the peak "
      "(goal: <= scrape interval %.0f ms + ingest allowance %.0f ms)\n",
      absl::ToDoubleMilliseconds(delay), absl::ToDoubleMilliseconds(kScrapeInterval),
      absl::ToDoubleMilliseconds(kIngestAllowance));
  EXPECT_LE(delay, kScrapeInterval + kIngestAllowance);
  const Sample& big_sample = live[0].value == 8 * kMiB ? live[0] : live[1];
  const std::string big_pid = big_sample.labels.at("pid");
  EXPECT_EQ(big_sample.labels.at("device"), "0");
  EXPECT_EQ(big_sample.labels.at("job"), "vramscope");  // Prometheus's own target label
  QueryUntil("sum(vramscope_host_reserved_bytes)",
             [](const auto& s) { return s.size() == 1 && s[0].value == 12 * kMiB; });
  QueryUntil("sum(vramscope_host_processes)",
             [](const auto& s) { return s.size() == 1 && s[0].value == 2; });
  QueryUntil("vramscope_process_allocations_total{pid=\"" + big_pid + "\"}",
             [](const auto& s) { return s.size() == 1 && s[0].value == 8; });
  EXPECT_EQ(Query("vramscope_process_finished{pid=\"" + big_pid + "\"}").at(0).value, 0);

  // The big one is killed: Prometheus shows it finished, with the collector's figures.
  uint32_t pid = 0;
  ASSERT_TRUE(absl::SimpleAtoi(big_pid, &pid));
  ASSERT_EQ(::kill(static_cast<pid_t>(pid), SIGKILL), 0);
  big->Wait();
  QueryUntil("vramscope_process_finished{pid=\"" + big_pid + "\"}",
             [](const auto& s) { return s.size() == 1 && s[0].value == 1; });
  const v1::Report report = CollectorReport(pid);
  ASSERT_EQ(report.devices_size(), 1);
  EXPECT_TRUE(report.finished());
  const auto figure = [&](const std::string& name) {
    std::vector<Sample> s = Query(name + "{pid=\"" + big_pid + "\"}");
    return s.size() == 1 ? s[0].value : -1;
  };
  EXPECT_EQ(figure("vramscope_process_peak_reserved_bytes"),
            report.devices(0).peak_reserved_bytes());
  EXPECT_EQ(figure("vramscope_process_peak_allocated_bytes"),
            report.devices(0).peak_allocated_bytes());
  EXPECT_EQ(figure("vramscope_process_peak_requested_bytes"),
            report.devices(0).peak_requested_bytes());
  EXPECT_EQ(figure("vramscope_process_frees_total"), report.devices(0).free_count());
  // Finished processes leave the host sums at once, and the exposition after the retention (3s).
  QueryUntil("sum(vramscope_host_processes)",
             [](const auto& s) { return s.size() == 1 && s[0].value == 1; });
  QueryUntil("vramscope_process_peak_reserved_bytes{pid=\"" + big_pid + "\"}",
             [](const auto& s) { return s.empty(); });
  EXPECT_EQ(Query(peaks).size(), 1u);  // the small one is still there

  // The collector's health, as Prometheus scraped it.
  EXPECT_GT(Query("vramscope_collector_events_ingested_total").at(0).value, 0);
  EXPECT_EQ(Query("vramscope_collector_processes{state=\"finished\"}").at(0).value, 1);
}

TEST_F(PrometheusTest, EveryDashboardQueryEvaluates) {
  Traced(2);
  QueryUntil("vramscope_host_processes", [](const auto& s) { return s.size() == 1; });
  Value dashboard;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(ReadFile(Env("VRAMSCOPE_DASHBOARD")), &dashboard)
          .ok());
  int queries = 0;
  for (const Value& panel : dashboard.struct_value().fields().at("panels").list_value().values()) {
    for (const Value& target : panel.struct_value().fields().at("targets").list_value().values()) {
      // Grafana's variables, as Grafana fills them in.
      const std::string expr =
          absl::StrReplaceAll(target.struct_value().fields().at("expr").string_value(),
                              {{"$host", ".*"}, {"$__rate_interval", "1m"}});
      Query(expr);  // fails the test unless Prometheus answers "success"
      ++queries;
    }
  }
  EXPECT_GE(queries, 20);
}

TEST_F(PrometheusTest, PromtoolAcceptsTheServedExposition) {
  Traced(3);
  QueryUntil("vramscope_host_processes", [](const auto& s) { return s.size() == 1; });
  const HttpResponse metrics = HttpGet(metrics_port_, "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("vramscope_process_peak_reserved_bytes{"), std::string::npos);
  WriteFile(dir_.path() + "/metrics.txt", metrics.body);
  const std::string command =
      Env("VRAMSCOPE_PROMTOOL") + " check metrics < " + dir_.path() + "/metrics.txt 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  const int status = ::pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
}

}  // namespace
}  // namespace vramscope::testing
