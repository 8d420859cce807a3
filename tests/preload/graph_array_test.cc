// CUDA arrays and graph memory through the real shim over the fake driver (meson runs this file
// once per mode, VRAMSCOPE_MODE pool or passthrough): graph_array_app (VRAMSCOPE_GRAPH_APP) does
// the work by each route and writes what the fake holds; the shim's VRAMSCOPE_SUMMARY line and
// `vramscope run`'s report (VRAMSCOPE_EXE) must say the same, per kind and per device. The app
// itself checks that errors come back as the fake's own (exit status 10).
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "tests/collector/test_util.h"
#include "vramscope/v1/report.pb.h"

namespace {

using vramscope::testing::Env;
using vramscope::testing::ReadFigures;
using vramscope::testing::ReadFile;

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

// current/peak/count of one kind in the summary line; false if absent.
struct KindFigures {
  std::uint64_t current = 0, peak = 0, count = 0;
};
bool SummaryKind(const std::string& summary, const std::string& kind, KindFigures* out) {
  std::smatch match;
  if (!std::regex_search(summary, match, std::regex(" " + kind + R"(=(\d+)/(\d+)/(\d+))"))) {
    return false;
  }
  out->current = std::stoull(match[1]);
  out->peak = std::stoull(match[2]);
  out->count = std::stoull(match[3]);
  return true;
}

class GraphArrayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(Env("VRAMSCOPE_GRAPH_APP").empty()) << "meson sets VRAMSCOPE_GRAPH_APP";
    ASSERT_FALSE(Env("VRAMSCOPE_SHIM").empty());
    char pattern[] = "/tmp/vramscope-graph-array-test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    for (const char* name : {"report.json", "out.txt", "stderr.txt", "stdout.txt"}) {
      unlink((dir_ + "/" + name).c_str());
    }
    rmdir(dir_.c_str());
  }

  // Runs `sh -c COMMAND`, stdout and stderr kept; returns the exit status.
  int Shell(const std::string& command) {
    const int status =
        system((command + " >" + dir_ + "/stdout.txt 2>" + dir_ + "/stderr.txt").c_str());
    stdout_ = ReadFile(dir_ + "/stdout.txt");
    stderr_ = ReadFile(dir_ + "/stderr.txt");
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  }
  // The app by `route` under the shim with the summary line; returns the line.
  std::string RunWithSummary(const std::string& route, const std::string& extra_env = "") {
    const int status = Shell("LD_PRELOAD=${LD_PRELOAD:+$LD_PRELOAD:}" + Env("VRAMSCOPE_SHIM") +
                             " VRAMSCOPE_SUMMARY=1 " + extra_env + " " +
                             Env("VRAMSCOPE_GRAPH_APP") + " " + route + " " + Out());
    EXPECT_EQ(status, 0) << route << ": " << stderr_;
    std::smatch match;
    if (!std::regex_search(stderr_, match, std::regex(R"(vramscope: mode=[^\n]*)"))) return "";
    return match.str(0);
  }
  std::string Out() const { return dir_ + "/out.txt"; }
  std::string Json() const { return dir_ + "/report.json"; }

  std::string dir_;
  std::string stdout_;
  std::string stderr_;
};

// The summary's array= and graph= kinds and the passthrough device memory equal what the fake
// charged, whichever route the program took to the driver.
TEST_F(GraphArrayTest, SummaryEqualsWhatTheDriverHoldsByEveryRoute) {
  for (const char* route : {"direct", "dlsym", "procaddress"}) {
    SCOPED_TRACE(route);
    const std::string summary = RunWithSummary(route);
    ASSERT_FALSE(summary.empty()) << stderr_;
    const auto fake = ReadFigures(Out());
    KindFigures array;
    KindFigures graph;
    ASSERT_TRUE(SummaryKind(summary, "array", &array)) << summary;
    ASSERT_TRUE(SummaryKind(summary, "graph", &graph)) << summary;
    // Arrays: the driver's sizes (the fake answers cuArrayGetMemoryRequirements); two of three
    // destroyed.
    EXPECT_EQ(array.current, fake.at("array_final")) << summary;
    EXPECT_EQ(array.peak, fake.at("array_peak")) << summary;
    EXPECT_EQ(array.count, 3u) << summary;
    // Graph pools of both devices: 5 MiB left on device 0, 8 MiB on device 1.
    EXPECT_EQ(fake.at("graph_final_dev0"), 5 * kMiB);
    EXPECT_EQ(fake.at("graph_final_dev1"), 8 * kMiB);
    EXPECT_EQ(graph.current, fake.at("graph_final_dev0") + fake.at("graph_final_dev1")) << summary;
    EXPECT_EQ(graph.peak, fake.at("graph_peak")) << summary;
    // Nothing else took device memory: the passthrough total is everything the fake charged.
    std::smatch match;
    ASSERT_TRUE(std::regex_search(summary, match, std::regex(R"( current_device_memory=(\d+))")))
        << summary;
    EXPECT_EQ(std::stoull(match[1]), fake.at("live_final_dev0") + fake.at("live_final_dev1"))
        << summary;
  }
}

