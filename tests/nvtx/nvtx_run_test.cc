// NVTX ranges and allocation sites end to end: `vramscope run` over nvtx_app (real NVTX v3
// headers, two domains, two threads, a second NVTX copy in a shared library; see nvtx_app.cc
// for the timeline) on the fake driver. Checks the report's exact per-range figures, the Chrome
// trace's slices, and with --stacks the resolved allocation sites and the folded-stacks file.
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>

#include "tests/collector/test_util.h"
#include "vramscope/v1/report.pb.h"

namespace {

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * kKiB;

using vramscope::testing::Env;
using vramscope::testing::ReadFile;

class NvtxRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(Env("VRAMSCOPE_EXE").empty()) << "meson sets VRAMSCOPE_EXE";
    ASSERT_FALSE(Env("VRAMSCOPE_NVTX_APP").empty());
    char pattern[] = "/tmp/vramscope-nvtx-test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    for (const char* name : {"report.json", "trace.json", "folded.txt", "stderr.txt"}) {
      unlink((dir_ + "/" + name).c_str());
    }
    rmdir(dir_.c_str());
  }

  // `vramscope run OPTIONS -- nvtx_app`; returns its exit status, the report parsed.
  int Run(const std::string& options, vramscope::v1::Report* report) {
    const std::string err = dir_ + "/stderr.txt";
    const std::string command = Env("VRAMSCOPE_EXE") + " run --json " + Path("report.json") + " " +
                                options + " -- " + Env("VRAMSCOPE_NVTX_APP") + " 2>" + err;
    const int status = system(command.c_str());
    stderr_ = ReadFile(err);
    google::protobuf::util::JsonParseOptions parse;
    const auto parsed =
        google::protobuf::util::JsonStringToMessage(ReadFile(Path("report.json")), report, parse);
    EXPECT_TRUE(parsed.ok()) << parsed.ToString() << "\n" << stderr_;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  }
  std::string Path(const char* name) const { return dir_ + "/" + name; }

  std::string dir_;
  std::string stderr_;
};

const vramscope::v1::DeviceReport* Device0(const vramscope::v1::Report& report) {
  for (const auto& device : report.devices()) {
    if (device.device().ordinal() == 0) return &device;
  }
  return nullptr;
}

// The figures of nvtx_app.cc's timeline, checked on `device`.
void ExpectRanges(const vramscope::v1::DeviceReport& device) {
  struct Expected {
    std::uint64_t count;
    std::uint64_t peak;
    std::int64_t net;
    std::uint64_t allocs;
  };
  // (name, domain) -> figures; see nvtx_app.cc.
  const std::map<std::pair<std::string, std::string>, Expected> expected = {
      {{"phase_a", ""}, {1, 3 * kMiB, static_cast<std::int64_t>(kMiB), 1}},
      {{"step", "vs.outer"}, {2, 3 * kMiB, 0, 2}},
      {{"worker", "vs.inner"}, {1, 4 * kMiB + 512 * kKiB, 512 * kKiB, 1}},
      {{"inner_\u00fc", "vs.inner"}, {1, 4 * kMiB + 512 * kKiB, 512 * kKiB, 1}},
      {{"span", ""}, {1, 8 * kKiB, 0, 1}},
      {{"lib_phase", ""}, {1, 64 * kKiB, 0, 1}},
      {{"t1", ""}, {1, 2 * kMiB, static_cast<std::int64_t>(2 * kMiB), 1}},
      {{"t2", ""}, {1, 2 * kMiB, static_cast<std::int64_t>(2 * kMiB), 1}},
  };
  std::map<std::pair<std::string, std::string>, const vramscope::v1::NvtxRangeStats*> got;
  for (const auto& range : device.nvtx_ranges()) got[{range.name(), range.domain()}] = &range;
  EXPECT_EQ(got.size(), expected.size()) << device.DebugString();
  for (const auto& [key, want] : expected) {
    auto it = got.find(key);
    ASSERT_NE(it, got.end()) << key.first << " / " << key.second << " missing\n"
                             << device.DebugString();
    const vramscope::v1::NvtxRangeStats& range = *it->second;
    SCOPED_TRACE(key.first + " / " + key.second);
    EXPECT_EQ(range.count(), want.count);
    EXPECT_EQ(range.peak_allocated_bytes(), want.peak);
    EXPECT_EQ(range.net_growth_bytes(), want.net);
    EXPECT_EQ(range.alloc_count(), want.allocs);
  }
}

