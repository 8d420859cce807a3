// The export paths end to end, in process, over run_fake_app (a ring written like the shim's):
// `vramscope run --events E --trace T.pftrace` and `--trace T.json`, then `vramscope export
// --format torch-snapshot` of E (checked by Python's pickle, check_snapshot.py) and `vramscope
// replay` of the pickle; the Perfetto file parses with proto/perfetto/trace.proto and holds one
// slice per allocation; the Chrome trace is strict JSON (json_strict.py) with one async slice per
// allocation; a JSON report given to export, and bad pickles given to replay (truncated, an
// unknown opcode, GLOBAL + REDUCE), exit 2 with a message saying why.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "export/export_command.h"
#include "perfetto/trace.pb.h"
#include "replay/replay_command.h"
#include "run/run_command.h"
#include "run_fixture.h"

namespace vramscope::cli {
namespace {

using testing::FakeApp;

class ExportRunTest : public testing::RunFixture {
 protected:
  // Runs `vramscope VERB ARGS` in process; returns the exit code, keeps stderr in stderr_.
  int Cli(int (*verb)(int, char**), const char* name, std::vector<std::string> args) {
    args.insert(args.begin(), name);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::testing::internal::CaptureStderr();
    ::testing::internal::CaptureStdout();
    const int code = verb(static_cast<int>(args.size()), argv.data());
    stdout_ = ::testing::internal::GetCapturedStdout();
    stderr_ = ::testing::internal::GetCapturedStderr();
    return code;
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static int Python(const std::string& command, std::string* out) {
    FILE* pipe = popen((command + " 2>&1").c_str(), "r");
    if (pipe == nullptr) return -1;
    char buffer[4096];
    for (std::size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) out->append(buffer, n);
    return pclose(pipe);
  }
  std::string stdout_, stderr_;
};

// 12 blocks, 4 never freed: 12 allocs, 8 frees, 4 live at the end, one segment.
TEST_F(ExportRunTest, RunEventsExportAndReplay) {
  const std::string events = File("run.vslog"), pftrace = File("run.pftrace");
  const std::string pickle = File("snap.pickle");
  ASSERT_EQ(Cli(RunRun, "run",
                {"--events", events, "--trace", pftrace, "--", FakeApp(), "--allocs", "12",
                 "--leak", "4"}),
            0)
      << stderr_;
  ASSERT_EQ(Cli(RunExport, "export", {"--format", "torch-snapshot", "-o", pickle, events}), 0)
      << stderr_;
  EXPECT_NE(stderr_.find("12 allocations, 8 frees, 1 segments at the end"), std::string::npos)
      << stderr_;
  std::string out;
  EXPECT_EQ(Python(std::string("python3 ") + getenv("VRAMSCOPE_CHECK_SNAPSHOT") + " " + pickle +
                       " --allocs 12 --live 4 --devices 1",
                   &out),
            0)
      << out;
  ASSERT_EQ(Cli(RunReplay, "replay", {"--json", pickle}), 0) << stderr_;
  EXPECT_NE(stdout_.find("\"alloc_events\": 12"), std::string::npos) << stdout_;
  EXPECT_NE(stdout_.find("\"live_at_end_count\": 4"), std::string::npos) << stdout_;

  perfetto::protos::Trace trace;
  ASSERT_TRUE(trace.ParseFromString(Read(pftrace)));
  int begins = 0, ends = 0, counters = 0;
  for (const auto& packet : trace.packet()) {
    if (!packet.has_track_event()) continue;
    const auto type = packet.track_event().type();
    begins += type == perfetto::protos::TrackEvent::TYPE_SLICE_BEGIN;
    ends += type == perfetto::protos::TrackEvent::TYPE_SLICE_END;
    counters += type == perfetto::protos::TrackEvent::TYPE_COUNTER;
  }
  EXPECT_EQ(begins, 13);  // 12 allocations and the NVTX range "step"
  EXPECT_EQ(ends, 13);
  EXPECT_GT(counters, 0);
}

TEST_F(ExportRunTest, ChromeTraceHoldsTheAllocationsAndIsStrictJson) {
  const std::string json = File("run.json");
  ASSERT_EQ(Cli(RunRun, "run", {"--trace", json, "--", FakeApp(), "--allocs", "5", "--leak", "1"}),
            0)
      << stderr_;
  std::string out;
  EXPECT_EQ(Python(std::string("python3 ") + getenv("VRAMSCOPE_JSON_STRICT") + " " + json, &out), 0)
      << out;
  const std::string text = Read(json);
  std::size_t begins = 0, ends = 0;
  for (std::size_t at = 0; (at = text.find("{\"ph\":\"b\",\"cat\":\"alloc\"", at)) != text.npos;
       ++at) {
    ++begins;
  }
  for (std::size_t at = 0; (at = text.find("{\"ph\":\"e\",\"cat\":\"alloc\"", at)) != text.npos;
       ++at) {
    ++ends;
  }
  EXPECT_EQ(begins, 5u);
  EXPECT_EQ(ends, 5u);
}

TEST_F(ExportRunTest, AReportIsRefusedWithAMessage) {
  const std::string report = File("report.json");
  ASSERT_EQ(Cli(RunRun, "run", {"--json", report, "--", FakeApp()}), 0) << stderr_;
  EXPECT_EQ(Cli(RunExport, "export", {"--format", "torch-snapshot", "-o", File("x"), report}), 2);
  EXPECT_NE(stderr_.find("--events FILE"), std::string::npos) << stderr_;
  EXPECT_EQ(Cli(RunExport, "export", {"--format", "svg", "-o", File("y"), report}), 2);
}

TEST_F(ExportRunTest, UnwritableEventsAndUnreadableLogsExit2) {
  EXPECT_EQ(Cli(RunRun, "run", {"--events", dir_ + "/no/such/dir/run.vslog", "--", FakeApp()}), 2);
  EXPECT_NE(stderr_.find("cannot create"), std::string::npos) << stderr_;
  const std::string text = File("not-a-log");
  std::ofstream(text) << "action,addr,size,stream,time_us,site\n";
  EXPECT_EQ(Cli(RunExport, "export", {"--format", "torch-snapshot", "-o", File("z"), text}), 2);
  EXPECT_NE(stderr_.find("not-a-log"), std::string::npos) << stderr_;
  EXPECT_EQ(Cli(RunExport, "export",
                {"--format", "torch-snapshot", "-o", File("w"), dir_ + "/missing.vslog"}),
            2);
}

TEST_F(ExportRunTest, BadPicklesExit2WithTheReason) {
  const std::pair<std::string, std::string> cases[] = {
      {std::string("\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c", 15), "truncated"},
      {std::string("\x80\x02\xf0.", 4), "0xf0"},
      {std::string("\x80\x02"
                   "cos\nsystem\n"
                   "X\x02\x00\x00\x00idtR.",
                   23),
       "GLOBAL"},
      {std::string("\x80\x02}.", 4), "device_traces"},
  };
  for (const auto& [bytes, reason] : cases) {
    const std::string path = File("bad.pickle");
    std::ofstream(path, std::ios::binary) << bytes;
    EXPECT_EQ(Cli(RunReplay, "replay", {path}), 2) << reason;
    EXPECT_NE(stderr_.find(reason), std::string::npos) << stderr_;
  }
}

}  // namespace
}  // namespace vramscope::cli
