// The replay through the pool, the report formats and the command's arguments and exit codes.
#include "replay/replay.h"

#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "replay/replay_command.h"
#include "replay/trace_loader.h"
#include "trace_test_util.h"
#include "vramscope/pool/pool.h"

namespace vramscope::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::vector<std::string> Policies() {
  std::vector<std::string> names;
  std::string_view rest = vramscope::pool::PolicyNames();
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    names.emplace_back(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return names;
}

LoadedTrace SmallTrace() {
  auto trace = LoadTraceBytes("small.csv",
                              "action,addr,size,stream,time_us,site\n"
                              "alloc,1,1000,0,0,\n"
                              "alloc,2,3000000,0,0,\n"
                              "alloc,3,24,0,0,\n"
                              "free_requested,2,3000000,0,0,\n"
                              "alloc,4,70000000,0,0,\n"
                              "free_requested,1,1000,0,0,\n"
                              "alloc,5,512,0,0,\n");
  EXPECT_TRUE(trace.ok()) << trace.status();
  return *std::move(trace);
}

TEST(ReplayTrace, EveryPolicyKeepsExactRequestedBytes) {
  const LoadedTrace trace = SmallTrace();
  ASSERT_FALSE(Policies().empty());
  for (const std::string& policy : Policies()) {
    auto result = ReplayTrace(trace, policy);
    ASSERT_TRUE(result.ok()) << policy << ": " << result.status();
    EXPECT_EQ(result->policy, policy);
    EXPECT_EQ(result->stats.peak_requested_bytes, trace.peak_live_bytes) << policy;
    EXPECT_EQ(result->stats.current_requested_bytes, trace.live_at_end_bytes) << policy;
    EXPECT_GE(result->stats.peak_allocated_bytes, result->stats.peak_requested_bytes) << policy;
    EXPECT_GE(result->stats.peak_reserved_bytes, result->stats.peak_allocated_bytes) << policy;
    EXPECT_EQ(result->stats.oom_count, 0u) << policy;
    EXPECT_EQ(result->failed_allocs, 0u) << policy;
    EXPECT_GE(result->fragmentation_at_peak, 0.0) << policy;
    EXPECT_LE(result->fragmentation_at_peak, 1.0) << policy;
    EXPECT_GE(result->timed_runs, 1);
    EXPECT_LE(result->timed_runs, 5);
    EXPECT_GT(result->ns_per_event, 0.0) << policy;
  }
}

// A 64 MiB block freed at t=0 and a request of the same size at t=100 us: reused at once
// without a fence model; with the GPU 1 ms behind, the event model waits for the free (the lag
// bound: 64 MiB pending is past 16 MiB) and reuses it, and the device-synchronisation model
// (nowhere near a batch) grows.
LoadedTrace ReuseTrace() {
  auto trace = LoadTraceBytes("reuse.csv",
                              "action,addr,size,stream,time_us,site\n"
                              "alloc,1,67108864,0,0,\n"
                              "free_requested,1,67108864,0,0,\n"
                              "alloc,2,67108864,0,100,\n"
                              "free_requested,2,67108864,0,200,\n");
  EXPECT_TRUE(trace.ok()) << trace.status();
  return *std::move(trace);
}

TEST(ReplayTrace, FenceModelsHoldFreesUntilTheGpuPassedThem) {
  const LoadedTrace trace = ReuseTrace();
  auto none = ReplayTrace(trace, "vmm");
  ASSERT_TRUE(none.ok()) << none.status();
  // One block's mapping: 64 MiB and what the pool maps ahead (a granule or two), not two blocks.
  const std::uint64_t one_block = none->stats.peak_reserved_bytes;
  EXPECT_GE(one_block, std::uint64_t{64} << 20);
  EXPECT_LT(one_block, std::uint64_t{72} << 20);

  ReplayOptions events;
  events.fence = FenceModel::kEvents;
  events.gpu_lag_us = 1000;
  auto waited = ReplayTrace(trace, "vmm", nullptr, events);
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(waited->stats.peak_reserved_bytes, one_block);
  EXPECT_EQ(waited->lag_waits, 1u);
  EXPECT_EQ(waited->host_wait_us, 900u);  // ready at 0 + 1000, asked at 100

  events.lag_fraction = 0;  // never wait: the block is still on the GPU, so the pool grows
  auto grew = ReplayTrace(trace, "vmm", nullptr, events);
  ASSERT_TRUE(grew.ok()) << grew.status();
  EXPECT_GE(grew->stats.peak_reserved_bytes, std::uint64_t{128} << 20);
  EXPECT_EQ(grew->host_wait_us, 0u);

  // GPU waits: the oldest fence is handed over, the host never waits, the block is reused.
  ReplayOptions gpuwait;
  gpuwait.fence = FenceModel::kGpuWait;
  gpuwait.gpu_lag_us = 1000;
  auto handed = ReplayTrace(trace, "vmm", nullptr, gpuwait);
  ASSERT_TRUE(handed.ok()) << handed.status();
  EXPECT_EQ(handed->stats.peak_reserved_bytes, one_block);
  EXPECT_EQ(handed->handovers, 1u);
  EXPECT_EQ(handed->host_wait_us, 0u);
  EXPECT_EQ(handed->lag_waits, 0u);

  ReplayOptions devsync;
  devsync.fence = FenceModel::kDeviceSync;
  devsync.gpu_lag_us = 1000;
  auto batch = ReplayTrace(trace, "vmm", nullptr, devsync);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_GE(batch->stats.peak_reserved_bytes, std::uint64_t{128} << 20);
  EXPECT_EQ(batch->fence_syncs, 0u);
}

TEST(ReplayTrace, DefaultPolicyIsTheFirstName) {
  auto result = ReplayTrace(SmallTrace(), "");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->policy, Policies().front());
}

