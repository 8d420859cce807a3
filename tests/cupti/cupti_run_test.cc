// The shim's CUPTI memory activity end to end: `vramscope run --json --trace -- cupti_app` over
// the fake driver with the fake CUPTI (VRAMSCOPE_CUPTI_LIB), and the report's CUPTI view checked
// against the shim's reserved bytes and the fake's charged bytes. Also: another tool holding
// CUPTI costs one warning; CUPTI's dropped records are counted; a final flush that never returns
// does not hold up exit; --no-cupti and plain LD_PRELOAD leave CUPTI alone; the
// CUDA_INJECTION64_PATH entry point starts it.
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

#include "tests/collector/test_util.h"
#include "vramscope/v1/report.pb.h"

namespace {

using vramscope::testing::Env;
using vramscope::testing::ReadFile;

std::size_t Count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

std::uint64_t Figure(const std::string& path, const std::string& key) {
  std::istringstream in(ReadFile(path));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + "=", 0) == 0) return std::stoull(line.substr(key.size() + 1));
  }
  ADD_FAILURE() << key << " not in " << path;
  return 0;
}

class CuptiRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(Env("VRAMSCOPE_EXE").empty()) << "meson sets VRAMSCOPE_EXE";
    ASSERT_FALSE(Env("VRAMSCOPE_CUPTI_APP").empty());
    ASSERT_FALSE(Env("VRAMSCOPE_FAKE_CUPTI").empty());
    char pattern[] = "/tmp/vramscope-cupti-test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { EXPECT_EQ(system(("rm -rf '" + dir_ + "'").c_str()), 0); }

  // Runs `sh -c COMMAND` with stderr into stderr_; returns the exit status.
  int Shell(const std::string& command) {
    const std::string err = dir_ + "/stderr.txt";
    const int status = system((command + " 2>" + err).c_str());
    stderr_ = ReadFile(err);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  }
  // `vramscope run` over cupti_app with the fake CUPTI; `env` and `flags` added.
  int Run(const std::string& env, const std::string& flags = "") {
    return Shell("VRAMSCOPE_CUPTI_LIB=" + Env("VRAMSCOPE_FAKE_CUPTI") + " " + env + " " +
                 Env("VRAMSCOPE_EXE") + " run " + flags + " --json " + Json() + " --trace " +
                 Trace() + " -- " + Env("VRAMSCOPE_CUPTI_APP") + " basic " + Out());
  }
  std::string Json() const { return dir_ + "/report.json"; }
  std::string Trace() const { return dir_ + "/trace.json"; }
  std::string Out() const { return dir_ + "/out.txt"; }

  vramscope::v1::DeviceReport Device0() {
    vramscope::v1::Report report;
    const std::string json = ReadFile(Json());
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &report).ok()) << json;
    for (const auto& device : report.devices()) {
      if (device.device().ordinal() == 0) return device;
    }
    ADD_FAILURE() << "no device 0 in " << json;
    return {};
  }

  std::string dir_;
  std::string stderr_;
};

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

void ExpectAgreement(const vramscope::v1::DeviceReport& d, std::uint64_t driver_peak) {
  ASSERT_TRUE(d.has_cupti());
  // The driver saw exactly what the shim reserved, and what the fake charged.
  EXPECT_EQ(d.cupti().peak_bytes(), d.peak_reserved_bytes());
  EXPECT_EQ(d.cupti().peak_bytes(), driver_peak);
  EXPECT_EQ(d.cupti().current_bytes(), d.current_reserved_bytes());
  // The pool's reservations and the stream-ordered 8 MiB; the pool keeps its cache at exit.
  EXPECT_GE(d.cupti().alloc_count(), 2u);
  EXPECT_GE(d.cupti().free_count(), 1u);
  EXPECT_EQ(d.cupti().dropped_records(), 0u);
  EXPECT_EQ(d.cupti().peak_bytes_by_memory_kind().at("device"), d.cupti().peak_bytes());
  // The stream-ordered pool, trimmed at cuStreamSynchronize: one MEMORY_POOL record.
  EXPECT_EQ(d.cupti().pool_operations(), 1u);
  // The shim's own figures are untouched by CUPTI's.
  // (40 MiB + 1 and the 8 MiB stream-ordered block live together.)
  EXPECT_EQ(d.peak_requested_bytes(), 40 * kMiB + 1 + 8 * kMiB);
}

TEST_F(CuptiRunTest, DriverViewAgreesWithReservedOverVmm) {
  ASSERT_EQ(Run(""), 0) << stderr_;
  ExpectAgreement(Device0(), Figure(Out(), "peak_driver_bytes"));
  const std::string trace = ReadFile(Trace());
  EXPECT_NE(trace.find("\"cuda:0 CUPTI device bytes\""), std::string::npos) << trace;
  EXPECT_NE(trace.find("\"cuda:0 reserved\""), std::string::npos);
  EXPECT_NE(trace.find("\"CUPTI OPERATION_POOL_TRIMMED cuda:0\""), std::string::npos) << trace;
  EXPECT_EQ(stderr_.find("CUPTI is already in use"), std::string::npos) << stderr_;
  EXPECT_NE(stderr_.find("CUPTI (driver view)"), std::string::npos) << stderr_;
}

TEST_F(CuptiRunTest, DriverViewAgreesWithReservedOverSegments) {
  ASSERT_EQ(Run("VRAMSCOPE_VMM=0"), 0) << stderr_;
  ExpectAgreement(Device0(), Figure(Out(), "peak_driver_bytes"));
}

