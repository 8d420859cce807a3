// How traced processes ended, told the same in every output: `vramscope run` over run_fake_app
// (a stand-in that writes a ring like the shim) with a direct child killed by SIGKILL, one that
// aborts, a grandchild killed by SIGKILL (it vanishes: signal unknown to run) and a normal exit;
// each checked in the text on stderr, the JSON, the HTML page, top's rows, and `vramscope check`
// (a killed process fails it unless --allow-killed).
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "check/check_command.h"
#include "common/report_file.h"
#include "report/collector_source.h"
#include "report/report_html.h"
#include "run/run_command.h"
#include "run_fixture.h"
#include "top/top_model.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {
namespace {

using testing::FakeApp;

class EndingsTest : public testing::RunFixture {
 protected:
  static std::vector<char*> Argv(std::vector<std::string>& args) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    return argv;
  }
  // `vramscope run --json JSON -- run_fake_app APP_ARGS`: its exit code; stderr in stderr_, the
  // reports in reports_.
  int Run(const std::string& json, std::vector<std::string> app_args) {
    app_args.insert(app_args.begin(), FakeApp());
    return RunCommand(json, std::move(app_args));
  }
  // `vramscope run --json JSON -- COMMAND...`.
  int RunCommand(const std::string& json, const std::vector<std::string>& command) {
    std::vector<std::string> args = {"run", "--json", json, "--"};
    args.insert(args.end(), command.begin(), command.end());
    std::vector<char*> argv = Argv(args);
    ::testing::internal::CaptureStderr();
    const int code = RunRun(static_cast<int>(args.size()), argv.data());
    stderr_ = ::testing::internal::GetCapturedStderr();
    const absl::StatusOr<std::vector<v1::Report>> reports = ReadReportsFile(json);
    EXPECT_TRUE(reports.ok()) << reports.status();
    if (reports.ok()) reports_ = *reports;
    return code;
  }
  // `vramscope check --baseline JSON --report JSON [EXTRA]`: its exit code; stdout in stdout_.
  int Check(const std::string& json, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"check", "--baseline", json, "--report", json};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv = Argv(args);
    ::testing::internal::CaptureStdout();
    const int code = RunCheck(static_cast<int>(args.size()), argv.data());
    stdout_ = ::testing::internal::GetCapturedStdout();
    return code;
  }
  // Top's table line and plain line for the first device row of `report`.
  static std::pair<std::string, std::string> TopLines(const v1::Report& report) {
    top::TopModel model;
    model.Update(top::UpdateFromReports({report}, report.end_time_ns()));
    EXPECT_FALSE(model.rows().empty());
    if (model.rows().empty()) return {};
    return {model.RowLine(model.rows()[0], 200), model.PlainLine(model.rows()[0])};
  }
  static double Seconds(const v1::Report& report) {
    return static_cast<double>(report.end_time_ns() - report.start_time_ns()) / 1e9;
  }

  std::string stderr_;
  std::string stdout_;
  std::vector<v1::Report> reports_;
};

