// The run history end to end, in process: the fake application under `vramscope run --label ...
// --collector`, a collector on a loopback port keeping its history in SQLite; then `vramscope
// history` (text, csv, json), `report --collector --run`, and `check --baseline-from` (the
// median of the last passing runs with the labels; a failed run is not part of it).
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "check/check_command.h"
#include "history/history_command.h"
#include "history/history_writer.h"
#include "report/report_command.h"
#include "run/run_command.h"
#include "tests/collector/test_util.h"
#include "vramscope/collector/collector.h"
#include "vramscope/collector/service.h"
#include "vramscope/log.h"

namespace vramscope::cli {
namespace {

using ::vramscope::testing::Env;
using ::vramscope::testing::TempDir;

class RunHistoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(Env("VRAMSCOPE_FAKE_APP").empty()) << "meson sets VRAMSCOPE_FAKE_APP";
    vramscope::SetMinLogLevel(vramscope::LogLevel::kError);
    collector::CollectorOptions options;
    options.data_dir = data_.path() + "/collector";
    options.database = "";  // SQLite in the data directory, as the daemon by default
    absl::StatusOr<std::unique_ptr<collector::Collector>> core =
        collector::Collector::Open(options);
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = std::move(*core);
    collector::ServerOptions server_options;
    server_options.listen = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<collector::CollectorServer>> server =
        collector::CollectorServer::Start(core_.get(), server_options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  // Runs `vramscope COMMAND ARGS` in process; stdout and stderr kept in out_ and err_.
  int Cli(int (*command)(int, char**), std::vector<std::string> args) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::testing::internal::CaptureStdout();
    ::testing::internal::CaptureStderr();
    const int code = command(static_cast<int>(args.size()), argv.data());
    out_ = ::testing::internal::GetCapturedStdout();
    err_ = ::testing::internal::GetCapturedStderr();
    return code;
  }
  // One traced run of the fake application: 4 blocks of `size` bytes, pooled in a reservation
  // of 4 * size rounded up to 2 MiB; then its row is in the database.
  void TracedRun(const std::string& job, const std::string& size, int exit_code,
                 const std::string& json = "") {
    std::vector<std::string> args = {"run", "--collector", address_, "--label", "job=" + job};
    if (!json.empty()) args.insert(args.end(), {"--json", json});
    args.insert(args.end(), {"--", Env("VRAMSCOPE_FAKE_APP"), "--allocs", "4", "--size", size,
                             "--exit", std::to_string(exit_code)});
    ASSERT_EQ(Cli(RunRun, args), exit_code) << err_;
    ASSERT_TRUE(core_->history()->WaitIdle(absl::Seconds(60)));
  }