TEST_F(CuptiRunTest, DriverViewAgreesInPassthroughMode) {
  ASSERT_EQ(Run("VRAMSCOPE_MODE=passthrough"), 0) << stderr_;
  const vramscope::v1::DeviceReport d = Device0();
  ExpectAgreement(d, Figure(Out(), "peak_driver_bytes"));
  // Every allocation reached the driver: one CUPTI record per allocation and free.
  EXPECT_EQ(d.cupti().alloc_count(), 4u);
}

TEST_F(CuptiRunTest, AnotherSubscriberWarnsOnceAndTheProgramRuns) {
  ASSERT_EQ(Run("VRAMSCOPE_FAKE_CUPTI_MODE=subscriber"), 0) << stderr_;
  EXPECT_EQ(Count(stderr_, "CUPTI is already in use by another tool"), 1u) << stderr_;
  const vramscope::v1::DeviceReport d = Device0();
  EXPECT_FALSE(d.has_cupti());
  EXPECT_EQ(d.peak_reserved_bytes(), Figure(Out(), "peak_driver_bytes"));
}

TEST_F(CuptiRunTest, DroppedRecordsAreCounted) {
  ASSERT_EQ(Run("VRAMSCOPE_FAKE_CUPTI_MODE=drop"), 0) << stderr_;
  const vramscope::v1::DeviceReport d = Device0();
  ASSERT_TRUE(d.has_cupti());
  // The fake drops every third record it sees.
  const std::uint64_t seen = d.cupti().alloc_count() + d.cupti().free_count();
  EXPECT_GE(d.cupti().dropped_records(), 1u);
  EXPECT_EQ(d.cupti().dropped_records(), (seen + d.cupti().dropped_records()) / 3);
  EXPECT_NE(stderr_.find("CUPTI dropped"), std::string::npos) << stderr_;
}

TEST_F(CuptiRunTest, ExitDoesNotWaitForAFinalFlushThatNeverReturns) {
  // The fake's forced flush sleeps 600 s; the shim waits 100 ms for it, then the program exits.
  ASSERT_EQ(Run("VRAMSCOPE_FAKE_CUPTI_MODE=slow_flush VRAMSCOPE_CUPTI_EXIT_TIMEOUT_MS=100"), 0)
      << stderr_;
  EXPECT_NE(stderr_.find("CUPTI's final flush did not finish within 100 ms"), std::string::npos)
      << stderr_;
  EXPECT_EQ(Device0().peak_reserved_bytes(), Figure(Out(), "peak_driver_bytes"));
}

TEST_F(CuptiRunTest, NoCuptiFlagTurnsItOff) {
  ASSERT_EQ(Run("", "--no-cupti"), 0) << stderr_;
  EXPECT_FALSE(Device0().has_cupti());
  EXPECT_EQ(ReadFile(Trace()).find("CUPTI"), std::string::npos);
}

TEST_F(CuptiRunTest, PlainPreloadLeavesCuptiOffUnlessAskedWithARing) {
  const std::string base = "LD_PRELOAD=${LD_PRELOAD:+$LD_PRELOAD:}" + Env("VRAMSCOPE_SHIM") +
                           " VRAMSCOPE_CUPTI_LIB=/nonexistent/libcupti.so.13 " +
                           Env("VRAMSCOPE_CUPTI_APP") + " basic " + Out();
  const std::string ring = "VRAMSCOPE_RING_DIR=" + dir_ + " ";
  const std::string missing = "cannot open VRAMSCOPE_CUPTI_LIB=/nonexistent/libcupti.so.13";
  ASSERT_EQ(Shell(ring + base), 0) << stderr_;
  EXPECT_EQ(stderr_.find("CUPTI"), std::string::npos) << stderr_;
  // Asked for, but no ring to record into: not loaded either.
  ASSERT_EQ(Shell("VRAMSCOPE_CUPTI=1 VRAMSCOPE_RING_DIR=off " + base), 0) << stderr_;
  EXPECT_EQ(stderr_.find("CUPTI"), std::string::npos) << stderr_;
  ASSERT_EQ(Shell("VRAMSCOPE_CUPTI=1 " + ring + base), 0) << stderr_;
  EXPECT_EQ(Count(stderr_, missing), 1u) << stderr_;
}

TEST_F(CuptiRunTest, InjectionEntryPointStartsCupti) {
  // No LD_PRELOAD: the (fake) driver loads the shim at cuInit and calls InitializeInjection.
  ASSERT_EQ(Shell("CUDA_INJECTION64_PATH=" + Env("VRAMSCOPE_SHIM") + " VRAMSCOPE_RING_DIR=" + dir_ +
                  " VRAMSCOPE_LOG=info VRAMSCOPE_CUPTI_LIB=" + Env("VRAMSCOPE_FAKE_CUPTI") + " " +
                  Env("VRAMSCOPE_CUPTI_APP") + " basic " + Out()),
            0)
      << stderr_;
  EXPECT_EQ(Count(stderr_, "CUPTI memory activity on"), 1u) << stderr_;
  ASSERT_EQ(
      Shell("CUDA_INJECTION64_PATH=" + Env("VRAMSCOPE_SHIM") + " VRAMSCOPE_RING_DIR=" + dir_ +
            " VRAMSCOPE_CUPTI=0 VRAMSCOPE_LOG=info VRAMSCOPE_CUPTI_LIB=" +
            Env("VRAMSCOPE_FAKE_CUPTI") + " " + Env("VRAMSCOPE_CUPTI_APP") + " basic " + Out()),
      0)
      << stderr_;
  EXPECT_EQ(stderr_.find("CUPTI memory activity on"), std::string::npos) << stderr_;
}

}  // namespace
