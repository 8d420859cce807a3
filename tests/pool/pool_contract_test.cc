// The contract every policy keeps (PolicyNames()): serving, freeing, Lookup, fences, statistics,
// out-of-memory handling and thread safety, checked against a VirtualUpstream.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "pool_test_support.h"
#include "vramscope/pool/pool.h"
#include "vramscope/pool/virtual_upstream.h"

namespace vramscope::pool {
namespace {

using testing::EpochFences;
using testing::FakeFences;
using testing::FlakyUpstream;

constexpr std::size_t kMiB = std::size_t{1} << 20;

std::vector<std::string> AllPolicies() {
  std::vector<std::string> out;
  const std::string names(PolicyNames());
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = names.find(',', start);
    out.push_back(names.substr(start, comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

// (policy, whether the upstream unmaps parts of a Map)
using ContractParam = std::tuple<std::string, bool>;

class PoolContractTest : public ::testing::TestWithParam<ContractParam> {
 protected:
  static std::string Policy() { return std::get<0>(GetParam()); }
  static VirtualUpstreamOptions UpstreamOptions() {
    VirtualUpstreamOptions options;
    options.allow_partial_unmap = std::get<1>(GetParam());
    return options;
  }

  std::unique_ptr<Pool> Make(Upstream* upstream, FenceTracker* fences, std::size_t capacity = 0) {
    PoolOptions options;
    const std::string policy = Policy();
    options.policy = policy;
    options.capacity_bytes = capacity;
    std::unique_ptr<Pool> pool = MakePool(upstream, fences, options);
    EXPECT_NE(pool, nullptr);
    return pool;
  }

  // Everything the statistics promise that can be checked from outside.
  static void ExpectConsistent(const Pool& pool, const VirtualUpstream& upstream) {
    const PoolStats s = pool.Stats();
    const VirtualUpstreamCounters c = upstream.Counters();
    EXPECT_EQ(s.current_reserved_bytes, c.current_physical_bytes);
    EXPECT_EQ(s.peak_reserved_bytes, c.peak_physical_bytes);
    EXPECT_EQ(s.upstream_grow_calls, c.GrowCalls());
    EXPECT_EQ(s.upstream_shrink_calls, c.ShrinkCalls());
    EXPECT_EQ(c.invalid_calls, 0u);
    EXPECT_EQ(s.free_bytes, s.current_reserved_bytes - s.current_allocated_bytes);
    EXPECT_LE(s.current_requested_bytes, s.current_allocated_bytes);
    EXPECT_LE(s.current_allocated_bytes, s.current_reserved_bytes);
    EXPECT_LE(s.pending_bytes, s.free_bytes);
    EXPECT_LE(s.unreleasable_free_bytes + s.pending_bytes, s.free_bytes);
    EXPECT_LE(s.largest_free_block_bytes, s.free_bytes - s.pending_bytes);
    EXPECT_LE(s.current_requested_bytes, s.peak_requested_bytes);
    EXPECT_LE(s.current_allocated_bytes, s.peak_allocated_bytes);
    EXPECT_EQ(s.alloc_count - s.free_count, s.live_blocks);
  }
};

TEST_P(PoolContractTest, ReportsItsPolicy) {
  VirtualUpstream upstream(UpstreamOptions());
  FakeFences fences;
  auto pool = Make(&upstream, &fences);
  EXPECT_EQ(pool->policy(), Policy());
}

TEST_P(PoolContractTest, ServesOneByteToTheWholeDevice) {
  VirtualUpstreamOptions options = UpstreamOptions();
  options.capacity_bytes = 256 * kMiB;
  VirtualUpstream upstream(options);
  FakeFences fences;
  auto pool = Make(&upstream, &fences);
  std::uintptr_t one = 0;
  ASSERT_EQ(pool->Allocate(1, &one), PoolStatus::kOk);
  ASSERT_EQ(pool->Free(one, 0), PoolStatus::kOk);
  pool->ReleaseIdle();
  std::uintptr_t all = 0;
  ASSERT_EQ(pool->Allocate(256 * kMiB, &all), PoolStatus::kOk);
  EXPECT_EQ(pool->Stats().current_allocated_bytes, 256 * kMiB);
  ASSERT_EQ(pool->Free(all, 0), PoolStatus::kOk);
  ExpectConsistent(*pool, upstream);
}

TEST_P(PoolContractTest, RejectsZeroAndOverCapacitySizes) {
  VirtualUpstream upstream(UpstreamOptions());
  FakeFences fences;
  auto pool = Make(&upstream, &fences, 64 * kMiB);
  std::uintptr_t address = 0;
  EXPECT_EQ(pool->Allocate(0, &address), PoolStatus::kInvalidArgument);
  EXPECT_EQ(pool->Allocate(64 * kMiB + 1, &address), PoolStatus::kInvalidArgument);
  EXPECT_EQ(pool->Stats().alloc_count, 0u);
}

TEST_P(PoolContractTest, RoundsTo512AndKeepsRequestedAndAllocatedExact) {
  VirtualUpstream upstream(UpstreamOptions());
  FakeFences fences;
  auto pool = Make(&upstream, &fences);
  std::uintptr_t a = 0;
  std::uintptr_t b = 0;
  ASSERT_EQ(pool->Allocate(1, &a), PoolStatus::kOk);
  ASSERT_EQ(pool->Allocate(513, &b), PoolStatus::kOk);
  PoolStats s = pool->Stats();
  EXPECT_EQ(s.current_requested_bytes, 514u);
  EXPECT_EQ(s.current_allocated_bytes, 512u + 1024u);
  EXPECT_EQ(a % 512, 0u);
  EXPECT_EQ(b % 512, 0u);
  ASSERT_EQ(pool->Free(a, 0), PoolStatus::kOk);
  s = pool->Stats();
  EXPECT_EQ(s.current_requested_bytes, 513u);
  EXPECT_EQ(s.current_allocated_bytes, 1024u);
  EXPECT_EQ(s.peak_requested_bytes, 514u);
  EXPECT_EQ(s.peak_allocated_bytes, 1536u);
  ExpectConsistent(*pool, upstream);
}

TEST_P(PoolContractTest, InvalidFreesAreRejectedWithoutHarm) {
  VirtualUpstream upstream(UpstreamOptions());
  FakeFences fences;
  auto pool = Make(&upstream, &fences);
  std::uintptr_t a = 0;
  ASSERT_EQ(pool->Allocate(4096, &a), PoolStatus::kOk);
  EXPECT_EQ(pool->Free(0, 0), PoolStatus::kInvalidAddress);
  EXPECT_EQ(pool->Free(12345, 0), PoolStatus::kInvalidAddress);
  EXPECT_EQ(pool->Free(a + 512, 0), PoolStatus::kInvalidAddress);  // interior
  ASSERT_EQ(pool->Free(a, 0), PoolStatus::kOk);
  EXPECT_EQ(pool->Free(a, 0), PoolStatus::kInvalidAddress);  // double free
  EXPECT_EQ(pool->Stats().free_count, 1u);
  ExpectConsistent(*pool, upstream);
}

TEST_P(PoolContractTest, LookupFindsInteriorPointersOfLiveBlocksOnly) {
  VirtualUpstream upstream(UpstreamOptions());
  FakeFences fences;
  auto pool = Make(&upstream, &fences);
  std::vector<std::uintptr_t> blocks;
  for (std::size_t size : {100u, 5000u, 3u << 20, 700u, 40u << 20}) {
    std::uintptr_t address = 0;
    ASSERT_EQ(pool->Allocate(size, &address), PoolStatus::kOk);
    blocks.push_back(address);
  }
  const std::size_t sizes[] = {100, 5000, 3 << 20, 700, 40 << 20};
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    for (std::size_t offset : {std::size_t{0}, sizes[i] / 2, sizes[i] - 1}) {
      BlockInfo info;
      ASSERT_EQ(pool->Lookup(blocks[i] + offset, &info), PoolStatus::kOk) << i << " " << offset;
      EXPECT_EQ(info.address, blocks[i]);
      EXPECT_EQ(info.requested, sizes[i]);
      EXPECT_EQ(info.allocated, (sizes[i] + 511) / 512 * 512);
      EXPECT_LE(info.segment_base, info.address);
      EXPECT_GE(info.segment_base + info.segment_size, info.address + info.allocated);
    }
  }
  BlockInfo info;
  EXPECT_EQ(pool->Lookup(1, &info), PoolStatus::kInvalidAddress);
  ASSERT_EQ(pool->Free(blocks[1], 0), PoolStatus::kOk);
  EXPECT_EQ(pool->Lookup(blocks[1] + 10, &info), PoolStatus::kInvalidAddress);
}

TEST_P(PoolContractTest, BlockIsNotReusedBeforeItsFenceCompletes) {
  VirtualUpstream upstream(UpstreamOptions());
  FakeFences fences;
  auto pool = Make(&upstream, &fences);
  std::uintptr_t a = 0;
  ASSERT_EQ(pool->Allocate(8192, &a), PoolStatus::kOk);
  ASSERT_EQ(pool->Free(a, 7), PoolStatus::kOk);
  EXPECT_EQ(pool->Stats().pending_bytes, 8192u);
  std::uintptr_t b = 0;
  ASSERT_EQ(pool->Allocate(8192, &b), PoolStatus::kOk);
  EXPECT_NE(b, a);
  EXPECT_GT(fences.is_complete_calls, 0u);
  EXPECT_TRUE(fences.retired.empty());

  fences.Complete(7);
  std::uintptr_t c = 0;
  ASSERT_EQ(pool->Allocate(8192, &c), PoolStatus::kOk);
  EXPECT_EQ(c, a);  // the same best fit, now that it is safe
  EXPECT_EQ(pool->Stats().pending_bytes, 0u);
  EXPECT_EQ(fences.retired, std::vector<std::uint64_t>{7});
  EXPECT_TRUE(fences.waited.empty());
  ExpectConsistent(*pool, upstream);
}

// Quick reuse: a fenced block whose fence completed waits unmerged in a bin of its size. It is
// free memory, not a live block, and the next request of its size gets it back.
TEST_P(PoolContractTest, BinnedBlocksAreFreeMemoryAndServeTheirSizeFirst) {
  VirtualUpstream upstream(UpstreamOptions());
  FakeFences fences;
  auto pool = Make(&upstream, &fences);
  std::uintptr_t a = 0;
  std::uintptr_t b = 0;
  std::uintptr_t c = 0;
  std::uintptr_t x[3] = {};
  ASSERT_EQ(pool->Allocate(64 << 10, &a), PoolStatus::kOk);
  ASSERT_EQ(pool->Allocate(64 << 10, &b), PoolStatus::kOk);
  for (auto& p : x) ASSERT_EQ(pool->Allocate(4096, &p), PoolStatus::kOk);
  ASSERT_EQ(pool->Free(x[1], 0), PoolStatus::kOk);  // an exact 4 KiB hole between live blocks
  ASSERT_EQ(pool->Free(a, 3), PoolStatus::kOk);
  fences.Complete(3);
  // Polls (`a` goes to its bin), then another size: the exact hole, the bin left alone.
  ASSERT_EQ(pool->Allocate(4096, &c), PoolStatus::kOk);
  EXPECT_EQ(c, x[1]);
  PoolStats s = pool->Stats();
  EXPECT_EQ(s.pending_bytes, 0u);
  EXPECT_EQ(s.current_allocated_bytes, (64u << 10) + 3 * 4096u);
  EXPECT_GE(s.unreleasable_free_bytes, 64u << 10);  // binned: not given back before merging
  BlockInfo info;
  EXPECT_EQ(pool->Lookup(a, &info), PoolStatus::kInvalidAddress);
  EXPECT_EQ(pool->Free(a, 0), PoolStatus::kInvalidAddress);  // a double free stays refused
  ExpectConsistent(*pool, upstream);
  std::uintptr_t d = 0;
  ASSERT_EQ(pool->Allocate(64 << 10, &d), PoolStatus::kOk);
  EXPECT_EQ(d, a);
  EXPECT_EQ(pool->Lookup(a + 100, &info), PoolStatus::kOk);
  EXPECT_EQ(info.requested, 64u << 10);
  // A request of another size with no exact fit merges the bins first: the binned block is
  // split for the 8 KiB request rather than a fresh part of the pool.
  ASSERT_EQ(pool->Free(d, 4), PoolStatus::kOk);
  fences.Complete(4);
  std::uintptr_t e = 0;
  ASSERT_EQ(pool->Allocate(8192, &e), PoolStatus::kOk);
  EXPECT_EQ(e, a);
  for (std::uintptr_t y : {b, c, e, x[0], x[2]}) ASSERT_EQ(pool->Free(y, 0), PoolStatus::kOk);
  ExpectConsistent(*pool, upstream);
}

// kSettledFence: the caller knows no queued work can touch the block (the shim's ordered
// reuse). It is never pending, asks the tracker nothing, and the next request of its size gets
// it back at once, unmerged; a double free of it stays refused.
TEST_P(PoolContractTest, SettledFreesAreReusableAtOnce) {
  VirtualUpstream upstream(UpstreamOptions());
  FakeFences fences;
  auto pool = Make(&upstream, &fences);
  std::uintptr_t a = 0;
  std::uintptr_t live = 0;
  ASSERT_EQ(pool->Allocate(1 << 20, &a), PoolStatus::kOk);
  ASSERT_EQ(pool->Allocate(4096, &live), PoolStatus::kOk);
  ASSERT_EQ(pool->Free(a, kSettledFence), PoolStatus::kOk);
  EXPECT_EQ(pool->Free(a, kSettledFence), PoolStatus::kInvalidAddress);
  EXPECT_EQ(pool->Stats().pending_bytes, 0u);
  EXPECT_EQ(pool->Stats().current_allocated_bytes, 4096u);
  ExpectConsistent(*pool, upstream);
  for (int i = 0; i < 100; ++i) {
    std::uintptr_t again = 0;
    ASSERT_EQ(pool->Allocate(1 << 20, &again), PoolStatus::kOk);
    ASSERT_EQ(again, a);
    ASSERT_EQ(pool->Free(again, kSettledFence), PoolStatus::kOk);
  }
  EXPECT_EQ(fences.is_complete_calls, 0u);
  EXPECT_TRUE(fences.waited.empty());
  ASSERT_EQ(pool->Free(live, 0), PoolStatus::kOk);
  ExpectConsistent(*pool, upstream);
}

// Binned blocks never make the pool grow: a request no bin and no indexed block serves merges
// the bins first, and the largest free block counts runs of binned neighbours.
TEST_P(PoolContractTest, BinsAreMergedBeforeThePoolGrowsOrReleases) {
  VirtualUpstream upstream(UpstreamOptions());
  FakeFences fences;
  fences.in_order = true;
  fences.needs_retire = false;
  auto pool = Make(&upstream, &fences);
  std::vector<std::uintptr_t> blocks(40);
  for (auto& a : blocks) ASSERT_EQ(pool->Allocate(2 << 20, &a), PoolStatus::kOk);
  std::uintptr_t keep = 0;
  ASSERT_EQ(pool->Allocate(512, &keep), PoolStatus::kOk);
  for (std::uintptr_t a : blocks) ASSERT_EQ(pool->Free(a, 1), PoolStatus::kOk);
  fences.Complete(1);
  std::uintptr_t small = 0;
  ASSERT_EQ(pool->Allocate(512, &small), PoolStatus::kOk);  // polls: the 2 MiB blocks are binned
  PoolStats s = pool->Stats();
  EXPECT_EQ(s.pending_bytes, 0u);
  EXPECT_GE(s.largest_free_block_bytes, 20u << 20);  // a run of binned neighbours
  const std::uint64_t grows = s.upstream_grow_calls;
  std::uintptr_t big = 0;
  ASSERT_EQ(pool->Allocate(s.largest_free_block_bytes, &big), PoolStatus::kOk);
  EXPECT_EQ(pool->Stats().upstream_grow_calls, grows);
  EXPECT_TRUE(fences.retired.empty());  // this tracker needs no Retire
  ExpectConsistent(*pool, upstream);
  // Binned memory goes back on ReleaseIdle like any free memory.
  ASSERT_EQ(pool->Free(big, 2), PoolStatus::kOk);
  fences.Complete(2);
  std::uintptr_t other = 0;
  ASSERT_EQ(pool->Allocate(512, &other), PoolStatus::kOk);
  for (std::uintptr_t x : {keep, small, other}) ASSERT_EQ(pool->Free(x, 0), PoolStatus::kOk);
  pool->ReleaseIdle();
  s = pool->Stats();
  EXPECT_EQ(s.current_reserved_bytes, 0u);
  EXPECT_EQ(s.unreleasable_free_bytes, 0u);
  ExpectConsistent(*pool, upstream);
}

TEST_P(PoolContractTest, PendingFencesArePolledInBatchesOldestFirst) {
  VirtualUpstream upstream(UpstreamOptions());
  FakeFences fences;
  auto pool = Make(&upstream, &fences);
  std::vector<std::uintptr_t> blocks(100);
  for (auto& a : blocks) ASSERT_EQ(pool->Allocate(4096, &a), PoolStatus::kOk);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_EQ(pool->Free(blocks[i], 1 + i / 10), PoolStatus::kOk);  // 10 fences, 10 blocks each
  }
  fences.is_complete_calls = 0;
  std::uintptr_t a = 0;
  ASSERT_EQ(pool->Allocate(4096, &a), PoolStatus::kOk);
  // One batch: a few fences, not one call per pending block.
  EXPECT_LE(fences.is_complete_calls, 10u);
  EXPECT_GE(fences.is_complete_calls, 1u);

  for (std::uint64_t f = 1; f <= 10; ++f) fences.Complete(f);
  pool->ReleaseIdle();
  EXPECT_EQ(pool->Stats().pending_bytes, 0u);
  EXPECT_EQ(fences.retired.size(), 10u);
  EXPECT_TRUE(std::is_sorted(fences.retired.begin(), fences.retired.end()));
  ExpectConsistent(*pool, upstream);
}

TEST_P(PoolContractTest, InOrderFencesStopTheBoundedPollAtTheFirstIncompleteOne) {
  VirtualUpstream upstream(UpstreamOptions());
  FakeFences fences;
  fences.in_order = true;
  auto pool = Make(&upstream, &fences);
  std::vector<std::uintptr_t> blocks(100);
  for (auto& a : blocks) ASSERT_EQ(pool->Allocate(4096, &a), PoolStatus::kOk);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_EQ(pool->Free(blocks[i], 1 + i / 10), PoolStatus::kOk);  // 10 fences, 10 blocks each
  }
  fences.is_complete_calls = 0;
  std::uintptr_t a = 0;
  ASSERT_EQ(pool->Allocate(4096, &a), PoolStatus::kOk);  // served from free memory
  EXPECT_EQ(fences.is_complete_calls, 1u);               // fence 1 is incomplete: stop there
  fences.Complete(1);
  fences.Complete(2);
  fences.is_complete_calls = 0;
  std::uintptr_t b = 0;
  ASSERT_EQ(pool->Allocate(4096, &b), PoolStatus::kOk);
  EXPECT_EQ(fences.is_complete_calls, 3u);  // 1 and 2 complete, 3 is not
  EXPECT_EQ(pool->Stats().pending_bytes, 80u * 4096);
  ASSERT_EQ(pool->Free(a, 0), PoolStatus::kOk);
  ASSERT_EQ(pool->Free(b, 0), PoolStatus::kOk);
  ExpectConsistent(*pool, upstream);
}

TEST_P(PoolContractTest, AllocateCachedNeverGrowsAndRecordsNoOom) {
  VirtualUpstream upstream(UpstreamOptions());
  FakeFences fences;
  auto pool = Make(&upstream, &fences);
  std::uintptr_t a = 0;
  BlockSizes sizes;
  // Nothing held yet: the cached path declines without asking the upstream.
  EXPECT_EQ(pool->AllocateCached(kMiB, &a, &sizes), PoolStatus::kOutOfMemory);
  EXPECT_EQ(upstream.Counters().GrowCalls(), 0u);
  ASSERT_EQ(pool->AllocateSized(kMiB, &a, &sizes), PoolStatus::kOk);
  const std::uint64_t grows = upstream.Counters().GrowCalls();
  // Use up whatever else the first growth brought, through the cached path only.
  std::vector<std::uintptr_t> fillers;
  for (std::uintptr_t f = 0; pool->AllocateCached(kMiB, &f, &sizes) == PoolStatus::kOk;) {
    fillers.push_back(f);
    ASSERT_LT(fillers.size(), 1024u);
  }
  ASSERT_EQ(pool->Free(a, 5), PoolStatus::kOk);
  EXPECT_EQ(pool->PendingBytesRelaxed(), kMiB);
  // The only block that fits waits for its fence: declined, and nothing recorded.
  const PoolStats before = pool->Stats();
  std::uintptr_t b = 0;
  EXPECT_EQ(pool->AllocateCached(kMiB, &b, &sizes), PoolStatus::kOutOfMemory);
  EXPECT_EQ(pool->Stats().oom_count, 0u);
  EXPECT_EQ(pool->Stats().alloc_count, before.alloc_count);
  EXPECT_EQ(upstream.Counters().GrowCalls(), grows);
  fences.Complete(5);
  ASSERT_EQ(pool->AllocateCached(kMiB, &b, &sizes), PoolStatus::kOk);
  EXPECT_EQ(b, a);
  EXPECT_EQ(sizes.requested, kMiB);
  EXPECT_EQ(pool->PendingBytesRelaxed(), 0u);
  EXPECT_EQ(upstream.Counters().GrowCalls(), grows);
  ASSERT_EQ(pool->Free(b, 0), PoolStatus::kOk);
  for (std::uintptr_t f : fillers) ASSERT_EQ(pool->Free(f, 0), PoolStatus::kOk);
  ExpectConsistent(*pool, upstream);
}

TEST_P(PoolContractTest, DrainPendingWaitsForEveryFence) {
  VirtualUpstream upstream(UpstreamOptions());
  FakeFences fences;
  auto pool = Make(&upstream, &fences);
  std::uintptr_t a = 0;
  std::uintptr_t b = 0;
  ASSERT_EQ(pool->Allocate(1000, &a), PoolStatus::kOk);
  ASSERT_EQ(pool->Allocate(3 << 20, &b), PoolStatus::kOk);
  ASSERT_EQ(pool->Free(a, 3), PoolStatus::kOk);
  ASSERT_EQ(pool->Free(b, 4), PoolStatus::kOk);
  pool->DrainPending();
  EXPECT_EQ(fences.waited, (std::vector<std::uint64_t>{3, 4}));
  EXPECT_EQ(pool->Stats().pending_bytes, 0u);
  EXPECT_EQ(pool->Stats().fence_waits, 2u);
  ExpectConsistent(*pool, upstream);
}

TEST_P(PoolContractTest, UnderPressureWaitsOnTheOldestFenceRatherThanFailing) {
  VirtualUpstreamOptions options = UpstreamOptions();
  options.capacity_bytes = 64 * kMiB;
  VirtualUpstream upstream(options);
  FakeFences fences;
  auto pool = Make(&upstream, &fences);
  std::uintptr_t a = 0;
  ASSERT_EQ(pool->Allocate(48 * kMiB, &a), PoolStatus::kOk);
  ASSERT_EQ(pool->Free(a, 9), PoolStatus::kOk);
  std::uintptr_t b = 0;
  ASSERT_EQ(pool->Allocate(48 * kMiB, &b), PoolStatus::kOk);
  EXPECT_EQ(fences.waited, std::vector<std::uint64_t>{9});
  const PoolStats s = pool->Stats();
  EXPECT_EQ(s.fence_waits, 1u);
  EXPECT_EQ(s.oom_count, 0u);
  EXPECT_LE(s.current_reserved_bytes, 64 * kMiB);
  ExpectConsistent(*pool, upstream);
}

TEST_P(PoolContractTest, UpstreamOomReleasesIdleMemoryAndRetriesOnce) {
  VirtualUpstream inner(UpstreamOptions());
  FlakyUpstream upstream(&inner);
  FakeFences fences;
  auto pool = Make(&upstream, &fences);
  std::uintptr_t keep = 0;
  std::uintptr_t idle = 0;
  ASSERT_EQ(pool->Allocate(30 * kMiB, &idle), PoolStatus::kOk);
  ASSERT_EQ(pool->Allocate(30 * kMiB, &keep), PoolStatus::kOk);
  ASSERT_EQ(pool->Free(idle, 0), PoolStatus::kOk);
  const PoolStats before = pool->Stats();

  upstream.fail_grows = 1;
  std::uintptr_t big = 0;
  ASSERT_EQ(pool->Allocate(100 * kMiB, &big), PoolStatus::kOk);
  const PoolStats after = pool->Stats();
  EXPECT_EQ(after.upstream_retries, 1u);
  EXPECT_GT(after.upstream_shrink_calls, before.upstream_shrink_calls);  // idle memory went back
  EXPECT_EQ(after.oom_count, 0u);
  // What is left cached after the release is only what could not go back.
  EXPECT_LE(after.current_reserved_bytes, 30 * kMiB + 100 * kMiB + 4 * kMiB);
  EXPECT_EQ(inner.Counters().invalid_calls, 0u);
}

TEST_P(PoolContractTest, SecondUpstreamOomFailsWithCapacityVerdict) {
  VirtualUpstream inner(UpstreamOptions());
  FlakyUpstream upstream(&inner);
  FakeFences fences;
  auto pool = Make(&upstream, &fences);
  upstream.fail_grows = 100;
  std::uintptr_t address = 0;
  EXPECT_EQ(pool->Allocate(10 * kMiB, &address), PoolStatus::kOutOfMemory);
  const PoolStats s = pool->Stats();
  EXPECT_EQ(s.oom_count, 1u);
  EXPECT_EQ(s.upstream_retries, 1u);
  EXPECT_EQ(s.last_oom_verdict, OomVerdict::kCapacity);
  EXPECT_EQ(s.live_blocks, 0u);
}

TEST_P(PoolContractTest, LargestFreeBlockIsServedWithoutAnUpstreamCall) {
  VirtualUpstream upstream(UpstreamOptions());
  FakeFences fences;
  auto pool = Make(&upstream, &fences);
  std::mt19937_64 rng(7);
  std::vector<std::uintptr_t> live;
  for (int i = 0; i < 300; ++i) {
    std::uintptr_t a = 0;
    ASSERT_EQ(pool->Allocate(std::uniform_int_distribution<std::size_t>(1, 8 << 20)(rng), &a),
              PoolStatus::kOk);
    live.push_back(a);
  }
  std::shuffle(live.begin(), live.end(), rng);
  for (std::size_t i = 0; i < live.size() / 2; ++i)
    ASSERT_EQ(pool->Free(live[i], 0), PoolStatus::kOk);
  const PoolStats s = pool->Stats();
  ASSERT_GT(s.largest_free_block_bytes, 0u);
  std::uintptr_t a = 0;
  ASSERT_EQ(pool->Allocate(s.largest_free_block_bytes, &a), PoolStatus::kOk);
  EXPECT_EQ(pool->Stats().upstream_grow_calls, s.upstream_grow_calls);
  ExpectConsistent(*pool, upstream);
}

TEST_P(PoolContractTest, ReleaseIdleLeavesOnlyUnreleasableFreeBytes) {
  VirtualUpstream upstream(UpstreamOptions());
  FakeFences fences;
  auto pool = Make(&upstream, &fences);
  std::mt19937_64 rng(11);
  std::vector<std::uintptr_t> live;
  for (int i = 0; i < 500; ++i) {
    std::uintptr_t a = 0;
    ASSERT_EQ(pool->Allocate(std::uniform_int_distribution<std::size_t>(1, 3 << 20)(rng), &a),
              PoolStatus::kOk);
    live.push_back(a);
  }
  std::shuffle(live.begin(), live.end(), rng);
  for (std::size_t i = 0; i < 400; ++i) ASSERT_EQ(pool->Free(live[i], 0), PoolStatus::kOk);
  const std::uint64_t before = pool->Stats().current_reserved_bytes;
  const std::size_t released = pool->ReleaseIdle();
  PoolStats s = pool->Stats();
  EXPECT_EQ(s.current_reserved_bytes, before - released);
  EXPECT_EQ(s.free_bytes, s.unreleasable_free_bytes);
  ExpectConsistent(*pool, upstream);
  for (std::size_t i = 400; i < live.size(); ++i)
    ASSERT_EQ(pool->Free(live[i], 0), PoolStatus::kOk);
  pool->ReleaseIdle();
  s = pool->Stats();
  EXPECT_EQ(s.current_reserved_bytes, 0u);
  EXPECT_EQ(s.unreleasable_free_bytes, 0u);
  ExpectConsistent(*pool, upstream);
}

// A shadow model of live blocks checks every statistic after every operation.
TEST_P(PoolContractTest, StatisticsAreExactAtEveryStep) {
  VirtualUpstream upstream(UpstreamOptions());
  FakeFences fences;
  auto pool = Make(&upstream, &fences);
  std::mt19937_64 rng(3);
  std::unordered_map<std::uintptr_t, std::size_t> live;
  std::uint64_t requested = 0, allocated = 0, peak_requested = 0, peak_allocated = 0;
  std::uint64_t fence = 0;
  for (int step = 0; step < 3000; ++step) {
    const int op = std::uniform_int_distribution<int>(0, 9)(rng);
    if (op < 5 || live.empty()) {
      const std::size_t size = op == 0
                                   ? std::uniform_int_distribution<std::size_t>(1, 64 << 20)(rng)
                                   : std::uniform_int_distribution<std::size_t>(1, 70000)(rng);
      std::uintptr_t a = 0;
      ASSERT_EQ(pool->Allocate(size, &a), PoolStatus::kOk);
      ASSERT_EQ(live.count(a), 0u);
      live[a] = size;
      requested += size;
      allocated += (size + 511) / 512 * 512;
    } else {
      auto it = live.begin();
      std::advance(it, std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng));
      const std::uint64_t f = op == 9 ? ++fence : 0;
      ASSERT_EQ(pool->Free(it->first, f), PoolStatus::kOk);
      requested -= it->second;
      allocated -= (it->second + 511) / 512 * 512;
      live.erase(it);
      if (step % 7 == 0) fences.Complete(fence);
      if (step % 500 == 0) pool->ReleaseIdle();
    }
    peak_requested = std::max(peak_requested, requested);
    peak_allocated = std::max(peak_allocated, allocated);
    const PoolStats s = pool->Stats();
    ASSERT_EQ(s.current_requested_bytes, requested);
    ASSERT_EQ(s.current_allocated_bytes, allocated);
    ASSERT_EQ(s.peak_requested_bytes, peak_requested);
    ASSERT_EQ(s.peak_allocated_bytes, peak_allocated);
    ASSERT_EQ(s.live_blocks, live.size());
    if (step % 100 == 0) {
      ExpectConsistent(*pool, upstream);
      // The page map behind Lookup survives every split and merge.
      for (const auto& [a, size] : live) {
        BlockInfo info;
        ASSERT_EQ(pool->Lookup(a + size - 1, &info), PoolStatus::kOk);
        ASSERT_EQ(info.address, a);
        ASSERT_EQ(pool->Lookup(a, &info), PoolStatus::kOk);
        ASSERT_EQ(info.requested, size);
      }
    }
  }
  ExpectConsistent(*pool, upstream);
}

// Interleaving provoked: threads allocate, touch (Lookup) and free concurrently, mixing fenced
// and unfenced frees while a completer thread advances the fence epoch:
//
//   T1: Allocate ─ Lookup ─ Free(f) ─ Allocate ...
//   T2:    Allocate ─ Free(0) ─ Allocate ─ Lookup ...
//   T0:          completed = 5 ─── completed = 9 ...
//
// Live blocks of all threads must never overlap and every statistic must balance at the end.
TEST_P(PoolContractTest, ConcurrentUseKeepsBlocksDisjointAndStatsBalanced) {
  VirtualUpstream upstream(UpstreamOptions());
  EpochFences fences;
  auto pool = Make(&upstream, &fences);
  constexpr int kThreads = 4;
  constexpr int kOps = 4000;
  std::atomic<std::uint64_t> next_fence{1};
  std::vector<std::vector<std::pair<std::uintptr_t, std::size_t>>> kept(kThreads);
  std::vector<std::thread> threads;
  std::atomic<bool> failed{false};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      auto& mine = kept[t];
      for (int i = 0; i < kOps; ++i) {
        if (mine.size() < 50 && (mine.empty() || rng() % 2 == 0)) {
          const std::size_t size = rng() % 16 == 0 ? 1 + rng() % (16 << 20) : 1 + rng() % 9000;
          std::uintptr_t a = 0;
          if (pool->Allocate(size, &a) != PoolStatus::kOk) failed = true;
          BlockInfo info;
          if (pool->Lookup(a + size - 1, &info) != PoolStatus::kOk || info.address != a) {
            failed = true;
          }
          mine.emplace_back(a, size);
        } else {
          const std::size_t k = rng() % mine.size();
          const std::uint64_t f = rng() % 3 == 0 ? next_fence++ : 0;
          if (pool->Free(mine[k].first, f) != PoolStatus::kOk) failed = true;
          mine[k] = mine.back();
          mine.pop_back();
          if (rng() % 8 == 0) fences.Wait(next_fence.load());  // completes all fences so far
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_FALSE(failed.load());
  std::vector<std::pair<std::uintptr_t, std::size_t>> all;
  for (const auto& mine : kept) all.insert(all.end(), mine.begin(), mine.end());
  std::sort(all.begin(), all.end());
  for (std::size_t i = 1; i < all.size(); ++i) {
    ASSERT_LE(all[i - 1].first + all[i - 1].second, all[i].first) << "overlapping live blocks";
  }
  for (const auto& [a, size] : all) ASSERT_EQ(pool->Free(a, 0), PoolStatus::kOk);
  pool->DrainPending();
  const PoolStats s = pool->Stats();
  EXPECT_EQ(s.live_blocks, 0u);
  EXPECT_EQ(s.current_requested_bytes, 0u);
  EXPECT_EQ(s.current_allocated_bytes, 0u);
  EXPECT_EQ(s.pending_bytes, 0u);
  EXPECT_EQ(s.alloc_count, s.free_count);
  ExpectConsistent(*pool, upstream);
  pool->ReleaseIdle();
  EXPECT_EQ(pool->Stats().current_reserved_bytes, 0u);
}

TEST_P(PoolContractTest, DestructionGivesEverythingBack) {
  VirtualUpstream upstream(UpstreamOptions());
  FakeFences fences;
  {
    auto pool = Make(&upstream, &fences);
    std::uintptr_t a = 0;
    std::uintptr_t b = 0;
    ASSERT_EQ(pool->Allocate(5 << 20, &a), PoolStatus::kOk);
    ASSERT_EQ(pool->Allocate(300, &b), PoolStatus::kOk);
    ASSERT_EQ(pool->Free(a, 0), PoolStatus::kOk);
  }
  const VirtualUpstreamCounters c = upstream.Counters();
  EXPECT_EQ(c.current_physical_bytes, 0u);
  EXPECT_EQ(c.current_reserved_va_bytes, 0u);
  EXPECT_EQ(c.invalid_calls, 0u);
}

INSTANTIATE_TEST_SUITE_P(AllPolicies, PoolContractTest,
                         ::testing::Combine(::testing::ValuesIn(AllPolicies()), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<ContractParam>& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) ? "_PartialUnmap" : "_WholeMapsOnly");
                         });

}  // namespace
}  // namespace vramscope::pool
