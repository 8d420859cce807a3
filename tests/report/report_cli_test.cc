// The real `vramscope` executable: `vramscope report` on crafted report files (text, JSON, HTML,
// -o, exit codes for missing, corrupt and foreign input and usage errors) and against a real
// vramscope-collector process fed through the agent library (listing, by pid, by host,
// unknown pid, unreachable collector).
#include <absl/strings/str_cat.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/report_file.h"
#include "common/report_text.h"
#include "tests/collector/test_util.h"
#include "tests/pipeline/subprocess.h"
#include "tests/report/run_exe.h"
#include "tests/report/sample_reports.h"
#include "vramscope/agent/outbox.h"
#include "vramscope/agent/uplink.h"
#include "vramscope/log.h"

namespace vramscope {
namespace {

using ::vramscope::testing::BinaryFromEnv;
using ::vramscope::testing::ExeResult;
using ::vramscope::testing::Key;
using ::vramscope::testing::ReadFile;
using ::vramscope::testing::SampleReport;
using ::vramscope::testing::Subprocess;
using ::vramscope::testing::TempDir;
using ::vramscope::testing::WriteFile;

class ReportCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    exe_ = BinaryFromEnv("VRAMSCOPE_EXE");
    ASSERT_FALSE(exe_.empty()) << "VRAMSCOPE_EXE is not set (meson sets it)";
    sample_ = dir_.path() + "/sample.json";
    WriteFile(sample_, cli::FormatReportsJson({SampleReport()}));
  }

  ExeResult Report(std::vector<std::string> args) {
    args.insert(args.begin(), {exe_, "report"});
    return testing::RunExe(args, dir_.path());
  }

  std::string exe_;
  TempDir dir_;
  std::string sample_;
};

TEST_F(ReportCliTest, TextIsTheDefault) {
  const ExeResult r = Report({sample_});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, cli::FormatRunReport(SampleReport(), "--format json"));
  EXPECT_EQ(r.err, "");
}

TEST_F(ReportCliTest, JsonToAFileReadsBackAsTheSameReport) {
  const std::string out = dir_.path() + "/out.json";
  const ExeResult r = Report({sample_, "--format=json", "-o", out});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  absl::StatusOr<std::vector<v1::Report>> back = cli::ReadReportsFile(out);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 1u);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals((*back)[0], SampleReport()));
  // Only the output file is left: the atomic write's temporary file is gone.
  int files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
    ++files;
  }
  EXPECT_EQ(files, 4);  // sample.json, out.json, run_exe.stdout, run_exe.stderr
}

TEST_F(ReportCliTest, HtmlOnStdoutAndSeveralProcesses) {
  const std::string two = dir_.path() + "/two.json";
  WriteFile(two, cli::FormatReportsJson({SampleReport(), SampleReport()}));
  const ExeResult r = Report({"--format", "html", two});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(r.out.find("id=\"plot-1-1\""), std::string::npos);
  EXPECT_NE(r.out.find("</html>\n"), std::string::npos);
}

TEST_F(ReportCliTest, BadInputExitsTwoAndWritesNothing) {
  const std::string out = dir_.path() + "/never.html";
  const std::string corrupt = dir_.path() + "/corrupt.json";
  WriteFile(corrupt, "{\"process\": {\"pid\": 1}, \"devices\": [");
  const std::string foreign = dir_.path() + "/foreign.json";
  WriteFile(foreign, "{\"name\": \"not a report\"}");
  const std::string empty = dir_.path() + "/empty.json";
  WriteFile(empty, "");
  // 100 KB of nesting: refused by the pre-scan before protobuf's parser, whose time grows with
  // the square of the depth, sees it.
  const std::string deep = dir_.path() + "/deep.json";
  WriteFile(deep, "{\"reports\": " + std::string(50000, '[') + std::string(50000, ']') + "}");
  struct Case {
    std::string file;
    std::string message;
  } cases[] = {
      {dir_.path() + "/missing.json", "cannot read " + dir_.path() + "/missing.json"},
      {corrupt, "is not a JSON object"},
      {foreign, "is not a vramscope.v1.Report"},
      {empty, "is empty"},
      {deep, deep + ": JSON nested deeper than 64 levels at byte 75"},
      {dir_.path(), "not a file"},
  };
  for (const Case& c : cases) {
    const ExeResult r = Report({c.file, "--format=html", "-o", out});
    EXPECT_EQ(r.code, 2) << c.file;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(out)) << c.file;
  }
}