TEST_F(EndingsTest, DirectChildKilledBySigkillIsReportedKilledWithSignal9) {
  const std::string json = File("killed.json");
  // It allocates, works 300 ms more, then dies by SIGKILL: no exit record.
  EXPECT_EQ(Run(json, {"--allocs", "4", "--leak", "2", "--linger-ms", "300", "--signal", "9"}),
            128 + SIGKILL);
  ASSERT_EQ(reports_.size(), 1u);
  const v1::Report& report = reports_[0];
  EXPECT_TRUE(report.finished());
  EXPECT_TRUE(report.killed());
  EXPECT_EQ(report.signal(), SIGKILL);
  EXPECT_TRUE(report.vanished());
  ASSERT_EQ(report.devices_size(), 1);
  EXPECT_EQ(report.devices(0).leaks_size(), 2);  // live when it died
  // It ended when run saw it end, after the 300 ms past its last event; not at the last event.
  EXPECT_GE(Seconds(report), 0.3) << stderr_;
  EXPECT_NE(stderr_.find("killed by SIGKILL (signal 9)"), std::string::npos) << stderr_;
  EXPECT_EQ(stderr_.find("exited"), std::string::npos) << stderr_;
  const std::string html = FormatReportsHtml(reports_);
  EXPECT_NE(html.find("killed by SIGKILL (signal 9)"), std::string::npos);
  EXPECT_NE(html.find("data-path=\"0.signal\" data-field=\"signal\" data-unit=\"count\" "
                      "data-value=\"9\""),
            std::string::npos);
  const auto [row, plain] = TopLines(report);
  EXPECT_NE(row.find("[killed SIGKILL]"), std::string::npos) << row;
  EXPECT_NE(plain.find(" finished=1 killed=1 signal=9 "), std::string::npos) << plain;

  EXPECT_EQ(Check(json), 1);
  EXPECT_NE(stdout_.find("FAIL: pid"), std::string::npos) << stdout_;
  EXPECT_NE(stdout_.find("killed by SIGKILL"), std::string::npos) << stdout_;
  EXPECT_EQ(Check(json, {"--allow-killed"}), 0) << stdout_;
  EXPECT_NE(stdout_.find("allowed (--allow-killed)"), std::string::npos) << stdout_;
}

TEST_F(EndingsTest, AbortGivesSigabrt) {
  const std::string json = File("abort.json");
  EXPECT_EQ(Run(json, {"--allocs", "2", "--abort"}), 128 + SIGABRT);
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_TRUE(reports_[0].killed());
  EXPECT_EQ(reports_[0].signal(), SIGABRT);
  EXPECT_NE(stderr_.find("killed by SIGABRT (signal 6)"), std::string::npos) << stderr_;
  EXPECT_NE(FormatReportsHtml(reports_).find("killed by SIGABRT (signal 6)"), std::string::npos);
  EXPECT_EQ(Check(json), 1);
}

TEST_F(EndingsTest, KilledGrandchildVanishesWithTheSignalUnknown) {
  const std::string json = File("grandchild.json");
  // run_fake_app forks a child that allocates 3 blocks and is killed with SIGKILL by its parent
  // (run's grandchild: run sees no wait status), then exits 0 itself.
  EXPECT_EQ(Run(json, {"--allocs", "6", "--fork-killed"}), 0);
  ASSERT_EQ(reports_.size(), 2u) << stderr_;
  const v1::Report* parent = nullptr;
  const v1::Report* child = nullptr;
  for (const v1::Report& report : reports_) {
    (report.devices_size() == 1 && report.devices(0).alloc_count() == 3 ? child : parent) = &report;
  }
  ASSERT_NE(parent, nullptr);
  ASSERT_NE(child, nullptr);
  EXPECT_TRUE(parent->finished());
  EXPECT_FALSE(parent->killed());
  EXPECT_EQ(parent->exit_code(), 0);
  EXPECT_TRUE(child->finished());
  EXPECT_TRUE(child->killed());
  EXPECT_TRUE(child->vanished());
  EXPECT_EQ(child->signal(), 0);
  EXPECT_GE(child->end_time_ns(), child->start_time_ns());
  ASSERT_EQ(child->devices_size(), 1);
  EXPECT_EQ(child->devices(0).leaks_size(), 3);
  const std::string vanished = "vanished without an exit record (killed, signal unknown)";
  EXPECT_NE(stderr_.find(vanished), std::string::npos) << stderr_;
  EXPECT_NE(stderr_.find("exited 0"), std::string::npos) << stderr_;  // the parent
  EXPECT_NE(FormatReportsHtml(reports_).find(vanished), std::string::npos);
  const auto [row, plain] = TopLines(*child);
  EXPECT_NE(row.find("[vanished]"), std::string::npos) << row;
  EXPECT_NE(plain.find(" finished=1 killed=1 signal=0 "), std::string::npos) << plain;
  EXPECT_EQ(Check(json), 1);
  EXPECT_NE(stdout_.find(vanished), std::string::npos) << stdout_;
  EXPECT_EQ(Check(json, {"--allow-killed"}), 0) << stdout_;
}

