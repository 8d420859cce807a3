// The vmm soft cap under dynamic shapes (tensor sizes that change every step or request), on
// seeded synthetic workloads (dynamic_workloads.h) of small programs (a peak of 170-280 MB) and
// large ones (several GB), and its rules in isolation: the slack as a share of the peak, the
// ceiling above the soft cap, and the free neighbours a placement extends being unmapped last.
//
// Goals (as for the bundled traces, pool_trace_test): peak reserved <= 1.05 x peak live, upstream
// grow + shrink calls <= 2% of allocations. The slack is a share of the pool, so a small pool
// keeps the ratio as a large one does; an absolute slack of a few granules does not (checked
// here: the same small workloads under a slack of 7 granules).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dynamic_workloads.h"
#include "pool_internal.h"
#include "pool_test_support.h"
#include "vramscope/pool/pool.h"
#include "vramscope/pool/virtual_upstream.h"

namespace vramscope::pool {
namespace {

using testing::DynamicInference;
using testing::DynamicTraining;
using testing::FakeFences;
using testing::TraceEvent;

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kSeeds[] = {1, 2, 3, 4, 5, 6};

struct Measured {
  std::uint64_t allocs = 0;
  std::uint64_t peak_live = 0;
  std::uint64_t calls = 0;  // upstream grow + shrink
  double ratio = 0;         // peak reserved / peak live
  double CallShare() const { return static_cast<double>(calls) / static_cast<double>(allocs); }
};

Measured Measure(const std::vector<TraceEvent>& events, const internal::Tuning& tuning) {
  VirtualUpstream upstream;
  FakeFences fences;
  std::unique_ptr<Pool> pool =
      internal::MakeCachingPool(&upstream, &fences, PoolOptions{}, internal::Layout::kVmm, tuning);
  EXPECT_NE(pool, nullptr);
  if (pool == nullptr) return {};
  Measured m;
  std::unordered_map<std::uint64_t, std::pair<std::uintptr_t, std::uint64_t>> live;
  std::uint64_t live_bytes = 0;
  for (const TraceEvent& event : events) {
    if (event.alloc) {
      ++m.allocs;
      std::uintptr_t address = 0;
      EXPECT_EQ(pool->Allocate(event.size, &address), PoolStatus::kOk);
      live[event.addr] = {address, event.size};
      live_bytes += event.size;
      m.peak_live = std::max(m.peak_live, live_bytes);
      continue;
    }
    auto it = live.find(event.addr);
    EXPECT_NE(it, live.end());
    if (it == live.end()) continue;
    EXPECT_EQ(pool->Free(it->second.first, 0), PoolStatus::kOk);
    live_bytes -= it->second.second;
    live.erase(it);
  }
  const PoolStats s = pool->Stats();
  m.calls = s.upstream_grow_calls + s.upstream_shrink_calls;
  m.ratio = static_cast<double>(s.peak_reserved_bytes) / static_cast<double>(m.peak_live);
  EXPECT_EQ(m.calls, upstream.Counters().GrowCalls() + upstream.Counters().ShrinkCalls());
  EXPECT_EQ(upstream.Counters().invalid_calls, 0u);
  return m;
}

void Print(const char* name, std::uint64_t seed, const char* rule, const Measured& m) {
  std::printf(
      "%-9s seed %llu %-9s allocs %5llu peak live %6.1f MB ratio %.4f calls %4llu "
      "= %.2f%%\n",
      name, static_cast<unsigned long long>(seed), rule, static_cast<unsigned long long>(m.allocs),
      static_cast<double>(m.peak_live) / kMiB, m.ratio, static_cast<unsigned long long>(m.calls),
      100.0 * m.CallShare());
}

TEST(DynamicShapesTest, WorkloadsAreDeterministic) {
  for (const std::uint64_t seed : kSeeds) {
    const std::vector<TraceEvent> a = DynamicInference(seed, 100 * kMiB);
    const std::vector<TraceEvent> b = DynamicInference(seed, 100 * kMiB);
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].alloc, b[i].alloc);
      ASSERT_EQ(a[i].addr, b[i].addr);
      ASSERT_EQ(a[i].size, b[i].size);
    }
    EXPECT_EQ(DynamicTraining(seed, 60 * kMiB).size(), DynamicTraining(seed, 60 * kMiB).size());
  }
  // Different seeds give different programs.
  EXPECT_NE(DynamicTraining(1, 60 * kMiB).size(), DynamicTraining(2, 60 * kMiB).size());
}