TEST_F(NvtxRunTest, PerRangePeakNetGrowthAndCountsAreExact) {
  vramscope::v1::Report report;
  ASSERT_EQ(Run("--no-stacks --trace " + Path("trace.json"), &report), 0) << stderr_;
  const vramscope::v1::DeviceReport* device = Device0(report);
  ASSERT_NE(device, nullptr) << stderr_;
  ExpectRanges(*device);
  // Stacks were turned off: no sites.
  EXPECT_EQ(device->top_sites_size(), 0);

  // The trace: every range instance is a complete slice; the worker's on another thread.
  const std::string trace = ReadFile(Path("trace.json"));
  auto slices = [&](const std::string& name) {
    std::size_t n = 0;
    for (std::size_t at = trace.find("\"name\":\"" + name + "\""); at != std::string::npos;
         at = trace.find("\"name\":\"" + name + "\"", at + 1)) {
      ++n;
    }
    return n;
  };
  EXPECT_EQ(slices("phase_a"), 1u) << trace;
  EXPECT_EQ(slices("step"), 2u);
  EXPECT_EQ(slices("worker"), 1u);
  EXPECT_EQ(slices("span"), 1u);
  EXPECT_EQ(slices("lib_phase"), 1u);
  EXPECT_NE(trace.find("\"ph\":\"X\""), std::string::npos);
}

TEST_F(NvtxRunTest, PassthroughAllocationsCarryRangesAndSites) {
  // The passthrough path (registry.cc) names the innermost range and the site as the pool does;
  // `vramscope run` records stacks without being asked.
  setenv("VRAMSCOPE_MODE", "passthrough", 1);
  vramscope::v1::Report report;
  const int status = Run("", &report);
  unsetenv("VRAMSCOPE_MODE");
  ASSERT_EQ(status, 0) << stderr_;
  EXPECT_EQ(report.mode(), "passthrough");
  const vramscope::v1::DeviceReport* device = Device0(report);
  ASSERT_NE(device, nullptr) << stderr_;
  ExpectRanges(*device);
  std::uint64_t allocs = 0;
  for (const auto& site : device->top_sites()) {
    allocs += site.alloc_count();
    ASSERT_GT(site.frames_size(), 0) << site.DebugString();
    // Every allocation is made in AllocateBlock, except lib_phase's (libnvtx_copy.so).
    EXPECT_TRUE(site.frames(0).find("AllocateBlock") != std::string::npos ||
                site.frames(0).find("NvtxCopyPhase (") != std::string::npos)
        << site.DebugString();
  }
  EXPECT_EQ(allocs, 9u) << device->DebugString();
}

TEST_F(NvtxRunTest, UserNvtxInjectionPathIsKept) {
  // A tool of the user's own already holds NVTX: vramscope leaves it alone (here: a path that
  // does not load, so NVTX falls back to no-ops and no range arrives; the run still works).
  vramscope::v1::Report report;
  ASSERT_EQ(Run("", &report), 0) << stderr_;
  setenv("NVTX_INJECTION64_PATH", "/nonexistent/libtool.so", 1);
  vramscope::v1::Report other;
  const int status = Run("", &other);
  unsetenv("NVTX_INJECTION64_PATH");
  ASSERT_EQ(status, 0) << stderr_;
  const vramscope::v1::DeviceReport* device = Device0(other);
  ASSERT_NE(device, nullptr);
  EXPECT_EQ(device->nvtx_ranges_size(), 0) << device->DebugString();
  EXPECT_GT(Device0(report)->nvtx_ranges_size(), 0);
}

