// `vramscope run --collector`, in process: the fake application under RunRun streams its events to
// a collector served on a loopback port (port 0), which then reports the same peaks and counts as
// the local JSON; an unreachable collector gives exit 3 (only when nothing else failed) with the
// local report still written.
#include <absl/strings/str_cat.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "run/run_command.h"
#include "tests/collector/test_util.h"
#include "vramscope/collector/collector.h"
#include "vramscope/collector/service.h"
#include "vramscope/log.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {
namespace {

using ::vramscope::testing::TempDir;

std::string FakeApp() {
  const char* path = getenv("VRAMSCOPE_FAKE_APP");
  return path != nullptr ? path : "";
}

class RunCollectorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(FakeApp().empty()) << "VRAMSCOPE_FAKE_APP is not set (meson sets it)";
    ASSERT_NE(getenv("VRAMSCOPE_SHIM"), nullptr);
    vramscope::SetMinLogLevel(vramscope::LogLevel::kError);
    collector::CollectorOptions options;
    options.data_dir = data_.path() + "/collector";
    options.fsync = false;
    absl::StatusOr<std::unique_ptr<collector::Collector>> core =
        collector::Collector::Open(options);
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = std::move(*core);
  }

  // Serves the collector on a free loopback port; returns it.
  int Serve() {
    collector::ServerOptions options;
    options.listen = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<collector::CollectorServer>> server =
        collector::CollectorServer::Start(core_.get(), options);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return 0;
    server_ = std::move(*server);
    return server_->port();
  }

  // A loopback port nothing listens on.
  int DeadPort() {
    const int port = Serve();
    server_->Shutdown();
    server_.reset();
    return port;
  }

  // Runs `vramscope run ARGS` and returns the exit code; stderr is kept in stderr_.
  int Run(std::vector<std::string> args) {
    args.insert(args.begin(), "run");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::testing::internal::CaptureStderr();
    const int code = RunRun(static_cast<int>(args.size()), argv.data());
    stderr_ = ::testing::internal::GetCapturedStderr();
    return code;
  }

  static v1::Report ReadReport(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    v1::Report report;
    const auto status = google::protobuf::util::JsonStringToMessage(ss.str(), &report);
    EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << ss.str();
    return report;
  }

  TempDir data_;
  std::unique_ptr<collector::Collector> core_;
  std::unique_ptr<collector::CollectorServer> server_;
  std::string stderr_;
};

TEST_F(RunCollectorTest, TheCollectorReportsWhatTheLocalReportSays) {
  const int port = Serve();
  const std::string json = data_.path() + "/report.json";
  ASSERT_EQ(Run({"--collector", absl::StrCat("127.0.0.1:", port), "--json", json, "--", FakeApp(),
                 "--allocs", "8", "--size", "1000000", "--leak", "2", "--oom"}),
            0)
      << stderr_;
  EXPECT_NE(stderr_.find("acknowledged all"), std::string::npos) << stderr_;
  const v1::Report local = ReadReport(json);
  ASSERT_EQ(local.devices_size(), 1);

  const v1::ListProcessesResponse list = core_->ListProcesses(true);
  ASSERT_EQ(list.processes_size(), 1);
  EXPECT_EQ(list.processes(0).process().pid(), local.process().pid());
  EXPECT_TRUE(list.processes(0).finished());
  EXPECT_EQ(list.processes(0).events(), local.events());
  EXPECT_EQ(list.processes(0).peak_reserved_bytes(), local.devices(0).peak_reserved_bytes());

  absl::StatusOr<v1::Report> remote = core_->GetReport(list.processes(0).process());
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_EQ(remote->events(), local.events());
  EXPECT_EQ(remote->finished(), local.finished());
  EXPECT_EQ(remote->exit_code(), local.exit_code());
  ASSERT_EQ(remote->devices_size(), 1);
  const v1::DeviceReport& r = remote->devices(0);
  const v1::DeviceReport& l = local.devices(0);
  EXPECT_EQ(l.peak_requested_bytes(), 8u * 1000000);
  EXPECT_EQ(r.peak_requested_bytes(), l.peak_requested_bytes());
  EXPECT_EQ(r.peak_allocated_bytes(), l.peak_allocated_bytes());
  EXPECT_EQ(r.peak_reserved_bytes(), l.peak_reserved_bytes());
  EXPECT_EQ(r.current_allocated_bytes(), l.current_allocated_bytes());
  EXPECT_EQ(r.alloc_count(), l.alloc_count());
  EXPECT_EQ(r.free_count(), l.free_count());
  EXPECT_EQ(r.ooms_size(), l.ooms_size());
  EXPECT_EQ(r.leaks_size(), l.leaks_size());
  EXPECT_EQ(r.nvtx_ranges_size(), l.nvtx_ranges_size());
}