TEST_F(ReportCliTest, UsageErrorsExitTwo) {
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"--format=pdf", sample_},
      {sample_, "--collector", "127.0.0.1:1"},
      {sample_, "--pid", "12"},
      {"--collector", "127.0.0.1:1", "--pid", "x"},
      {"--collector", "127.0.0.1:1", "--host", "h"},
      {"--collector", "127.0.0.1:1", "--format", "json"},
      {sample_, sample_},
      {sample_, "--bogus"},
      {sample_, "-o"},
  };
  for (const auto& args : cases) {
    const ExeResult r = Report(args);
    EXPECT_EQ(r.code, 2) << (args.empty() ? "" : args[0]) << " " << r.err;
    EXPECT_NE(r.err.find("vramscope report --help"), std::string::npos) << r.err;
  }
  const std::string unwritable = dir_.path() + "/no/such/dir/out.txt";
  const ExeResult r = Report({sample_, "-o", unwritable});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(unwritable), std::string::npos) << r.err;
}

TEST_F(ReportCliTest, HelpTellsTheFormatsAndExitCodes) {
  const ExeResult r = Report({"--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* text : {"--format FORMAT", "text (default)", "json:", "html:", "-o, --output",
                           "--collector ADDR", "--pid PID", "--host HOST", "3 the collector"}) {
    EXPECT_NE(r.out.find(text), std::string::npos) << text;
  }
  const ExeResult top = testing::RunExe({exe_, "--help"}, dir_.path());
  EXPECT_NE(top.out.find("  report "), std::string::npos) << top.out;
}

TEST_F(ReportCliTest, UnreachableCollectorExitsThree) {
  // A port that was just free: nothing listens there.
  Subprocess collector;
  ASSERT_TRUE(collector.Start({BinaryFromEnv("VRAMSCOPE_COLLECTOR"), "--listen=127.0.0.1:0",
                               "--data-dir=" + dir_.path() + "/data"}));
  const int port = collector.WaitForPort();
  ASSERT_NE(port, 0) << collector.output();
  collector.Kill(SIGTERM);
  collector.Wait();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--collector", address}, {"--collector", address, "--pid", "1", "-o", "x.html"}}) {
    const ExeResult r = Report(args);
    EXPECT_EQ(r.code, 3) << r.err;
    EXPECT_NE(r.err.find("cannot reach the collector at " + address), std::string::npos) << r.err;
  }
}

// A collector process fed by the agent library, as vramscope-agent would.
class ReportCollectorTest : public ReportCliTest {
 protected:
  void SetUp() override {
    ReportCliTest::SetUp();
    vramscope::SetMinLogLevel(vramscope::LogLevel::kError);
    ASSERT_TRUE(collector_.Start({BinaryFromEnv("VRAMSCOPE_COLLECTOR"), "--listen=127.0.0.1:0",
                                  "--data-dir=" + dir_.path() + "/data"}));
    const int port = collector_.WaitForPort();
    ASSERT_NE(port, 0) << collector_.output();
    address_ = absl::StrCat("127.0.0.1:", port);
  }

  // Sends the batches and waits until the collector stored them all.
  void Feed(const std::vector<v1::EventBatch>& batches) {
    agent::OutboxOptions outbox_options;
    outbox_options.spool_dir = spool_.path();
    agent::Outbox outbox(outbox_options);
    agent::UplinkOptions uplink_options;
    uplink_options.collector = address_;
    agent::Uplink uplink(&outbox, uplink_options);
    uplink.Start();
    for (const v1::EventBatch& batch : batches) ASSERT_TRUE(outbox.Add(batch));
    ASSERT_TRUE(outbox.WaitAllAcked(absl::Seconds(30))) << uplink.last_error();
    uplink.Stop();
  }