// A training program of several GB whose batch changes every step: within both goals.
TEST(DynamicShapesTest, LargeTrainingMeetsRatioAndCallGoals) {
  for (const std::uint64_t seed : kSeeds) {
    const Measured m = Measure(DynamicTraining(seed, 1500 * kMiB), internal::Tuning());
    Print("training", seed, "default", m);
    EXPECT_GT(m.peak_live, 4000 * kMiB) << seed;
    EXPECT_LE(m.ratio, 1.05) << seed;
    EXPECT_LE(m.CallShare(), 0.02) << seed;
  }
}

// Continuous-batching inference of several GB whose KV caches are reallocated larger as requests
// grow: within the ratio goal. Its calls are not within 2% (2.4-3.8% here, 2.4-4.2% before the
// ceiling and the proportional slack); this bounds them so they do not grow back.
TEST(DynamicShapesTest, LargeInferenceMeetsRatioGoal) {
  for (const std::uint64_t seed : kSeeds) {
    const Measured m = Measure(DynamicInference(seed, 4000 * kMiB), internal::Tuning());
    Print("inference", seed, "default", m);
    EXPECT_GT(m.peak_live, 6000 * kMiB) << seed;
    EXPECT_LE(m.ratio, 1.05) << seed;
    EXPECT_LE(m.CallShare(), 0.04) << seed;
  }
}

// Small programs (peak 170-280 MB) of a few wide layers, like traces/mlp_dynamic_train: within
// the ratio goal, where a slack of 7 granules (14 MiB, 5-8% of these pools) is not. Their
// calls are not within 2%: every tensor is 5-15% of the pool, more than the slack, so a step
// whose batch shifts the layout remaps (2-7% here; 1-6% with the larger absolute slack); this
// bounds them so they do not grow.
TEST(DynamicShapesTest, SmallProgramsKeepTheRatioWhereAnAbsoluteSlackDoesNot) {
  // max(3%, 14 MiB): 14 MiB on these pools.
  internal::Tuning absolute;
  absolute.vmm_slack = 0.03;
  absolute.vmm_ceiling_slack = 0.03;
  absolute.vmm_min_slack_granules = 7;
  int absolute_over = 0;
  for (const std::uint64_t seed : kSeeds) {
    const std::vector<TraceEvent> events = DynamicTraining(seed, 60 * kMiB, testing::kMlpTraining);
    const Measured m = Measure(events, internal::Tuning());
    const Measured fixed = Measure(events, absolute);
    Print("small", seed, "default", m);
    Print("small", seed, "absolute", fixed);
    EXPECT_GT(m.peak_live, 150 * kMiB) << seed;
    EXPECT_LT(m.peak_live, 300 * kMiB) << seed;
    EXPECT_LE(m.ratio, 1.05) << seed;
    EXPECT_LE(m.CallShare(), 0.08) << seed;
    if (fixed.ratio > 1.05) ++absolute_over;
  }
  // The workloads tell the two rules apart.
  EXPECT_GE(absolute_over, 5);
}

constexpr std::size_t kGranule = std::size_t{2} << 20;

// Tuning for the rule tests: no mapping ahead, so every mapping is the placement's own.
internal::Tuning Exact(double slack, double ceiling, std::size_t min_granules) {
  internal::Tuning tuning;
  tuning.vmm_slack = slack;
  tuning.vmm_ceiling_slack = ceiling;
  tuning.vmm_min_slack_granules = min_granules;
  tuning.vmm_map_ahead = 0;
  return tuning;
}

class SoftCapTest : public ::testing::Test {
 protected:
  void Make(const internal::Tuning& tuning) {
    pool_ = internal::MakeCachingPool(&upstream_, &fences_, PoolOptions{}, internal::Layout::kVmm,
                                      tuning);
    ASSERT_NE(pool_, nullptr);
  }
  std::uintptr_t Alloc(std::size_t bytes) {
    std::uintptr_t address = 0;
    EXPECT_EQ(pool_->Allocate(bytes, &address), PoolStatus::kOk) << bytes;
    return address;
  }
  std::size_t Reserved() const { return pool_->Stats().current_reserved_bytes; }

  VirtualUpstream upstream_;
  FakeFences fences_;
  std::unique_ptr<Pool> pool_;
};