  TempDir data_;
  std::unique_ptr<collector::Collector> core_;
  std::unique_ptr<collector::CollectorServer> server_;
  std::string address_;
  std::string out_;
  std::string err_;
};

constexpr uint64_t kMiB = 1 << 20;

TEST_F(RunHistoryTest, HistoryReportAndBaselineFromTheCollector) {
  TracedRun("train", std::to_string(1 * kMiB), 0);   // reserved 4 MiB
  TracedRun("train", std::to_string(3 * kMiB), 0);   // 12 MiB
  TracedRun("train", std::to_string(10 * kMiB), 3);  // 40 MiB, failed: never a baseline
  TracedRun("train", std::to_string(2 * kMiB), 0);   // 8 MiB
  TracedRun("eval", std::to_string(1 * kMiB), 0);

  ASSERT_EQ(Cli(RunHistory,
                {"history", "--collector", address_, "--label", "job=train", "--since", "1d"}),
            0)
      << err_;
  EXPECT_NE(out_.find("job=train: 4 runs, peak reserved ▁▃█▂  (4.00 MiB .. 40.0 MiB)"),
            std::string::npos)
      << out_;
  EXPECT_EQ(out_.find("job=eval"), std::string::npos) << out_;
  EXPECT_NE(out_.find("exited 3"), std::string::npos) << out_;

  ASSERT_EQ(Cli(RunHistory, {"history", "--collector", address_, "--format", "csv"}), 0);
  const std::vector<std::string> lines = absl::StrSplit(out_, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 6u) << out_;  // header + one row per run (one device each)
  EXPECT_NE(lines[1].find(",0,4194304,"), std::string::npos) << lines[1];  // newest: eval
  EXPECT_NE(lines[1].find("job=eval"), std::string::npos) << lines[1];

  ASSERT_EQ(Cli(RunHistory, {"history", "--collector", address_, "--format", "json"}), 0);
  v1::ListRunsResponse runs;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_, &runs).ok()) << out_;
  ASSERT_EQ(runs.runs_size(), 5);
  const int64_t failed_run = runs.runs(2).run_id();
  EXPECT_EQ(runs.runs(2).exit_code(), 3);

  // Any stored run's report, as JSON that check reads.
  ASSERT_EQ(Cli(RunReport, {"report", "--collector", address_, "--run", std::to_string(failed_run),
                            "--format", "json"}),
            0)
      << err_;
  v1::Report report;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_, &report).ok()) << out_;
  EXPECT_EQ(report.labels().at("job"), "train");
  EXPECT_EQ(report.devices(0).peak_reserved_bytes(), 40 * kMiB);
  EXPECT_EQ(Cli(RunReport, {"report", "--collector", address_, "--run", "999"}), 2);
  EXPECT_NE(err_.find("no run 999"), std::string::npos) << err_;

  // Baseline: the median of the 3 passing train runs (8 MiB reserved).
  const std::string ok_json = data_.path() + "/ok.json";
  const std::string big_json = data_.path() + "/big.json";
  TracedRun("local", std::to_string(2 * kMiB), 0, ok_json);
  TracedRun("local", std::to_string(5 * kMiB), 0, big_json);
  const std::vector<std::string> check = {"check",     "--baseline-from", address_, "--label",
                                          "job=train", "--baseline-runs", "5",      "--report"};
  std::vector<std::string> args = check;
  args.push_back(ok_json);
  EXPECT_EQ(Cli(RunCheck, args), 0) << out_ << err_;
  EXPECT_NE(out_.find("the median of the last 3 passing run(s) with job=train"), std::string::npos)
      << out_;
  args = check;
  args.push_back(big_json);
  EXPECT_EQ(Cli(RunCheck, args), 1) << out_ << err_;
  // Only the newest passing run: 8 MiB too (the 2 MiB-block run).
  args = {"check", "--baseline-from", address_, "--label", "job=train", "--baseline-runs",
          "1",     "--report",        ok_json};
  EXPECT_EQ(Cli(RunCheck, args), 0) << out_ << err_;
  args = {"check", "--baseline-from", address_, "--label", "job=nothing", "--report", ok_json};
  EXPECT_EQ(Cli(RunCheck, args), 2);
  EXPECT_NE(err_.find("no passing run (exit code 0, not killed) with the labels job=nothing"),
            std::string::npos)
      << err_;
}

TEST_F(RunHistoryTest, UsageErrors) {
  EXPECT_EQ(Cli(RunHistory, {"history"}), 2);
  EXPECT_NE(err_.find("--collector HOST:PORT is required"), std::string::npos) << err_;
  EXPECT_EQ(Cli(RunHistory, {"history", "--collector", address_, "--since", "7y"}), 2);
  EXPECT_EQ(Cli(RunHistory, {"history", "--collector", address_, "--label", "a b=c"}), 2);
  EXPECT_EQ(Cli(RunCheck, {"check", "--baseline-from", address_, "--report", "x.json"}), 2);
  EXPECT_NE(err_.find("--baseline-from needs --label"), std::string::npos) << err_;
  EXPECT_EQ(Cli(RunCheck, {"check", "--baseline", "b.json", "--baseline-from", address_, "--label",
                           "a=b", "--report", "x.json"}),
            2);
  EXPECT_EQ(Cli(RunRun, {"run", "--label", "job", "--", "true"}), 2);
  EXPECT_NE(err_.find("label 'job' is not KEY=VALUE"), std::string::npos) << err_;
}

}  // namespace
}  // namespace vramscope::cli