TEST_F(NvtxRunTest, StacksGiveResolvedSitesAndFoldedFile) {
  vramscope::v1::Report report;
  ASSERT_EQ(Run("--folded " + Path("folded.txt"), &report), 0) << stderr_;
  const vramscope::v1::DeviceReport* device = Device0(report);
  ASSERT_NE(device, nullptr);
  ASSERT_GT(device->top_sites_size(), 0) << stderr_;
  // The worker's 4 MiB block is the largest peak: the top site, resolved into nvtx_app's
  // functions (innermost first) with file and line.
  const vramscope::v1::SiteStats& top = device->top_sites(0);
  EXPECT_EQ(top.peak_live_bytes(), 4 * kMiB) << top.DebugString();
  EXPECT_EQ(top.alloc_count(), 1u);
  ASSERT_GE(top.frames_size(), 3) << top.DebugString();
  EXPECT_NE(top.frames(0).find("AllocateBlock"), std::string::npos) << top.DebugString();
  EXPECT_NE(top.frames(0).find("nvtx_app.cc:"), std::string::npos) << top.DebugString();
  EXPECT_NE(top.frames(1).find("AllocateInWorker"), std::string::npos) << top.DebugString();
  bool worker = false;
  for (const std::string& frame : top.frames()) {
    worker |= frame.find("Worker()") != std::string::npos;
  }
  EXPECT_TRUE(worker) << top.DebugString();
  std::uint64_t total = 0;
  std::uint64_t allocs = 0;
  for (const auto& site : device->top_sites()) {
    total += site.total_bytes();
    allocs += site.alloc_count();
  }
  // A, B, C, D, E, F, G, X, Y: every allocation has a site.
  EXPECT_EQ(allocs, 9u);
  EXPECT_EQ(total, 1 * kMiB + 2 * kMiB + 4 * kMiB + 512 * kKiB + 256 * kKiB + 8 * kKiB + 64 * kKiB +
                       2 * kMiB);

  // By calling library: nvtx_app's own peak is the worker's C + D; G is libnvtx_copy.so's.
  // Each site is defined by the thread that allocates from it first, so none is unresolved.
  std::map<std::string, std::uint64_t> libraries(device->peak_requested_bytes_by_library().begin(),
                                                 device->peak_requested_bytes_by_library().end());
  const std::map<std::string, std::uint64_t> expected_libraries = {
      {"nvtx_app", 4 * kMiB + 512 * kKiB}, {"libnvtx_copy.so", 64 * kKiB}};
  EXPECT_EQ(libraries, expected_libraries) << device->DebugString();
  EXPECT_EQ(device->unattributed_peak_requested_bytes(), 0u);
  EXPECT_NE(stderr_.find("    peak requested by calling library (each its own peak):\n"
                         "      4.50 MiB   nvtx_app\n"
                         "      64.0 KiB   libnvtx_copy.so\n"),
            std::string::npos)
      << stderr_;

  // Folded: outermost first, weight = total bytes, frames are functions (so the worker's two
  // call sites, C and D, are one stack of 4.5 MiB ending in AllocateInWorker;AllocateBlock).
  const std::string folded = ReadFile(Path("folded.txt"));
  std::istringstream lines(folded);
  std::string line;
  bool found = false;
  std::uint64_t folded_total = 0;
  while (std::getline(lines, line)) {
    const std::size_t space = line.rfind(' ');
    ASSERT_NE(space, std::string::npos) << line;
    const std::uint64_t bytes = std::stoull(line.substr(space + 1));
    folded_total += bytes;
    const std::string stack = line.substr(0, space);
    if (bytes == 4 * kMiB + 512 * kKiB) {
      found = true;
      EXPECT_NE(stack.find("Worker()"), std::string::npos) << stack;
      const std::size_t in_worker = stack.find("AllocateInWorker");
      ASSERT_NE(in_worker, std::string::npos) << stack;
      EXPECT_NE(stack.find(";", in_worker), std::string::npos) << stack;
      EXPECT_NE(stack.rfind("AllocateBlock"), std::string::npos) << stack;
      EXPECT_GT(stack.rfind("AllocateBlock"), in_worker) << stack;
      EXPECT_EQ(stack.find("nvtx_app.cc"), std::string::npos) << "folded frames are functions";
    }
  }
  EXPECT_TRUE(found) << folded;
  EXPECT_EQ(folded_total, total);
}

}  // namespace