// `timeout -s KILL` kills its whole process group, itself included: the traced program (run's
// grandchild) is still dying when run reaps its child, and must be reported as vanished, not as
// still running, with the time it ran.
TEST_F(EndingsTest, ProcessGroupKilledByTimeoutIsVanishedNotRunning) {
  const std::string json = File("timeout.json");
  EXPECT_EQ(RunCommand(json, {"timeout", "-s", "KILL", "0.3", FakeApp(), "--allocs", "2", "--leak",
                              "1", "--linger-ms", "60000"}),
            128 + SIGKILL);
  ASSERT_EQ(reports_.size(), 1u) << stderr_;
  EXPECT_TRUE(reports_[0].finished()) << stderr_;
  EXPECT_TRUE(reports_[0].killed());
  EXPECT_TRUE(reports_[0].vanished());
  EXPECT_EQ(reports_[0].signal(), 0);
  // Its last event came a few ms after it started; it ran until timeout's 0.3 s (less the time
  // timeout took to start it).
  EXPECT_GE(Seconds(reports_[0]), 0.2);
  EXPECT_EQ(stderr_.find("still running"), std::string::npos) << stderr_;
  EXPECT_NE(stderr_.find("vanished without an exit record"), std::string::npos) << stderr_;
}

// A descendant still running when the command exits is waited for a little (up to 500 ms), so
// one that ends just after it is reported as ended, not as running.
TEST_F(EndingsTest, DescendantEndingJustAfterTheCommandIsReportedEnded) {
  const std::string json = File("straggler.json");
  // run_fake_app exits 0 at once; its child (with 3 allocations) ends about 100 ms later.
  EXPECT_EQ(Run(json, {"--allocs", "6", "--orphan-ms", "100"}), 0);
  ASSERT_EQ(reports_.size(), 2u) << stderr_;
  for (const v1::Report& report : reports_) {
    EXPECT_TRUE(report.finished()) << stderr_;
    EXPECT_FALSE(report.killed());
  }
  EXPECT_EQ(reports_[0].exit_code() + reports_[1].exit_code(), 4);  // 0 and the child's 4
  EXPECT_EQ(stderr_.find("still running"), std::string::npos) << stderr_;
}

// `vramscope report --collector ADDR`'s process list, from ListProcesses.
TEST(ProcessListTest, StatusTellsHowEachProcessEnded) {
  v1::ListProcessesResponse list;
  auto add = [&list](std::uint32_t pid, bool finished, bool killed, int signal) {
    v1::ProcessSummary* p = list.add_processes();
    p->mutable_process()->set_host("node");
    p->mutable_process()->set_pid(pid);
    p->set_finished(finished);
    p->set_killed(killed);
    p->set_signal(signal);
    p->set_vanished(killed);
  };
  add(1, false, false, 0);
  add(2, true, false, 0);
  add(3, true, true, SIGKILL);
  add(4, true, true, 0);
  const std::string text = FormatProcessList(list);
  EXPECT_NE(text.find(" running "), std::string::npos) << text;
  EXPECT_NE(text.find(" exited "), std::string::npos) << text;
  EXPECT_NE(text.find(" killed SIGKILL "), std::string::npos) << text;
  EXPECT_NE(text.find(" vanished "), std::string::npos) << text;
}

TEST_F(EndingsTest, NormalExitStillSaysExitedN) {
  const std::string json = File("exit.json");
  EXPECT_EQ(Run(json, {"--allocs", "2", "--exit", "3"}), 3);
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_TRUE(reports_[0].finished());
  EXPECT_FALSE(reports_[0].killed());
  EXPECT_FALSE(reports_[0].vanished());
  EXPECT_EQ(reports_[0].signal(), 0);
  EXPECT_EQ(reports_[0].exit_code(), 3);
  EXPECT_NE(stderr_.find("exited 3,"), std::string::npos) << stderr_;
  const auto [row, plain] = TopLines(reports_[0]);
  EXPECT_NE(row.find("[exited]"), std::string::npos) << row;
  EXPECT_EQ(Check(json), 0) << stdout_;
}

}  // namespace
}  // namespace vramscope::cli