TEST_F(RunCollectorTest, UnreachableCollectorExits3WithTheLocalReportWritten) {
  const std::string address = absl::StrCat("127.0.0.1:", DeadPort());
  const std::string json = data_.path() + "/unreachable.json";
  EXPECT_EQ(Run({"--collector", address, "--collector-wait", "0.5", "--json", json, "--", FakeApp(),
                 "--allocs", "4"}),
            3);
  EXPECT_NE(stderr_.find("cannot reach the collector at " + address), std::string::npos) << stderr_;
  EXPECT_NE(stderr_.find("peak"), std::string::npos) << stderr_;  // the local report
  const v1::Report local = ReadReport(json);
  ASSERT_EQ(local.devices_size(), 1);
  EXPECT_EQ(local.devices(0).alloc_count(), 4u);

  // CMD's own failure wins over the collector's absence.
  EXPECT_EQ(
      Run({"--collector", address, "--collector-wait", "0.2", "--", FakeApp(), "--exit", "5"}), 5);
  EXPECT_NE(stderr_.find("cannot reach the collector at " + address + " within 200ms"),
            std::string::npos)
      << stderr_;
}

TEST_F(RunCollectorTest, CollectorWaitIsCheckedAndSaidInTheWarning) {
  const std::string address = absl::StrCat("127.0.0.1:", DeadPort());
  EXPECT_EQ(Run({"--collector", address, "--collector-wait", "0", "--", FakeApp()}), 3);
  EXPECT_NE(stderr_.find("within 0"), std::string::npos) << stderr_;
  EXPECT_EQ(Run({"--collector", address, "--collector-wait", "-1", "--", FakeApp()}), 2);
  EXPECT_NE(stderr_.find("--collector-wait"), std::string::npos) << stderr_;
  EXPECT_EQ(Run({"--collector", address, "--collector-wait", "soon", "--", FakeApp()}), 2);
}

TEST_F(RunCollectorTest, ACommandLineThatIsNotUtf8ReachesTheCollectorEscaped) {
  const int port = Serve();
  const std::string json = data_.path() + "/latin1.json";
  // A program run on a Latin-1 file name: the drain escapes it, so the collector takes the
  // batches and the local JSON is valid.
  ASSERT_EQ(Run({"--collector", absl::StrCat("127.0.0.1:", port), "--json", json, "--", FakeApp(),
                 "--allocs", "4", "--file", "out\xE9.txt"}),
            0)
      << stderr_;
  EXPECT_NE(stderr_.find("acknowledged all"), std::string::npos) << stderr_;
  const v1::Report local = ReadReport(json);
  ASSERT_EQ(local.command_line_size(), 5);
  EXPECT_EQ(local.command_line(4), "out\\xE9.txt");
  const v1::ListProcessesResponse list = core_->ListProcesses(true);
  ASSERT_EQ(list.processes_size(), 1);
  ASSERT_EQ(list.processes(0).command_line_size(), 5);
  EXPECT_EQ(list.processes(0).command_line(4), "out\\xE9.txt");
  EXPECT_EQ(list.processes(0).events(), local.events());
}

TEST_F(RunCollectorTest, UsageErrors) {
  EXPECT_EQ(Run({"--collector", "", "--", FakeApp()}), 2);
  EXPECT_EQ(Run({"--collector"}), 2);
}

}  // namespace
}  // namespace vramscope::cli