  // A process that allocates inside NVTX range "step" (twice) and exits with one block live.
  static v1::EventBatch Process(const v1::ProcessKey& key) {
    v1::EventBatch batch;
    *batch.mutable_process() = key;
    batch.set_sequence(1);
    std::uint64_t t = 1000;
    auto event = [&]() {
      v1::Event* e = batch.add_events();
      e->set_time_ns(t += 1000);
      e->set_thread_id(77);
      return e;
    };
    v1::Event* start = event();
    start->mutable_process_start()->set_pid(key.pid());
    start->mutable_process_start()->add_command_line("./train");
    start->mutable_process_start()->add_command_line("--nvtx=<step>");
    for (std::uint32_t step = 1; step <= 2; ++step) {
      v1::Event* push = event();
      push->mutable_nvtx_push()->set_range_id(step);
      push->mutable_nvtx_push()->set_name("step <" + std::to_string(step) + ">");
      v1::Event* alloc = event();
      alloc->mutable_alloc()->set_address(0x10000 * step);
      alloc->mutable_alloc()->set_requested_bytes(1000 * step);
      alloc->mutable_alloc()->set_allocated_bytes(1024 * step);
      alloc->mutable_alloc()->set_kind(v1::ALLOCATION_KIND_POOLED);
      if (step == 1) event()->mutable_free()->set_address(0x10000);
      event()->mutable_nvtx_pop()->set_range_id(step);
    }
    event()->mutable_process_exit()->set_exit_code(0);
    return batch;
  }

  Subprocess collector_;
  TempDir spool_;
  std::string address_;
};

TEST_F(ReportCollectorTest, ListsProcessesThenReportsOneByPid) {
  Feed({Process(Key(501)), Process(Key(502, "node2"))});
  ExeResult list = Report({"--collector", address_});
  EXPECT_EQ(list.code, 0) << list.err;
  EXPECT_NE(list.out.find("node1"), std::string::npos) << list.out;
  EXPECT_NE(list.out.find("     501 exited"), std::string::npos) << list.out;
  EXPECT_NE(list.out.find("./train --nvtx=<step>"), std::string::npos) << list.out;
  EXPECT_NE(list.out.find("vramscope report --collector " + address_ + " --pid PID"),
            std::string::npos)
      << list.out;

  const std::string out = dir_.path() + "/501.json";
  ExeResult r = Report({"--collector", address_, "--pid", "501", "--format", "json", "-o", out});
  ASSERT_EQ(r.code, 0) << r.err;
  absl::StatusOr<std::vector<v1::Report>> report = cli::ReadReportsFile(out);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->size(), 1u);
  const v1::Report& got = (*report)[0];
  EXPECT_EQ(got.process().pid(), 501u);
  EXPECT_EQ(got.process().host(), "node1");
  EXPECT_TRUE(got.finished());
  ASSERT_EQ(got.devices_size(), 1);
  const v1::DeviceReport& d = got.devices(0);
  EXPECT_EQ(d.peak_allocated_bytes(), 2048u);
  EXPECT_EQ(d.leaks_size(), 1);
  ASSERT_EQ(d.nvtx_instances_size(), 2);
  EXPECT_EQ(d.nvtx_instances(0).name(), "step <1>");
  EXPECT_LT(d.nvtx_instances(0).start_ns(), d.nvtx_instances(0).end_ns());
  EXPECT_LE(d.nvtx_instances(0).end_ns(), d.nvtx_instances(1).start_ns());

  // The same report as text and as a page.
  r = Report({"--collector", address_, "--pid", "501"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, cli::FormatRunReport(got, "--format json"));
  r = Report({"--collector", address_, "--pid=501", "--host=node1", "--format=html"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("data-ranges=\"2\""), std::string::npos);
  EXPECT_NE(r.out.find("step &lt;1&gt;"), std::string::npos);
}

TEST_F(ReportCollectorTest, UnknownPidAndAmbiguousHostsExitTwo) {
  Feed({Process(Key(601)), Process(Key(601, "node2"))});
  ExeResult r = Report({"--collector", address_, "--pid", "999"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("has no process with pid 999"), std::string::npos) << r.err;
  r = Report({"--collector", address_, "--pid", "601"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("pick one with --host HOST"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("node1, node2"), std::string::npos) << r.err;
  r = Report({"--collector", address_, "--pid", "601", "--host", "node2", "--format", "json"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"host\": \"node2\""), std::string::npos) << r.out;
  r = Report({"--collector", address_, "--pid", "601", "--host", "node3"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("on host 'node3'"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace vramscope