// 1000 MiB peak (soft cap 1040, ceiling 1060) and ten free 10 MiB holes: requests of 12 MiB fit
// none, and each maps at the top without unmapping until the ceiling; the one past it unmaps down
// to the soft cap.
TEST_F(SoftCapTest, MapsUpToTheCeilingThenUnmapsDownToTheSoftCap) {
  Make(Exact(0.04, 0.06, 1));
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 100; ++i) blocks.push_back(Alloc(5 * kGranule));
  for (int i = 5; i < 100; i += 10) ASSERT_EQ(pool_->Free(blocks[i], 0), PoolStatus::kOk);
  ASSERT_EQ(Reserved(), 1000 * kMiB);
  for (int i = 0; i < 5; ++i) Alloc(6 * kGranule);
  EXPECT_EQ(Reserved(), 1060 * kMiB);
  EXPECT_EQ(upstream_.Counters().unmap_calls, 0u);
  Alloc(6 * kGranule);
  EXPECT_GT(upstream_.Counters().unmap_calls, 0u);
  EXPECT_LE(Reserved(), 1040 * kMiB);
  EXPECT_EQ(pool_->Stats().peak_reserved_bytes, 1060 * kMiB);
}

// The same with the ceiling at the soft cap: each request past it unmaps one hole.
TEST_F(SoftCapTest, WithoutACeilingEveryRequestPastTheCapUnmaps) {
  Make(Exact(0.04, 0.04, 1));
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 100; ++i) blocks.push_back(Alloc(5 * kGranule));
  for (int i = 5; i < 100; i += 10) ASSERT_EQ(pool_->Free(blocks[i], 0), PoolStatus::kOk);
  for (int i = 0; i < 3; ++i) Alloc(6 * kGranule);
  EXPECT_EQ(upstream_.Counters().unmap_calls, 0u);
  Alloc(6 * kGranule);
  EXPECT_EQ(upstream_.Counters().unmap_calls, 1u);
  EXPECT_LE(Reserved(), 1040 * kMiB);
}

// A request that extends the free block at the top of the mapped range by one granule, with the
// pool at its cap: the pool unmaps the other free block (one call) rather than the one it extends,
// which would then cost a second unmap and a larger map.
TEST_F(SoftCapTest, KeepsTheFreeNeighbourThePlacementExtends) {
  // Soft cap and ceiling = peak + 1 MiB (the share rounds to nothing above one granule's floor
  // of 0).
  Make(Exact(0.001, 0.001, 0));
  Alloc(400 * kMiB);
  const std::uintptr_t middle = Alloc(20 * kMiB);
  Alloc(550 * kMiB);
  const std::uintptr_t top = Alloc(30 * kMiB);
  ASSERT_EQ(Reserved(), 1000 * kMiB);
  ASSERT_EQ(pool_->Free(middle, 0), PoolStatus::kOk);
  ASSERT_EQ(pool_->Free(top, 0), PoolStatus::kOk);
  const std::uint64_t maps = upstream_.Counters().map_calls;
  EXPECT_EQ(Alloc(36 * kMiB), top);
  EXPECT_EQ(upstream_.Counters().unmap_calls, 1u);
  EXPECT_EQ(upstream_.Counters().map_calls, maps + 1);
  EXPECT_EQ(Reserved(), 986 * kMiB);
}

// The slack is a share of the peak, at least a granule: a 100 MiB pool may hold 4 MiB more, a
// 10 MiB one a granule (not 0.4 MiB).
TEST_F(SoftCapTest, SlackIsAShareOfThePeakWithAGranuleFloor) {
  Make(Exact(0.04, 0.04, 1));
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 50; ++i) blocks.push_back(Alloc(kGranule));  // 100 MiB
  for (int i = 0; i < 50; i += 2) ASSERT_EQ(pool_->Free(blocks[i], 0), PoolStatus::kOk);
  // 25 free granules, none adjacent to another or to the top: a 4 MiB request maps at the top
  // while that stays within 104 MiB; the next unmaps two free granules first.
  Alloc(2 * kGranule);
  EXPECT_EQ(Reserved(), 104 * kMiB);
  EXPECT_EQ(upstream_.Counters().unmap_calls, 0u);
  Alloc(2 * kGranule);
  EXPECT_EQ(upstream_.Counters().unmap_calls, 2u);
  EXPECT_EQ(Reserved(), 104 * kMiB);

  Make(Exact(0.04, 0.04, 1));
  blocks.clear();
  for (int i = 0; i < 5; ++i) blocks.push_back(Alloc(kGranule));  // 10 MiB
  ASSERT_EQ(pool_->Free(blocks[0], 0), PoolStatus::kOk);
  ASSERT_EQ(pool_->Free(blocks[2], 0), PoolStatus::kOk);
  const std::uint64_t unmaps = upstream_.Counters().unmap_calls;
  Alloc(2 * kGranule);  // 8 + 4 > 12 MiB: one free granule goes
  EXPECT_EQ(upstream_.Counters().unmap_calls, unmaps + 1);
  EXPECT_EQ(Reserved(), 12 * kMiB);
}

}  // namespace
}  // namespace vramscope::pool