TEST(ReplayTrace, UnknownPolicy) {
  auto result = ReplayTrace(SmallTrace(), "no_such_policy");
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()),
              StartsWith("unknown policy 'no_such_policy'"));
}

TEST(ReplayTrace, EmptyTrace) {
  auto trace = LoadTraceBytes("e.csv", "action,addr,size,stream,time_us,site\n");
  ASSERT_TRUE(trace.ok());
  auto result = ReplayTrace(*trace, "");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->stats.peak_reserved_bytes, 0u);
  EXPECT_EQ(result->ns_per_event, 0.0);
  EXPECT_THAT(FormatReplayJson(*trace, *result), HasSubstr("\"reserved_over_live\": 0.000000"));
}

TEST(ReplayTrace, BundledTracesUnderEveryPolicy) {
  for (const char* name : {"gpt2_train", "resnet50_train", "mlp_dynamic_train"}) {
    auto trace = LoadTraceFile(testing::TracesDir() + "/" + name + ".csv.gz");
    ASSERT_TRUE(trace.ok()) << trace.status();
    for (const std::string& policy : Policies()) {
      auto result = ReplayTrace(*trace, policy);
      ASSERT_TRUE(result.ok()) << name << " " << policy << ": " << result.status();
      EXPECT_EQ(result->stats.peak_requested_bytes, trace->peak_live_bytes)
          << name << " " << policy;
      EXPECT_EQ(result->failed_allocs, 0u) << name << " " << policy;
      EXPECT_GE(result->stats.peak_reserved_bytes, trace->peak_live_bytes) << name << " " << policy;
      // Fragmentation at peak is sampled when the upstream's physical bytes reach a new high:
      // that is the pool's peak reserved only if the two agree.
      EXPECT_EQ(result->upstream_peak_physical_bytes, result->stats.peak_reserved_bytes)
          << name << " " << policy;
    }
  }
}

TEST(ReplayReport, JsonHasEveryField) {
  const LoadedTrace trace = SmallTrace();
  auto result = ReplayTrace(trace, "");
  ASSERT_TRUE(result.ok());
  const std::string json = FormatReplayJson(trace, *result);
  for (const char* key : {"trace", "policy", "events", "alloc_events", "peak_live_bytes",
                          "peak_requested_bytes", "peak_allocated_bytes", "peak_reserved_bytes",
                          "reserved_over_live", "fragmentation_at_peak", "upstream_calls",
                          "upstream_calls_per_alloc", "ns_per_event", "oom_count"}) {
    EXPECT_THAT(json, HasSubstr(absl::StrCat("\n  \"", key, "\": "))) << key;
  }
  EXPECT_THAT(json, StartsWith("{\n  \"trace\": \"small.csv\",\n"));
  EXPECT_THAT(json, HasSubstr("\"events\": 7,\n"));
  EXPECT_THAT(json, HasSubstr("\"peak_live_bytes\": 70001024,\n"));
  EXPECT_EQ(json.back(), '\n');
  EXPECT_EQ(json.substr(json.size() - 3), "\n}\n");
}

