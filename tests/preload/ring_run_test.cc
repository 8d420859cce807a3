// The shim's event ring end to end: `vramscope run --json FILE -- ring_app MODE` over the fake
// driver, and the report's figures checked against what ring_app did (sizes known in advance,
// the fake's charged bytes for reserved). Also: a forked child is reported as its own process,
// and an unusable VRAMSCOPE_RING_DIR costs one warning and nothing else.
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
#include <vector>

#include <google/protobuf/struct.pb.h>

#include "tests/collector/test_util.h"
#include "vramscope/v1/report.pb.h"

namespace {

using vramscope::testing::Env;
using vramscope::testing::ReadFigures;
using vramscope::testing::ReadFile;

std::uint64_t RoundUp512(std::uint64_t bytes) { return (bytes + 511) / 512 * 512; }

class RingRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(Env("VRAMSCOPE_EXE").empty()) << "meson sets VRAMSCOPE_EXE";
    ASSERT_FALSE(Env("VRAMSCOPE_RING_APP").empty());
    ASSERT_FALSE(Env("VRAMSCOPE_SHIM").empty());
    char pattern[] = "/tmp/vramscope-ring-run-test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    for (const char* name : {"report.json", "out.txt", "stderr.txt"}) {
      unlink((dir_ + "/" + name).c_str());
    }
    rmdir(dir_.c_str());
  }

  // Runs `sh -c COMMAND` with stderr into stderr_; returns the exit status.
  int Shell(const std::string& command) {
    const std::string err = dir_ + "/stderr.txt";
    const int status = system((command + " 2>" + err).c_str());
    stderr_ = ReadFile(err);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  }
  int RunUnderVramscope(const std::string& mode, const std::string& extra_env = "") {
    return Shell(extra_env + " " + Env("VRAMSCOPE_EXE") + " run --json " + Json() + " -- " +
                 Env("VRAMSCOPE_RING_APP") + " " + mode + " " + Out());
  }
  std::string Json() const { return dir_ + "/report.json"; }
  std::string Out() const { return dir_ + "/out.txt"; }

  std::vector<vramscope::v1::Report> Reports() {
    const std::string json = ReadFile(Json());
    std::vector<vramscope::v1::Report> reports;
    if (json.find("\"reports\"") != std::string::npos) {
      // {"reports": [Report, ...]}: no message type; each element is a Report's JSON.
      google::protobuf::Struct wrapper;
      EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &wrapper).ok()) << json;
      for (const auto& value : wrapper.fields().at("reports").list_value().values()) {
        std::string one;
        EXPECT_TRUE(google::protobuf::util::MessageToJsonString(value, &one).ok());
        vramscope::v1::Report report;
        EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(one, &report).ok()) << one;
        reports.push_back(report);
      }
    } else {
      vramscope::v1::Report report;
      EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &report).ok()) << json;
      reports.push_back(report);
    }
    return reports;
  }

  std::string dir_;
  std::string stderr_;
};

const vramscope::v1::DeviceReport* Device0(const vramscope::v1::Report& report) {
  for (const auto& device : report.devices()) {
    if (device.device().ordinal() == 0) return &device;
  }
  return nullptr;
}

TEST_F(RingRunTest, PooledPeaksCountsAndLeakAreExact) {
  ASSERT_EQ(RunUnderVramscope("basic"), 3) << stderr_;
  const auto figures = ReadFigures(Out());
  ASSERT_GT(figures.at("peak_driver_bytes"), 0u);
  const auto reports = Reports();
  ASSERT_EQ(reports.size(), 1u) << stderr_;
  const vramscope::v1::Report& report = reports[0];
  EXPECT_TRUE(report.finished());
  EXPECT_EQ(report.exit_code(), 3);
  EXPECT_EQ(report.mode(), "pool");
  const vramscope::v1::DeviceReport* d = Device0(report);
  ASSERT_NE(d, nullptr) << ReadFile(Json());
  const std::uint64_t big = (std::uint64_t{1} << 20) + 1;
  EXPECT_EQ(d->peak_requested_bytes(), 1000 + 3000 + big);
  EXPECT_EQ(d->peak_allocated_bytes(), RoundUp512(1000) + RoundUp512(3000) + RoundUp512(big));
  EXPECT_EQ(d->peak_reserved_bytes(), figures.at("peak_driver_bytes"));
  EXPECT_EQ(d->current_requested_bytes(), 5000u);
  EXPECT_EQ(d->current_allocated_bytes(), RoundUp512(5000));
  EXPECT_EQ(d->alloc_count(), 4u);
  EXPECT_EQ(d->free_count(), 3u);
  EXPECT_GE(d->pool_reserve_count(), 1u);
  EXPECT_EQ(d->dropped_records(), 0u);
  ASSERT_EQ(d->leaks_size(), 1);
  EXPECT_EQ(d->leaks(0).requested_bytes(), 5000u);
  EXPECT_EQ(d->device().name(), "vramscope fake GPU 0");
  EXPECT_GT(d->device().total_memory_bytes(), 0u);
}