// Graph launches, destroys and trims from four threads at once (graph_array_app threads): each
// refresh reads the pool under its device's lock, so the last figure recorded is the pool's last.
TEST_F(GraphArrayTest, ConcurrentLaunchesAndTrimsEndOnTheDriversFigure) {
  const int status =
      Shell("LD_PRELOAD=${LD_PRELOAD:+$LD_PRELOAD:}" + Env("VRAMSCOPE_SHIM") +
            " VRAMSCOPE_SUMMARY=1 " + Env("VRAMSCOPE_GRAPH_APP") + " direct " + Out() + " threads");
  ASSERT_EQ(status, 0) << stderr_;
  const auto fake = ReadFigures(Out());
  KindFigures graph;
  ASSERT_TRUE(SummaryKind(stderr_, "graph", &graph)) << stderr_;
  EXPECT_EQ(fake.at("graph_final_dev0"), 7 * kMiB);  // threads 2 and 3: 3 + 4 MiB live
  EXPECT_EQ(graph.current, fake.at("graph_final_dev0")) << stderr_;
  EXPECT_GE(graph.peak, graph.current);
}

// When the driver answers array memory requirements only for deferred-mapping arrays (as it
// documents), the size comes from the descriptor: texels x bytes per texel over mip levels.
TEST_F(GraphArrayTest, ArraySizeFallsBackToTheDescriptor) {
  const std::string summary =
      RunWithSummary("direct", "VRAMSCOPE_FAKE_ARRAY_REQUIREMENTS=deferred");
  ASSERT_FALSE(summary.empty()) << stderr_;
  const auto fake = ReadFigures(Out());
  KindFigures array;
  ASSERT_TRUE(SummaryKind(summary, "array", &array)) << summary;
  const std::uint64_t a2 = fake.at("array_requested_2d");  // 1000 x 100 floats
  const std::uint64_t a3 = fake.at("array_requested_3d");  // 64 x 32 x 16 RGBA8
  // Mipmapped 64 x 32 x 16 RGBA8, 4 levels: each halves every extent.
  const std::uint64_t mip = a3 + 32 * 16 * 8 * 4 + 16 * 8 * 4 * 4 + 8 * 4 * 2 * 4;
  EXPECT_EQ(array.current, a3) << summary;
  EXPECT_EQ(array.peak, a2 + a3 + mip) << summary;
  EXPECT_LT(array.peak, fake.at("array_peak")) << "the descriptor is a lower bound";
}

// `vramscope run`: the report names the kinds per device (array, graph), its reserved figures
// equal what the fake charged on each device, and the live array and graph pools are listed as
// not freed at exit.
TEST_F(GraphArrayTest, ReportShowsArraysAndGraphMemoryPerDevice) {
  ASSERT_FALSE(Env("VRAMSCOPE_EXE").empty());
  ASSERT_EQ(Shell(Env("VRAMSCOPE_EXE") + " run --json " + Json() + " -- " +
                  Env("VRAMSCOPE_GRAPH_APP") + " direct " + Out()),
            0)
      << stderr_;
  const auto fake = ReadFigures(Out());
  vramscope::v1::Report report;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ReadFile(Json()), &report).ok())
      << ReadFile(Json());
  const vramscope::v1::DeviceReport* dev[2] = {nullptr, nullptr};
  for (const auto& d : report.devices()) {
    if (d.device().ordinal() < 2) dev[d.device().ordinal()] = &d;
  }
  ASSERT_NE(dev[0], nullptr) << ReadFile(Json());
  ASSERT_NE(dev[1], nullptr) << ReadFile(Json());
  const auto& kinds0 = dev[0]->peak_bytes_by_kind();
  ASSERT_EQ(kinds0.count("array"), 1u) << ReadFile(Json());
  ASSERT_EQ(kinds0.count("graph"), 1u) << ReadFile(Json());
  EXPECT_EQ(kinds0.at("array"), fake.at("array_peak"));
  EXPECT_EQ(kinds0.at("graph"), fake.at("graph_peak_dev0"));
  EXPECT_EQ(dev[1]->peak_bytes_by_kind().at("graph"), fake.at("graph_peak_dev1"));
  EXPECT_EQ(dev[1]->peak_bytes_by_kind().count("array"), 0u);
  // The totals add up: reserved is everything the driver holds, per device.
  EXPECT_EQ(dev[0]->current_reserved_bytes(), fake.at("live_final_dev0"));
  EXPECT_EQ(dev[1]->current_reserved_bytes(), fake.at("live_final_dev1"));
  EXPECT_EQ(dev[0]->peak_reserved_bytes(), fake.at("live_peak_dev0"));
  EXPECT_EQ(dev[0]->dropped_records(), 0u);
  int array_leaks = 0;
  int graph_leaks = 0;
  for (const auto& leak : dev[0]->leaks()) {
    array_leaks += leak.kind() == vramscope::v1::ALLOCATION_KIND_ARRAY;
    graph_leaks += leak.kind() == vramscope::v1::ALLOCATION_KIND_GRAPH;
  }
  EXPECT_EQ(array_leaks, 1) << ReadFile(Json());
  EXPECT_EQ(graph_leaks, 1) << ReadFile(Json());
  // The text report names them too: device 0's line has both kinds, device 1's its graph pool.
  EXPECT_NE(stderr_.find("    peak by kind: array "), std::string::npos) << stderr_;
  EXPECT_NE(stderr_.find("    peak by kind: graph 8.00 MiB\n"), std::string::npos) << stderr_;
}

}  // namespace