TEST(ReplayReport, JsonEscapesTheTraceName) {
  LoadedTrace trace = SmallTrace();
  trace.name = "a\"b\\c\nd";
  auto result = ReplayTrace(trace, "");
  ASSERT_TRUE(result.ok());
  EXPECT_THAT(FormatReplayJson(trace, *result), HasSubstr(R"("trace": "a\"b\\c\nd")"));
  // A Latin-1 file name: escaped to valid UTF-8 first (the backslash doubled, the byte as \xE9),
  // then for JSON.
  trace.name = "a\\b\xE9";
  EXPECT_THAT(FormatReplayJson(trace, *result), HasSubstr(R"("trace": "a\\\\b\\xE9")"));
}

TEST(ReplayReport, TextHasHumanAndExactBytes) {
  const LoadedTrace trace = SmallTrace();
  auto result = ReplayTrace(trace, "");
  ASSERT_TRUE(result.ok());
  const std::string text = FormatReplayText(trace, *result);
  EXPECT_THAT(text, HasSubstr("  peak live               66.76 MiB (70,001,024 B)\n"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("  policy                  ", Policies().front(),
                                           " (default)\n")));
  EXPECT_THAT(text, HasSubstr("events replayed         7 (5 alloc, 2 free; 0 other rows"));
}

// --- The command
// ----------------------------------------------------------------------------------

int RunCommand(std::vector<std::string> args, std::string* out = nullptr,
               std::string* err = nullptr) {
  args.insert(args.begin(), "replay");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const int code = RunReplay(static_cast<int>(argv.size()), argv.data());
  std::string captured_out = ::testing::internal::GetCapturedStdout();
  std::string captured_err = ::testing::internal::GetCapturedStderr();
  if (out != nullptr) *out = captured_out;
  if (err != nullptr) *err = captured_err;
  return code;
}

TEST(ReplayCommand, Help) {
  std::string out;
  EXPECT_EQ(RunCommand({"--help"}, &out), 0);
  EXPECT_THAT(out,
              StartsWith("usage: vramscope replay TRACE [--json] [--policy NAME] [--device N]\n"
                         "                        [--fence MODEL --gpu-lag US]\n"));
  for (const std::string& policy : Policies()) EXPECT_THAT(out, HasSubstr(policy));
  EXPECT_EQ(RunCommand({"-h"}), 0);
}

TEST(ReplayCommand, UsageErrors) {
  std::string err;
  EXPECT_EQ(RunCommand({}, nullptr, &err), 2);
  EXPECT_THAT(err, HasSubstr("missing TRACE"));
  EXPECT_EQ(RunCommand({"--frobnicate", "x"}, nullptr, &err), 2);
  EXPECT_THAT(err, HasSubstr("unknown flag --frobnicate"));
  EXPECT_EQ(RunCommand({"a", "b"}, nullptr, &err), 2);
  EXPECT_EQ(RunCommand({"a", "--policy"}, nullptr, &err), 2);
  EXPECT_THAT(err, HasSubstr("--policy needs a value"));
  EXPECT_EQ(RunCommand({"a", "--policy=nope"}, nullptr, &err), 2);
  EXPECT_THAT(err, HasSubstr("unknown policy 'nope'"));
}

TEST(ReplayCommand, UnreadableOrInvalidTraceExitsTwo) {
  std::string out;
  std::string err;
  EXPECT_EQ(RunCommand({"/nonexistent.csv.gz"}, &out, &err), 2);
  EXPECT_EQ(out, "");
  EXPECT_THAT(err, StartsWith("vramscope replay: /nonexistent.csv.gz: cannot open"));
  testing::TempFile bad("bad.csv", "action,addr,size,stream,time_us,site\nfoo,1,2,3,4,\n");
  EXPECT_EQ(RunCommand({bad.path(), "--json"}, &out, &err), 2);
  EXPECT_EQ(out, "");
  EXPECT_EQ(err, absl::StrCat("vramscope replay: ", bad.path(), ":2: unknown action 'foo' ",
                              "(expected alloc, free_requested, free_completed, segment_alloc or "
                              "segment_free)\n"));
}

TEST(ReplayCommand, JsonAndTextOnStdout) {
  testing::TempFile good("good.csv", "action,addr,size,stream,time_us,site\nalloc,1,512,0,0,\n");
  std::string out;
  std::string err;
  ASSERT_EQ(RunCommand({"--json", good.path()}, &out, &err), 0) << err;
  EXPECT_THAT(out, StartsWith("{\n"));
  EXPECT_EQ(err, "");  // no progress bar: stderr is not a terminal
  for (const std::string& policy : Policies()) {
    ASSERT_EQ(RunCommand({good.path(), "--policy", policy}, &out, &err), 0) << err;
    EXPECT_THAT(out, HasSubstr(absl::StrCat("policy                  ", policy)));
  }
  ASSERT_EQ(RunCommand({"--", good.path()}, &out), 0);
}

}  // namespace
}  // namespace vramscope::cli
