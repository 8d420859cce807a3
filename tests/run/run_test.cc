// `vramscope run` end to end, in process: the fake application (run_fake_app, which writes a ring
// like the shim) under RunRun, with a dummy shim preloaded. Exit status passthrough, the
// --max-peak gate, --json and --trace parsed back, children traced, usage errors.
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <google/protobuf/struct.pb.h>

#include "run/run_command.h"
#include "run_fixture.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {
namespace {

using testing::FakeApp;

class RunTest : public testing::RunFixture {
 protected:
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
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static v1::Report ParseReport(const std::string& json) {
    v1::Report report;
    const auto status = google::protobuf::util::JsonStringToMessage(json, &report);
    EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
    return report;
  }

  std::string stderr_;
};

TEST_F(RunTest, ReportsPeaksAndPassesExitStatus) {
  const std::string json = File("report.json");
  EXPECT_EQ(
      Run({"--json", json, "--", FakeApp(), "--allocs", "8", "--size", "1000000", "--exit", "3"}),
      3);
  const v1::Report report = ParseReport(Read(json));
  EXPECT_TRUE(report.finished());
  EXPECT_EQ(report.exit_code(), 3);
  ASSERT_EQ(report.devices_size(), 1);
  const v1::DeviceReport& d = report.devices(0);
  EXPECT_EQ(d.device().name(), "Fake GPU");
  EXPECT_EQ(d.peak_requested_bytes(), 8u * 1000000);
  EXPECT_EQ(d.peak_allocated_bytes(), 8u * 1000448);  // 1000000 rounded up to 512
  EXPECT_EQ(d.peak_reserved_bytes(), 8u << 20);       // 8 MB rounded up to 2 MiB
  EXPECT_EQ(d.alloc_count(), 8u);
  EXPECT_EQ(d.free_count(), 8u);
  ASSERT_EQ(d.nvtx_ranges_size(), 1);
  EXPECT_EQ(d.nvtx_ranges(0).name(), "step");
  EXPECT_EQ(d.nvtx_ranges(0).peak_allocated_bytes(), 8u * 1000448);
  EXPECT_EQ(d.leaks_size(), 0);
  EXPECT_NE(stderr_.find("peak"), std::string::npos) << stderr_;
  EXPECT_NE(stderr_.find("Fake GPU"), std::string::npos) << stderr_;
  // JSON uses the proto field names.
  EXPECT_NE(Read(json).find("\"peak_reserved_bytes\""), std::string::npos);
}

TEST_F(RunTest, SignalBecomes128PlusNAndTheRingIsStillRead) {
  const std::string json = File("killed.json");
  EXPECT_EQ(Run({"--json", json, FakeApp(), "--allocs", "4", "--leak", "2", "--signal", "9"}),
            128 + 9);
  const v1::Report report = ParseReport(Read(json));
  EXPECT_TRUE(report.finished());
  ASSERT_EQ(report.devices_size(), 1);
  EXPECT_EQ(report.devices(0).alloc_count(), 4u);
  EXPECT_EQ(report.devices(0).leaks_size(), 2);  // live when it died
}

TEST_F(RunTest, MaxPeakGate) {
  // Peak reserved: 10 x 1 MiB -> 10 MiB.
  EXPECT_EQ(Run({"--max-peak", "8MiB", "--", FakeApp()}), 1);
  EXPECT_NE(stderr_.find("exceeds --max-peak"), std::string::npos) << stderr_;
  EXPECT_EQ(Run({"--max-peak", "10MiB", "--", FakeApp()}), 0);
  EXPECT_EQ(Run({"--max-peak=1.5GB", "--", FakeApp()}), 0);
  EXPECT_EQ(Run({"--max-peak", "10485759", "--", FakeApp()}), 1);
  // The command's own failure wins over the gate.
  EXPECT_EQ(Run({"--max-peak", "1KiB", "--", FakeApp(), "--exit", "5"}), 5);
  EXPECT_EQ(Run({"--max-peak", "lots", "--", FakeApp()}), 2);
  EXPECT_NE(stderr_.find("not a size"), std::string::npos) << stderr_;
}

TEST_F(RunTest, ChildProcessesAreTracedToo) {
  const std::string json = File("children.json");
  EXPECT_EQ(Run({"--json", json, "--", FakeApp(), "--fork", "--allocs", "6"}), 0);
  google::protobuf::Struct doc;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(Read(json), &doc).ok());
  const google::protobuf::ListValue& list = doc.fields().at("reports").list_value();
  ASSERT_EQ(list.values_size(), 2);
  std::vector<std::uint64_t> allocs;
  for (const google::protobuf::Value& value : list.values()) {
    std::string one;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(value, &one).ok());
    const v1::Report report = ParseReport(one);
    ASSERT_EQ(report.devices_size(), 1);
    allocs.push_back(report.devices(0).alloc_count());
  }
  std::sort(allocs.begin(), allocs.end());
  EXPECT_EQ(allocs, (std::vector<std::uint64_t>{3, 6}));
}

TEST_F(RunTest, TraceIsChromeJsonWithCountersSlicesAndInstants) {
  const std::string trace = File("trace.json");
  EXPECT_EQ(Run({"--trace", trace, "--", FakeApp(), "--oom"}), 0);
  google::protobuf::Struct doc;
  const std::string text = Read(trace);
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text, &doc).ok()) << text;
  const google::protobuf::ListValue& events = doc.fields().at("traceEvents").list_value();
  int metadata = 0, allocated = 0, reserved = 0, slices = 0, instants = 0;
  for (const google::protobuf::Value& v : events.values()) {
    const auto& f = v.struct_value().fields();
    const std::string ph = f.at("ph").string_value();
    const std::string name = f.at("name").string_value();
    ASSERT_TRUE(f.contains("pid"));
    if (ph == "M") {
      ++metadata;
      EXPECT_EQ(name, "process_name");
    } else if (ph == "C") {
      ASSERT_TRUE(f.contains("ts"));
      EXPECT_TRUE(f.at("args").struct_value().fields().contains("bytes"));
      allocated += name == "cuda:0 allocated";
      reserved += name == "cuda:0 reserved";
    } else if (ph == "X") {
      ++slices;
      EXPECT_EQ(name, "step");
      EXPECT_GE(f.at("dur").number_value(), 0);
      EXPECT_TRUE(f.contains("tid"));
    } else if (ph == "i") {
      ++instants;
      EXPECT_EQ(name, "OOM cuda:0");
    }
  }
  EXPECT_EQ(metadata, 1);
  EXPECT_GT(allocated, 0);
  EXPECT_EQ(allocated, reserved);
  EXPECT_EQ(slices, 1);
  EXPECT_EQ(instants, 1);
}

TEST_F(RunTest, UsageErrors) {
  EXPECT_EQ(Run({}), 2);
  EXPECT_NE(stderr_.find("no command"), std::string::npos);
  EXPECT_EQ(Run({"--bogus", "--", "true"}), 2);
  EXPECT_EQ(Run({"--json"}), 2);
  EXPECT_EQ(Run({"--help"}), 0);
}

TEST_F(RunTest, CommandThatCannotStart) {
  EXPECT_EQ(Run({"--", dir_ + "/no-such-program"}), 127);
  EXPECT_NE(stderr_.find("cannot run"), std::string::npos) << stderr_;
}

TEST_F(RunTest, ProgramWithoutRingsStillPassesThrough) {
  EXPECT_EQ(Run({"--", "sh", "-c", "exit 4"}), 4);
  EXPECT_NE(stderr_.find("no process wrote an event ring"), std::string::npos) << stderr_;
}

}  // namespace
}  // namespace vramscope::cli
