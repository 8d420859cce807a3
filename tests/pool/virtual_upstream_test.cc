// VirtualUpstream enforces what a driver would, so pool tests catch misuse.
#include "vramscope/pool/virtual_upstream.h"

#include <gtest/gtest.h>

namespace vramscope::pool {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(VirtualUpstreamTest, AllocateAndFreeWithinCapacity) {
  VirtualUpstreamOptions options;
  options.capacity_bytes = 10 * kMiB;
  VirtualUpstream upstream(options);
  std::uintptr_t a = 0;
  std::uintptr_t b = 0;
  ASSERT_EQ(upstream.Allocate(6 * kMiB, &a), UpstreamStatus::kOk);
  EXPECT_EQ(upstream.Allocate(6 * kMiB, &b), UpstreamStatus::kOutOfMemory);
  EXPECT_EQ(upstream.Free(a, 5 * kMiB), UpstreamStatus::kInvalidArgument);  // wrong size
  ASSERT_EQ(upstream.Free(a, 6 * kMiB), UpstreamStatus::kOk);
  EXPECT_EQ(upstream.Free(a, 6 * kMiB), UpstreamStatus::kInvalidArgument);  // twice
  ASSERT_EQ(upstream.Allocate(6 * kMiB, &b), UpstreamStatus::kOk);
  EXPECT_NE(a, b);  // never reused
  const VirtualUpstreamCounters c = upstream.Counters();
  EXPECT_EQ(c.allocate_calls, 3u);
  EXPECT_EQ(c.free_calls, 3u);
  EXPECT_EQ(c.oom_count, 1u);
  EXPECT_EQ(c.invalid_calls, 2u);
  EXPECT_EQ(c.current_physical_bytes, 6 * kMiB);
  EXPECT_EQ(c.peak_physical_bytes, 6 * kMiB);
}

TEST(VirtualUpstreamTest, MapRulesFollowTheDriver) {
  VirtualUpstreamOptions options;
  options.capacity_bytes = 8 * kMiB;
  options.allow_partial_unmap = false;
  VirtualUpstream upstream(options);
  EXPECT_EQ(upstream.MapGranularity(), 2 * kMiB);
  std::uintptr_t base = 0;
  ASSERT_EQ(upstream.ReserveRange(64 * kMiB, &base), UpstreamStatus::kOk);
  EXPECT_EQ(base % (2 * kMiB), 0u);
  EXPECT_EQ(upstream.Map(base + kMiB, 2 * kMiB), UpstreamStatus::kInvalidArgument);  // unaligned
  EXPECT_EQ(upstream.Map(base + 64 * kMiB, 2 * kMiB), UpstreamStatus::kInvalidArgument);  // out
  ASSERT_EQ(upstream.Map(base, 4 * kMiB), UpstreamStatus::kOk);
  EXPECT_EQ(upstream.Map(base + 2 * kMiB, 2 * kMiB), UpstreamStatus::kInvalidArgument);  // overlap
  ASSERT_EQ(upstream.Map(base + 4 * kMiB, 2 * kMiB), UpstreamStatus::kOk);
  EXPECT_EQ(upstream.Map(base + 6 * kMiB, 4 * kMiB), UpstreamStatus::kOutOfMemory);
  // Only whole Maps, adjacent ones together (the driver's rule).
  EXPECT_EQ(upstream.Unmap(base + 2 * kMiB, 4 * kMiB), UpstreamStatus::kInvalidArgument);
  EXPECT_EQ(upstream.ReleaseRange(base, 64 * kMiB), UpstreamStatus::kInvalidArgument);  // mapped
  ASSERT_EQ(upstream.Unmap(base, 6 * kMiB), UpstreamStatus::kOk);
  EXPECT_EQ(upstream.Unmap(base, 2 * kMiB), UpstreamStatus::kInvalidArgument);  // twice
  ASSERT_EQ(upstream.ReleaseRange(base, 64 * kMiB), UpstreamStatus::kOk);
  const VirtualUpstreamCounters c = upstream.Counters();
  EXPECT_EQ(c.current_physical_bytes, 0u);
  EXPECT_EQ(c.peak_physical_bytes, 6 * kMiB);
  EXPECT_EQ(c.map_calls, 6u);
  EXPECT_EQ(c.unmap_calls, 3u);
  EXPECT_EQ(c.GrowCalls(), 7u);
  EXPECT_EQ(c.ShrinkCalls(), 5u);
}

TEST(VirtualUpstreamTest, PartialUnmapWhenAllowed) {
  VirtualUpstreamOptions options;
  options.allow_partial_unmap = true;
  VirtualUpstream upstream(options);
  EXPECT_TRUE(upstream.UnmapsPartialMaps());
  std::uintptr_t base = 0;
  ASSERT_EQ(upstream.ReserveRange(64 * kMiB, &base), UpstreamStatus::kOk);
  ASSERT_EQ(upstream.Map(base, 8 * kMiB), UpstreamStatus::kOk);
  ASSERT_EQ(upstream.Unmap(base + 2 * kMiB, 4 * kMiB), UpstreamStatus::kOk);
  EXPECT_EQ(upstream.Unmap(base + 2 * kMiB, 2 * kMiB), UpstreamStatus::kInvalidArgument);
  ASSERT_EQ(upstream.Unmap(base, 2 * kMiB), UpstreamStatus::kOk);
  ASSERT_EQ(upstream.Unmap(base + 6 * kMiB, 2 * kMiB), UpstreamStatus::kOk);
  EXPECT_EQ(upstream.Counters().current_physical_bytes, 0u);
}

TEST(VirtualUpstreamTest, WithoutVmmTheVirtualCallsAreNotSupported) {
  VirtualUpstreamOptions options;
  options.granularity = 0;
  VirtualUpstream upstream(options);
  std::uintptr_t base = 0;
  EXPECT_EQ(upstream.MapGranularity(), 0u);
  EXPECT_EQ(upstream.ReserveRange(2 * kMiB, &base), UpstreamStatus::kNotSupported);
  EXPECT_EQ(upstream.Map(0, 2 * kMiB), UpstreamStatus::kNotSupported);
}

TEST(VirtualUpstreamTest, SetCapacitySimulatesMemoryTakenElsewhere) {
  VirtualUpstream upstream;
  std::uintptr_t a = 0;
  ASSERT_EQ(upstream.Allocate(100 * kMiB, &a), UpstreamStatus::kOk);
  upstream.SetCapacity(101 * kMiB);
  EXPECT_EQ(upstream.Allocate(2 * kMiB, &a), UpstreamStatus::kOutOfMemory);
  EXPECT_EQ(upstream.TotalBytes(), 101 * kMiB);
}

}  // namespace
}  // namespace vramscope::pool
