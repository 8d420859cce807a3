// Replays every bundled trace (traces/*.csv.gz) through every policy and checks the default
// policy meets the goals: peak reserved within 5% of peak live (and below the PyTorch /
// cudaMallocAsync reference for each trace), and upstream grow + shrink calls at most 2% of the
// trace's allocations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pool_internal.h"
#include "pool_test_support.h"
#include "vramscope/pool/pool.h"
#include "vramscope/pool/virtual_upstream.h"

namespace vramscope::pool {
namespace {

using testing::FakeFences;
using testing::ReadTrace;
using testing::Replay;
using testing::ReplayResult;
using testing::TraceEvent;

struct TraceGoal {
  const char* name;
  double max_ratio;  // the better of PyTorch and cudaMallocAsync, capped at 1.05
};

constexpr TraceGoal kGoals[] = {
    {"gpt2_train", 1.047},
    {"resnet50_train", 1.05},
    {"mlp_dynamic_train", 1.05},
};

std::string TracePath(const char* name) {
  const char* dir = std::getenv("VRAMSCOPE_TRACES_DIR");
  return std::string(dir != nullptr ? dir : "traces") + "/" + name + ".csv.gz";
}

std::vector<std::string> Policies() {
  std::vector<std::string> out;
  std::string names(PolicyNames());
  std::size_t start = 0;
  while (start <= names.size()) {
    const std::size_t comma = names.find(',', start);
    out.push_back(names.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

class TraceReplayTest : public ::testing::TestWithParam<TraceGoal> {};

TEST_P(TraceReplayTest, DefaultPolicyMeetsRatioAndCallGoals) {
  const TraceGoal goal = GetParam();
  std::vector<TraceEvent> events;
  ASSERT_TRUE(ReadTrace(TracePath(goal.name), &events)) << TracePath(goal.name);
  for (const bool partial_unmap : {true, false}) {
    for (const std::string& policy : Policies()) {
      VirtualUpstreamOptions upstream_options;
      upstream_options.allow_partial_unmap = partial_unmap;
      VirtualUpstream upstream(upstream_options);
      FakeFences fences;
      PoolOptions options;
      options.policy = policy;
      std::unique_ptr<Pool> pool = MakePool(&upstream, &fences, options);
      ASSERT_NE(pool, nullptr) << policy;
      const ReplayResult result = Replay(events, pool.get());
      const VirtualUpstreamCounters counters = upstream.Counters();
      std::printf(
          "%-18s %-9s %-13s allocs=%5llu peak_live=%llu peak_reserved=%llu ratio=%.4f "
          "upstream_calls=%llu (grow %llu shrink %llu) limit=%llu\n",
          goal.name, policy.c_str(), partial_unmap ? "partial-unmap" : "whole-maps",
          static_cast<unsigned long long>(result.allocs),
          static_cast<unsigned long long>(result.peak_live),
          static_cast<unsigned long long>(result.stats.peak_reserved_bytes), result.Ratio(),
          static_cast<unsigned long long>(result.UpstreamCalls()),
          static_cast<unsigned long long>(result.stats.upstream_grow_calls),
          static_cast<unsigned long long>(result.stats.upstream_shrink_calls),
          static_cast<unsigned long long>(result.allocs * 2 / 100));
      EXPECT_EQ(result.failures, 0u) << policy;
      // The pool's own counts agree with what the upstream saw, and it never misused it.
      EXPECT_EQ(result.UpstreamCalls(), counters.GrowCalls() + counters.ShrinkCalls()) << policy;
      EXPECT_EQ(result.stats.peak_reserved_bytes, counters.peak_physical_bytes) << policy;
      EXPECT_EQ(counters.invalid_calls, 0u) << policy;
      // The goals hold for the default policy over the default upstream (one handle per granule).
      if (policy == Policies().front() && partial_unmap) {
        EXPECT_LE(result.Ratio(), goal.max_ratio) << policy;
        EXPECT_LE(result.UpstreamCalls(), result.allocs * 2 / 100) << policy;
      }
    }
  }
}

// The shim's fence model (testing::ShimEpochs): every free waits for the current epoch, and a
// synchronisation every `sync_every` frees completes every epoch before it.
struct Fenced {
  double ratio = 0;
  std::uint64_t upstream_calls = 0;
};

Fenced FencedReplay(const std::vector<TraceEvent>& events, internal::Layout layout,
                    const internal::Tuning& tuning, int sync_every) {
  VirtualUpstream upstream;
  testing::ShimEpochs fences;
  std::unique_ptr<Pool> pool =
      internal::MakeCachingPool(&upstream, &fences, PoolOptions{}, layout, tuning);
  std::unordered_map<std::uint64_t, std::pair<std::uintptr_t, std::uint64_t>> live;
  std::uint64_t live_bytes = 0;
  std::uint64_t peak_live = 0;
  int frees = 0;
  for (const TraceEvent& event : events) {
    if (event.alloc) {
      std::uintptr_t address = 0;
      EXPECT_EQ(pool->Allocate(event.size, &address), PoolStatus::kOk);
      live[event.addr] = {address, event.size};
      live_bytes += event.size;
      peak_live = std::max(peak_live, live_bytes);
      continue;
    }
    auto it = live.find(event.addr);
    if (it == live.end()) continue;
    EXPECT_EQ(pool->Free(it->second.first, fences.epoch), PoolStatus::kOk);
    live_bytes -= it->second.second;
    live.erase(it);
    if (++frees % sync_every == 0) fences.Sync();
  }
  const PoolStats stats = pool->Stats();
  return {static_cast<double>(stats.peak_reserved_bytes) / static_cast<double>(peak_live),
          stats.upstream_grow_calls + stats.upstream_shrink_calls};
}

double FencedRatio(const std::vector<TraceEvent>& events, internal::Layout layout,
                   std::uint32_t quick_depth, int sync_every) {
  internal::Tuning tuning;
  tuning.quick_depth = quick_depth;
  return FencedReplay(events, layout, tuning, sync_every).ratio;
}

// The quick bins (fenced frees of one size served back as they are) hold no more memory than
// merging every completed block at once: within 2% of the same fenced replay without bins
// (measured: at most +1.0%, mlp_dynamic_train over segments with a synchronisation every 64 frees;
// bins that took other sizes made gpt2_train over segments 12.6% worse).
TEST_P(TraceReplayTest, QuickBinsKeepTheFencedReplaysPeakReserved) {
  const TraceGoal goal = GetParam();
  std::vector<TraceEvent> events;
  ASSERT_TRUE(ReadTrace(TracePath(goal.name), &events)) << TracePath(goal.name);
  for (const internal::Layout layout : {internal::Layout::kVmm, internal::Layout::kSegments}) {
    for (const int sync_every : {64, 256}) {
      const double without = FencedRatio(events, layout, 0, sync_every);
      const double with = FencedRatio(events, layout, internal::Tuning().quick_depth, sync_every);
      std::printf("%-18s %-9s sync every %3d frees: ratio %.4f without bins, %.4f with\n",
                  goal.name, layout == internal::Layout::kVmm ? "vmm" : "segments", sync_every,
                  without, with);
      EXPECT_LE(with, without * 1.02) << sync_every;
    }
  }
}

// The vmm soft cap counts pending bytes as in use (Tuning::vmm_cap_counts_pending): a pool whose
// frees wait for fences then maps ahead instead of unmapping what just became free at every
// growth. Measured: 1.0-1.4x fewer upstream calls (the ceiling above the soft cap spares most of
// those remaps already) for at most 1.4% more peak reserved.
TEST_P(TraceReplayTest, SoftCapCountingPendingBytesTakesFewerUpstreamCalls) {
  const TraceGoal goal = GetParam();
  std::vector<TraceEvent> events;
  ASSERT_TRUE(ReadTrace(TracePath(goal.name), &events)) << TracePath(goal.name);
  for (const int sync_every : {64, 256}) {
    internal::Tuning off;
    off.vmm_cap_counts_pending = false;
    const Fenced before = FencedReplay(events, internal::Layout::kVmm, off, sync_every);
    const Fenced after =
        FencedReplay(events, internal::Layout::kVmm, internal::Tuning(), sync_every);
    std::printf(
        "%-18s vmm sync every %3d frees: cap without pending %.4f (%llu calls), with %.4f "
        "(%llu calls)\n",
        goal.name, sync_every, before.ratio, static_cast<unsigned long long>(before.upstream_calls),
        after.ratio, static_cast<unsigned long long>(after.upstream_calls));
    EXPECT_LT(after.upstream_calls, before.upstream_calls) << sync_every;
    EXPECT_LE(after.ratio, before.ratio * 1.03) << sync_every;
  }
}

INSTANTIATE_TEST_SUITE_P(Traces, TraceReplayTest, ::testing::ValuesIn(kGoals),
                         [](const ::testing::TestParamInfo<TraceGoal>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace vramscope::pool