TEST_F(RingRunTest, PooledFiguresHoldOverSegments) {
  ASSERT_EQ(RunUnderVramscope("basic", "VRAMSCOPE_VMM=0"), 3) << stderr_;
  const auto reports = Reports();
  ASSERT_EQ(reports.size(), 1u);
  const vramscope::v1::DeviceReport* d = Device0(reports[0]);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->peak_requested_bytes(), 1000 + 3000 + (std::uint64_t{1} << 20) + 1);
  EXPECT_EQ(d->peak_reserved_bytes(), ReadFigures(Out()).at("peak_driver_bytes"));
  EXPECT_EQ(d->alloc_count(), 4u);
  EXPECT_EQ(d->free_count(), 3u);
  EXPECT_EQ(d->leaks_size(), 1);
}

TEST_F(RingRunTest, PassthroughModeRecordsDriverAllocations) {
  ASSERT_EQ(RunUnderVramscope("basic", "VRAMSCOPE_MODE=passthrough"), 3) << stderr_;
  const auto reports = Reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].mode(), "passthrough");
  const vramscope::v1::DeviceReport* d = Device0(reports[0]);
  ASSERT_NE(d, nullptr);
  // The driver's own allocations: requested = allocated = reserved.
  const std::uint64_t peak = 1000 + 3000 + (std::uint64_t{1} << 20) + 1;
  EXPECT_EQ(d->peak_requested_bytes(), peak);
  EXPECT_EQ(d->peak_allocated_bytes(), peak);
  EXPECT_EQ(d->peak_reserved_bytes(), peak);
  EXPECT_EQ(d->current_reserved_bytes(), 5000u);
  EXPECT_EQ(d->alloc_count(), 4u);
  EXPECT_EQ(d->free_count(), 3u);
  EXPECT_EQ(d->pool_reserve_count(), 0u);
  ASSERT_EQ(d->leaks_size(), 1);
  EXPECT_EQ(d->leaks(0).requested_bytes(), 5000u);
}

TEST_F(RingRunTest, PassthroughKindsFollowTheByteRule) {
  ASSERT_EQ(RunUnderVramscope("kinds"), 0) << stderr_;
  const auto figures = ReadFigures(Out());
  const std::uint64_t pitch = figures.at("pitch");
  const auto reports = Reports();
  ASSERT_EQ(reports.size(), 1u);
  const vramscope::v1::DeviceReport* d = Device0(reports[0]);
  ASSERT_NE(d, nullptr);
  // Pooled 4096; pitched: requested 1000 x 10, allocated pitch x 10; managed 64 KiB (counts as
  // reserved, which the fake does not charge); pinned host counts no bytes.
  EXPECT_EQ(d->peak_requested_bytes(), 4096u + 10000u + 65536u);
  EXPECT_EQ(d->peak_allocated_bytes(), 4096u + pitch * 10 + 65536u);
  EXPECT_EQ(d->peak_reserved_bytes(), figures.at("peak_driver_bytes") + 65536u);
  EXPECT_EQ(d->alloc_count(), 4u);
  EXPECT_EQ(d->free_count(), 4u);
  EXPECT_EQ(d->current_requested_bytes(), 0u);
  EXPECT_EQ(d->leaks_size(), 0);
}

TEST_F(RingRunTest, PoolOutOfMemoryIsReportedWithItsVerdict) {
  ASSERT_EQ(RunUnderVramscope("oom"), 0) << stderr_;
  const auto reports = Reports();
  ASSERT_EQ(reports.size(), 1u);
  const vramscope::v1::DeviceReport* d = Device0(reports[0]);
  ASSERT_NE(d, nullptr);
  ASSERT_EQ(d->ooms_size(), 1) << ReadFile(Json());
  EXPECT_EQ(d->ooms(0).requested_bytes(), std::uint64_t{100} << 20);
  EXPECT_EQ(d->ooms(0).verdict(), vramscope::v1::OOM_VERDICT_CAPACITY);
  EXPECT_LT(d->ooms(0).free_bytes(), std::uint64_t{100} << 20);
  EXPECT_EQ(d->alloc_count(), 1u);
  EXPECT_EQ(d->free_count(), 1u);
  EXPECT_EQ(d->peak_requested_bytes(), std::uint64_t{40} << 20);
  EXPECT_EQ(d->peak_reserved_bytes(), ReadFigures(Out()).at("peak_driver_bytes"));
}

