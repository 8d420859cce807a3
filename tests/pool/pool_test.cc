// Unit tests of the two layouts' placement: packing, best fit, split and merge, out-of-memory
// verdicts, lazy unmapping and the fallback to segments without VMM.
#include "vramscope/pool/pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "pool_test_support.h"
#include "vramscope/pool/virtual_upstream.h"

namespace vramscope::pool {
namespace {

using testing::FakeFences;

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = 1024 * kKiB;

std::unique_ptr<Pool> MakeWith(Upstream* upstream, FenceTracker* fences, const char* policy,
                               std::size_t capacity = 0) {
  PoolOptions options;
  options.policy = policy;
  options.capacity_bytes = capacity;
  return MakePool(upstream, fences, options);
}

class LayoutTest : public ::testing::TestWithParam<const char*> {
 protected:
  VirtualUpstream upstream_;
  FakeFences fences_;
  std::unique_ptr<Pool> pool_ = MakeWith(&upstream_, &fences_, GetParam());

  std::uintptr_t Alloc(std::size_t size) {
    std::uintptr_t address = 0;
    EXPECT_EQ(pool_->Allocate(size, &address), PoolStatus::kOk) << size;
    return address;
  }
  void FreeNow(std::uintptr_t address) { EXPECT_EQ(pool_->Free(address, 0), PoolStatus::kOk); }
};

TEST(PoolFactoryTest, UnknownPolicyIsNull) {
  VirtualUpstream upstream;
  FakeFences fences;
  EXPECT_EQ(MakeWith(&upstream, &fences, "buddy"), nullptr);
  EXPECT_EQ(PolicyNames().substr(0, 3), "vmm");
}

TEST(PoolFactoryTest, DefaultIsVmmAndFallsBackToSegmentsWithoutVmm) {
  VirtualUpstream vmm;
  VirtualUpstreamOptions plain_options;
  plain_options.granularity = 0;
  VirtualUpstream plain(plain_options);
  FakeFences fences;
  EXPECT_EQ(MakeWith(&vmm, &fences, "")->policy(), "vmm");
  auto pool = MakeWith(&plain, &fences, "");
  EXPECT_EQ(pool->policy(), "segments");
  std::uintptr_t a = 0;
  ASSERT_EQ(pool->Allocate(100, &a), PoolStatus::kOk);
  EXPECT_EQ(plain.Counters().allocate_calls, 1u);
  EXPECT_EQ(plain.Counters().map_calls, 0u);
}

TEST(PoolStatusTest, NamesEveryStatus) {
  EXPECT_STREQ(PoolStatusName(PoolStatus::kOk), "ok");
  EXPECT_STREQ(PoolStatusName(PoolStatus::kOutOfMemory), "out_of_memory");
  EXPECT_STREQ(PoolStatusName(PoolStatus::kInvalidAddress), "invalid_address");
  EXPECT_STREQ(PoolStatusName(PoolStatus::kInvalidArgument), "invalid_argument");
  EXPECT_STREQ(PoolStatusName(PoolStatus::kUpstreamError), "upstream_error");
}

TEST_P(LayoutTest, PacksSmallRequestsSideBySide) {
  const std::uintptr_t a = Alloc(1);
  const std::uintptr_t b = Alloc(1);
  const std::uintptr_t c = Alloc(600);
  EXPECT_EQ(b, a + 512);
  EXPECT_EQ(c, b + 512);
  BlockInfo ia;
  BlockInfo ic;
  ASSERT_EQ(pool_->Lookup(a, &ia), PoolStatus::kOk);
  ASSERT_EQ(pool_->Lookup(c, &ic), PoolStatus::kOk);
  EXPECT_EQ(ia.segment_base, ic.segment_base);
  EXPECT_EQ(pool_->Stats().upstream_grow_calls, GetParam() == std::string("vmm") ? 2u : 1u);
}

TEST_P(LayoutTest, SplitsAndMergesNeighbours) {
  const std::uintptr_t a = Alloc(64 * kKiB);
  const std::uintptr_t b = Alloc(64 * kKiB);
  const std::uintptr_t c = Alloc(64 * kKiB);
  const std::uintptr_t guard = Alloc(64 * kKiB);
  ASSERT_EQ(b, a + 64 * kKiB);
  ASSERT_EQ(c, b + 64 * kKiB);
  FreeNow(b);
  FreeNow(a);  // merges with b
  FreeNow(c);  // merges with a+b
  // One free block of 192 KiB where the three were: served at a without growing.
  const std::uint64_t grows = pool_->Stats().upstream_grow_calls;
  EXPECT_EQ(Alloc(192 * kKiB), a);
  EXPECT_EQ(pool_->Stats().upstream_grow_calls, grows);
  FreeNow(guard);
}

TEST_P(LayoutTest, PlacesByBestFit) {
  // Holes of 8, 2 and 4 KiB (small bins) and of 3, 1.5 and 2 MiB (ordered index), each between
  // live blocks.
  std::vector<std::uintptr_t> holes;
  for (std::size_t size : {8 * kKiB, 2 * kKiB, 4 * kKiB}) {
    holes.push_back(Alloc(size));
    Alloc(512);
  }
  for (const std::uintptr_t h : holes) FreeNow(h);
  EXPECT_EQ(Alloc(2 * kKiB), holes[1]);  // exact
  EXPECT_EQ(Alloc(3 * kKiB), holes[2]);  // the 4 KiB hole, not the 8 KiB one
  EXPECT_EQ(Alloc(5 * kKiB), holes[0]);  // only the 8 KiB hole fits
  // The ordered index: holes of 12, 6 and 8 MiB between guards large enough to stay out of
  // the small-request pool.
  std::vector<std::uintptr_t> large;
  for (std::size_t size : {12 * kMiB, 6 * kMiB, 8 * kMiB}) {
    large.push_back(Alloc(size));
    Alloc(kMiB + 512);
  }
  for (const std::uintptr_t h : large) FreeNow(h);
  EXPECT_EQ(Alloc(7 * kMiB), large[2]);  // 8 MiB is the smallest that fits
  EXPECT_EQ(Alloc(6 * kMiB), large[1]);  // exact
}

INSTANTIATE_TEST_SUITE_P(Layouts, LayoutTest, ::testing::Values("vmm", "segments"));

TEST(SegmentsTest, SmallAndLargeRequestsUsePoolsOfTheirOwn) {
  VirtualUpstream upstream;
  FakeFences fences;
  auto pool = MakeWith(&upstream, &fences, "segments");
  std::uintptr_t small = 0;
  std::uintptr_t large = 0;
  std::uintptr_t huge = 0;
  ASSERT_EQ(pool->Allocate(kMiB, &small), PoolStatus::kOk);
  ASSERT_EQ(pool->Allocate(kMiB + 1, &large), PoolStatus::kOk);
  ASSERT_EQ(pool->Allocate(25 * kMiB, &huge), PoolStatus::kOk);  // more than the 20 MiB one has
  BlockInfo info;
  ASSERT_EQ(pool->Lookup(small, &info), PoolStatus::kOk);
  EXPECT_EQ(info.segment_size, 2 * kMiB);
  ASSERT_EQ(pool->Lookup(large, &info), PoolStatus::kOk);
  EXPECT_EQ(info.segment_size, 20 * kMiB);
  ASSERT_EQ(pool->Lookup(huge, &info), PoolStatus::kOk);
  EXPECT_EQ(info.segment_size, 26 * kMiB);
  EXPECT_EQ(pool->Stats().current_reserved_bytes, 48 * kMiB);
}

TEST(SegmentsTest, OomWithEnoughFreeBytesIsFragmentation) {
  VirtualUpstreamOptions options;
  options.capacity_bytes = 20 * kMiB;
  VirtualUpstream upstream(options);
  FakeFences fences;
  auto pool = MakeWith(&upstream, &fences, "segments");
  std::vector<std::uintptr_t> blocks(10);
  for (auto& b : blocks) ASSERT_EQ(pool->Allocate(2 * kMiB, &b), PoolStatus::kOk);
  for (std::size_t i = 0; i < blocks.size(); i += 2)
    ASSERT_EQ(pool->Free(blocks[i], 0), PoolStatus::kOk);
  std::uintptr_t big = 0;
  EXPECT_EQ(pool->Allocate(4 * kMiB, &big), PoolStatus::kOutOfMemory);
  const PoolStats s = pool->Stats();
  EXPECT_EQ(s.last_oom_verdict, OomVerdict::kFragmentation);
  EXPECT_EQ(s.oom_count, 1u);
  EXPECT_EQ(s.upstream_retries, 1u);
  EXPECT_EQ(s.free_bytes, 10 * kMiB);
  EXPECT_EQ(s.unreleasable_free_bytes, 10 * kMiB);
  EXPECT_EQ(s.largest_free_block_bytes, 2 * kMiB);
  // A request that fits a hole still works.
  ASSERT_EQ(pool->Allocate(2 * kMiB, &big), PoolStatus::kOk);
}

TEST(SegmentsTest, OomWithTooFewFreeBytesIsCapacity) {
  VirtualUpstreamOptions options;
  options.capacity_bytes = 20 * kMiB;
  VirtualUpstream upstream(options);
  FakeFences fences;
  auto pool = MakeWith(&upstream, &fences, "segments");
  std::uintptr_t a = 0;
  ASSERT_EQ(pool->Allocate(18 * kMiB, &a), PoolStatus::kOk);
  std::uintptr_t b = 0;
  EXPECT_EQ(pool->Allocate(4 * kMiB, &b), PoolStatus::kOutOfMemory);
  EXPECT_EQ(pool->Stats().last_oom_verdict, OomVerdict::kCapacity);
}

TEST(SegmentsTest, OomReleasesIdleSegmentsThenRetries) {
  VirtualUpstreamOptions options;
  options.capacity_bytes = 64 * kMiB;
  VirtualUpstream upstream(options);
  FakeFences fences;
  auto pool = MakeWith(&upstream, &fences, "segments");
  std::uintptr_t a = 0;
  ASSERT_EQ(pool->Allocate(40 * kMiB, &a), PoolStatus::kOk);
  ASSERT_EQ(pool->Free(a, 0), PoolStatus::kOk);  // cached: a 40 MiB idle segment
  std::uintptr_t b = 0;
  ASSERT_EQ(pool->Allocate(50 * kMiB, &b), PoolStatus::kOk);
  const PoolStats s = pool->Stats();
  EXPECT_EQ(s.upstream_retries, 1u);
  EXPECT_EQ(s.upstream_shrink_calls, 1u);
  EXPECT_EQ(s.current_reserved_bytes, 50 * kMiB);
  EXPECT_EQ(s.oom_count, 0u);
}

TEST(SegmentsTest, PoolCapacityIsEnforcedWithoutAskingTheUpstream) {
  VirtualUpstream upstream;
  FakeFences fences;
  auto pool = MakeWith(&upstream, &fences, "segments", 30 * kMiB);
  std::uintptr_t a = 0;
  ASSERT_EQ(pool->Allocate(16 * kMiB, &a), PoolStatus::kOk);
  std::uintptr_t b = 0;
  EXPECT_EQ(pool->Allocate(16 * kMiB, &b), PoolStatus::kOutOfMemory);
  EXPECT_EQ(upstream.Counters().oom_count, 0u);
  EXPECT_LE(pool->Stats().current_reserved_bytes, 30 * kMiB);
}

TEST(VmmTest, MapsOnlyTheGranulesAPlacementNeeds) {
  VirtualUpstream upstream;
  FakeFences fences;
  auto pool = MakeWith(&upstream, &fences, "vmm");
  std::uintptr_t a = 0;
  ASSERT_EQ(pool->Allocate(3 * kMiB, &a), PoolStatus::kOk);
  const VirtualUpstreamCounters c = upstream.Counters();
  EXPECT_EQ(c.reserve_calls, 1u);
  EXPECT_EQ(c.map_calls, 1u);
  EXPECT_EQ(c.current_physical_bytes, 4 * kMiB);
  EXPECT_EQ(pool->Stats().current_reserved_bytes, 4 * kMiB);
  EXPECT_EQ(pool->Stats().free_bytes, kMiB);
  // The free megabyte shares a granule with the live block: it cannot be unmapped.
  EXPECT_EQ(pool->Stats().unreleasable_free_bytes, kMiB);
  EXPECT_EQ(pool->ReleaseIdle(), 0u);
}

TEST(VmmTest, KeepsFreeGranulesMappedUntilAskedOrCapped) {
  VirtualUpstream upstream;
  FakeFences fences;
  auto pool = MakeWith(&upstream, &fences, "vmm");
  std::uintptr_t a = 0;
  std::uintptr_t b = 0;
  ASSERT_EQ(pool->Allocate(64 * kMiB, &a), PoolStatus::kOk);
  ASSERT_EQ(pool->Allocate(2 * kMiB, &b), PoolStatus::kOk);
  ASSERT_EQ(pool->Free(a, 0), PoolStatus::kOk);
  EXPECT_EQ(upstream.Counters().unmap_calls, 0u);  // lazy
  const std::uint64_t maps = upstream.Counters().map_calls;
  std::uintptr_t again = 0;
  ASSERT_EQ(pool->Allocate(64 * kMiB, &again), PoolStatus::kOk);
  EXPECT_EQ(again, a);
  EXPECT_EQ(upstream.Counters().map_calls, maps);  // reused, no new mapping
  ASSERT_EQ(pool->Free(again, 0), PoolStatus::kOk);
  EXPECT_EQ(pool->ReleaseIdle(), 64 * kMiB);
  EXPECT_EQ(upstream.Counters().unmap_calls, 1u);
  EXPECT_EQ(pool->Stats().current_reserved_bytes, 2 * kMiB);
}

// Over an upstream that unmaps whole Maps only, one live sliver pins its whole Map; one that maps
// pieces (one physical handle each, the shim's VRAMSCOPE_VMM_PIECE) gives back every whole free
// piece around it, and every Unmap it is asked for covers whole pieces (the upstream refuses any
// other, counting it in invalid_calls).
TEST(VmmTest, PiecesAroundALiveSliverGoBackWhereAWholeMapCannot) {
  for (const std::size_t piece : {std::size_t{0}, 8 * kMiB}) {
    VirtualUpstream upstream(
        VirtualUpstreamOptions{.allow_partial_unmap = false, .map_piece_bytes = piece});
    FakeFences fences;
    auto pool = MakeWith(&upstream, &fences, "vmm");
    std::uintptr_t big = 0;
    ASSERT_EQ(pool->Allocate(64 * kMiB, &big), PoolStatus::kOk);
    ASSERT_EQ(upstream.Counters().map_calls, 1u);
    ASSERT_EQ(pool->Free(big, 0), PoolStatus::kOk);
    // The same range again, as a small block at its start and the rest free.
    std::uintptr_t sliver = 0;
    ASSERT_EQ(pool->Allocate(kMiB, &sliver), PoolStatus::kOk);
    ASSERT_EQ(sliver, big);
    const std::size_t mapped = pool->Stats().current_reserved_bytes;  // 64 MiB and map-ahead
    const std::size_t released = pool->ReleaseIdle();
    EXPECT_EQ(pool->Stats().current_reserved_bytes, mapped - released);
    if (piece == 0) {
      EXPECT_EQ(released, 0u) << "a whole Map with a live block in it cannot go back";
    } else {
      // Everything but the pieces the sliver touches (one, or two where the Map began mid-piece).
      EXPECT_LE(mapped - released, 2 * piece) << piece;
      EXPECT_GE(mapped, 64 * kMiB);
    }
    EXPECT_EQ(upstream.Counters().invalid_calls, 0u) << piece;
    ASSERT_EQ(pool->Free(sliver, 0), PoolStatus::kOk);
    (void)pool->ReleaseIdle();
    EXPECT_EQ(upstream.Counters().current_physical_bytes, 0u) << piece;
    EXPECT_EQ(upstream.Counters().invalid_calls, 0u) << piece;
  }
}

// A Map holds at most kMaxPiecesPerMap pieces: the piece doubles for larger Maps.
TEST(VmmTest, PiecesGrowWithTheMap) {
  EXPECT_EQ(PieceBytesFor(0, 1024 * kMiB), 0u);
  EXPECT_EQ(PieceBytesFor(2 * kMiB, 64 * kMiB), 2 * kMiB);
  EXPECT_EQ(PieceBytesFor(2 * kMiB, kMaxPiecesPerMap * 2 * kMiB), 2 * kMiB);
  EXPECT_EQ(PieceBytesFor(2 * kMiB, kMaxPiecesPerMap * 2 * kMiB + 2 * kMiB), 4 * kMiB);
  for (std::size_t bytes = 2 * kMiB; bytes <= (std::size_t{64} << 30); bytes *= 3) {
    EXPECT_LE(bytes / PieceBytesFor(64 * kMiB, bytes), kMaxPiecesPerMap) << bytes;
  }
}

TEST(VmmTest, PhysicalMemoryIsNeverFragmentedAcrossGranules) {
  // Ten 2 MiB blocks fill the device; freeing every other one leaves five separate free
  // granules, which segments could not join. The VMM layout unmaps them and maps a contiguous
  // 8 MiB elsewhere in its address range.
  VirtualUpstreamOptions options;
  options.capacity_bytes = 20 * kMiB;
  VirtualUpstream upstream(options);
  FakeFences fences;
  auto pool = MakeWith(&upstream, &fences, "vmm");
  std::vector<std::uintptr_t> blocks(10);
  for (auto& b : blocks) ASSERT_EQ(pool->Allocate(2 * kMiB, &b), PoolStatus::kOk);
  for (std::size_t i = 0; i < blocks.size(); i += 2)
    ASSERT_EQ(pool->Free(blocks[i], 0), PoolStatus::kOk);
  std::uintptr_t big = 0;
  ASSERT_EQ(pool->Allocate(8 * kMiB, &big), PoolStatus::kOk);
  EXPECT_LE(upstream.Counters().current_physical_bytes, 20 * kMiB);
  EXPECT_EQ(upstream.Counters().invalid_calls, 0u);
}

TEST(VmmTest, OomWithFreeBytesInsideSharedGranulesIsFragmentation) {
  // 1 MiB blocks pack two per granule; freeing one of each pair leaves 2 MiB free that no
  // granule can give back.
  VirtualUpstreamOptions options;
  options.capacity_bytes = 4 * kMiB;
  VirtualUpstream upstream(options);
  FakeFences fences;
  auto pool = MakeWith(&upstream, &fences, "vmm");
  std::vector<std::uintptr_t> blocks(4);
  for (auto& b : blocks) ASSERT_EQ(pool->Allocate(kMiB, &b), PoolStatus::kOk);
  ASSERT_EQ(pool->Free(blocks[0], 0), PoolStatus::kOk);
  ASSERT_EQ(pool->Free(blocks[3], 0), PoolStatus::kOk);
  std::uintptr_t big = 0;
  EXPECT_EQ(pool->Allocate(2 * kMiB, &big), PoolStatus::kOutOfMemory);
  const PoolStats s = pool->Stats();
  EXPECT_EQ(s.last_oom_verdict, OomVerdict::kFragmentation);
  EXPECT_EQ(s.unreleasable_free_bytes, 2 * kMiB);
  EXPECT_EQ(upstream.Counters().invalid_calls, 0u);
}

TEST(VmmTest, OomWithoutEnoughFreeBytesIsCapacity) {
  VirtualUpstreamOptions options;
  options.capacity_bytes = 8 * kMiB;
  VirtualUpstream upstream(options);
  FakeFences fences;
  auto pool = MakeWith(&upstream, &fences, "vmm");
  std::uintptr_t a = 0;
  ASSERT_EQ(pool->Allocate(6 * kMiB, &a), PoolStatus::kOk);
  std::uintptr_t b = 0;
  EXPECT_EQ(pool->Allocate(4 * kMiB, &b), PoolStatus::kOutOfMemory);
  EXPECT_EQ(pool->Stats().last_oom_verdict, OomVerdict::kCapacity);
  EXPECT_EQ(pool->Stats().oom_count, 1u);
}

TEST(VmmTest, PendingBlocksAreNotUnmapped) {
  VirtualUpstream upstream;
  FakeFences fences;
  auto pool = MakeWith(&upstream, &fences, "vmm");
  std::uintptr_t a = 0;
  std::uintptr_t b = 0;
  ASSERT_EQ(pool->Allocate(16 * kMiB, &a), PoolStatus::kOk);
  ASSERT_EQ(pool->Allocate(2 * kMiB, &b), PoolStatus::kOk);
  ASSERT_EQ(pool->Free(a, 5), PoolStatus::kOk);
  EXPECT_EQ(pool->ReleaseIdle(), 0u);  // fence 5 has not completed: the GPU may still use it
  fences.Complete(5);
  EXPECT_EQ(pool->ReleaseIdle(), 16 * kMiB);
}

}  // namespace
}  // namespace vramscope::pool