TEST_F(RingRunTest, ForkedChildIsReportedAsItsOwnProcess) {
  ASSERT_EQ(RunUnderVramscope("fork"), 0) << stderr_;
  const auto reports = Reports();
  ASSERT_EQ(reports.size(), 2u) << ReadFile(Json());
  const vramscope::v1::Report* parent = nullptr;
  const vramscope::v1::Report* child = nullptr;
  for (const auto& report : reports) {
    const vramscope::v1::DeviceReport* d = Device0(report);
    ASSERT_NE(d, nullptr) << ReadFile(Json());
    (d->alloc_count() == 2 ? child : parent) = &report;
  }
  ASSERT_NE(parent, nullptr);
  ASSERT_NE(child, nullptr);
  EXPECT_NE(parent->process().pid(), child->process().pid());
  EXPECT_TRUE(child->finished());
  EXPECT_EQ(child->exit_code(), 0);
  const vramscope::v1::DeviceReport* c = Device0(*child);
  EXPECT_EQ(c->peak_requested_bytes(), 4096u + 8192u);
  EXPECT_EQ(c->free_count(), 1u);
  ASSERT_EQ(c->leaks_size(), 1);
  EXPECT_EQ(c->leaks(0).requested_bytes(), 8192u);
  EXPECT_TRUE(parent->finished());
  const vramscope::v1::DeviceReport* p = Device0(*parent);
  EXPECT_EQ(p->alloc_count(), 1u);
  EXPECT_EQ(p->free_count(), 1u);
  EXPECT_EQ(p->peak_requested_bytes(), std::uint64_t{1} << 20);
  EXPECT_EQ(p->leaks_size(), 0);
}

TEST_F(RingRunTest, UnusableRingDirectoryWarnsOnceAndChangesNothing) {
  const std::string command = "LD_PRELOAD=${LD_PRELOAD:+$LD_PRELOAD:}" + Env("VRAMSCOPE_SHIM") +
                              " VRAMSCOPE_RING_DIR=/proc/vramscope-no-such-dir " +
                              Env("VRAMSCOPE_RING_APP") + " basic " + Out();
  EXPECT_EQ(Shell(command), 3) << stderr_;
  std::size_t warnings = 0;
  for (std::size_t at = stderr_.find("cannot open the event ring"); at != std::string::npos;
       at = stderr_.find("cannot open the event ring", at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 1u) << stderr_;
  EXPECT_GT(ReadFigures(Out()).at("peak_driver_bytes"), 0u);
}

// Labels end to end through the real shim: `run --label` merged over VRAMSCOPE_LABELS, written
// into the ring at start, read back by the drain into the report; a fork child's ring too.
TEST_F(RingRunTest, LabelsReachTheReportOfEveryProcess) {
  ASSERT_EQ(
      Shell("VRAMSCOPE_LABELS='team=infra,job=old' " + Env("VRAMSCOPE_EXE") +
            " run --label job=train --label 'note=a,b \\ \"q\"' --label commit=\xc3\xa9 --json " +
            Json() + " -- " + Env("VRAMSCOPE_RING_APP") + " fork " + Out()),
      0)
      << stderr_;
  const auto reports = Reports();
  ASSERT_EQ(reports.size(), 2u) << ReadFile(Json());
  for (const auto& report : reports) {
    const auto& labels = report.labels();
    ASSERT_EQ(labels.size(), 4u) << ReadFile(Json());
    EXPECT_EQ(labels.at("job"), "train");
    EXPECT_EQ(labels.at("team"), "infra");
    EXPECT_EQ(labels.at("note"), "a,b \\ \"q\"");
    EXPECT_EQ(labels.at("commit"), "\xc3\xa9");
  }
}

TEST_F(RingRunTest, MalformedLabelIsRefusedByRun) {
  EXPECT_EQ(Shell(Env("VRAMSCOPE_EXE") + " run --label 1job=x -- true"), 2);
  EXPECT_NE(stderr_.find("label key \"1job\" is not [A-Za-z_][A-Za-z0-9_]*"), std::string::npos)
      << stderr_;
  EXPECT_EQ(Shell(Env("VRAMSCOPE_EXE") + " run --label job -- true"), 2);
  EXPECT_NE(stderr_.find("is not KEY=VALUE"), std::string::npos) << stderr_;
  EXPECT_EQ(Shell(Env("VRAMSCOPE_EXE") + " run --label job=$(printf '\\377') -- true"), 2);
  EXPECT_NE(stderr_.find("not valid UTF-8"), std::string::npos) << stderr_;
  EXPECT_EQ(Shell(Env("VRAMSCOPE_EXE") +
                  " run --label job=$(head -c 300 /dev/zero | tr '\\0' x) -- true"),
            2);
  EXPECT_NE(stderr_.find("longer than 256 bytes"), std::string::npos) << stderr_;
}

// A bad VRAMSCOPE_LABELS reaching the shim (run passes the environment on untouched without
// --label) costs one warning: the program runs and is recorded, without labels.
TEST_F(RingRunTest, MalformedLabelsInTheEnvironmentAreIgnoredByTheShim) {
  ASSERT_EQ(Shell("VRAMSCOPE_LOG=warn VRAMSCOPE_LABELS='job=a,=b' " + Env("VRAMSCOPE_EXE") +
                  " run --json " + Json() + " -- " + Env("VRAMSCOPE_RING_APP") + " basic " + Out()),
            3)
      << stderr_;
  EXPECT_NE(stderr_.find("ignoring VRAMSCOPE_LABELS: a label key is empty"), std::string::npos)
      << stderr_;
  const auto reports = Reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(reports[0].labels().empty());
  EXPECT_EQ(Device0(reports[0])->alloc_count(), 4u);
}

}  // namespace
