// The stats engine on crafted event streams: exact peaks, accounting by kind, reconciliation with
// the ring counters, NVTX ranges, leaks, fragmentation, OOM verdicts, the bounded timeline.
#include "stats/stats_engine.h"

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "event_builder.h"
#include "stats/timeline.h"

namespace vramscope::collector {
namespace {

using testing::EventStream;

v1::Report Compute(const EventStream& stream, StatsOptions options = {}) {
  ProcessStatsEngine stats(options);
  for (const v1::Event& e : stream.events()) stats.Add(e);
  return stats.Report();
}

const v1::DeviceReport& Device(const v1::Report& report, std::uint32_t ordinal) {
  for (const v1::DeviceReport& d : report.devices()) {
    if (d.device().ordinal() == ordinal) return d;
  }
  static const v1::DeviceReport kNone;
  ADD_FAILURE() << "no device " << ordinal;
  return kNone;
}

TEST(StatsEngineTest, ExactPeaksOfRequestedAllocatedReserved) {
  EventStream s;
  s.Start()
      .Reserve(4096)
      .Alloc(0x10, 1000, 1024)
      .Alloc(0x20, 2000, 2048)
      .Free(0x10)
      .Alloc(0x30, 500, 512)
      .Reserve(8192)
      .Alloc(0x40, 5000, 5120)
      .Free(0x20)
      .Free(0x30)
      .Release(4096);
  const v1::Report report = Compute(s);
  ASSERT_EQ(report.devices_size(), 1);
  const v1::DeviceReport& d = report.devices(0);
  EXPECT_EQ(d.peak_requested_bytes(), 2000u + 500 + 5000);
  EXPECT_EQ(d.peak_allocated_bytes(), 2048u + 512 + 5120);
  EXPECT_EQ(d.peak_reserved_bytes(), 4096u + 8192);
  EXPECT_EQ(d.current_requested_bytes(), 5000u);
  EXPECT_EQ(d.current_allocated_bytes(), 5120u);
  EXPECT_EQ(d.current_reserved_bytes(), 8192u);
  EXPECT_DOUBLE_EQ(d.reserved_over_allocated(), 12288.0 / 7680.0);
  EXPECT_EQ(d.fragmentation().rounding_waste_bytes(), 120u);
  EXPECT_EQ(d.alloc_count(), 4u);
  EXPECT_EQ(d.free_count(), 3u);
  EXPECT_EQ(d.pool_reserve_count(), 2u);
  EXPECT_EQ(d.pool_release_count(), 1u);
  EXPECT_EQ(d.peak_bytes_by_kind().at("pooled"), 2048u + 512 + 5120);
  EXPECT_GT(d.allocs_per_second(), 0.0);
  EXPECT_EQ(report.events(), s.events().size());
  EXPECT_FALSE(report.finished());
  EXPECT_EQ(report.process().pid(), 100u);
  ASSERT_EQ(report.command_line_size(), 1);
  EXPECT_EQ(report.mode(), "pool");
}

TEST(StatsEngineTest, PassedThroughKindsAreReservedHostIsNotDeviceMemory) {
  EventStream s;
  s.Alloc(0x1, 100, 100, 0, v1::ALLOCATION_KIND_STREAM_ORDERED)
      .Alloc(0x2, 300, 300, 0, v1::ALLOCATION_KIND_HOST)
      .Alloc(0x3, 50, 50, 0, v1::ALLOCATION_KIND_IPC_IMPORT)
      .Free(0x1);
  const v1::DeviceReport d = Compute(s).devices(0);
  EXPECT_EQ(d.peak_allocated_bytes(), 100u);
  EXPECT_EQ(d.peak_reserved_bytes(), 100u);
  EXPECT_EQ(d.current_reserved_bytes(), 0u);
  EXPECT_EQ(d.peak_bytes_by_kind().at("host"), 300u);
  EXPECT_EQ(d.peak_bytes_by_kind().at("stream_ordered"), 100u);
  EXPECT_EQ(d.alloc_count(), 3u);
}

// An exported pooled block (IPC_EXPORT, keyed apart from the block: vramscope/ring.h) adds no
// bytes to the process's figures, but its own kind says how much this process shares out, beside
// what it maps in from others (IPC_IMPORT): a multi-process report adds up.
TEST(StatsEngineTest, IpcExportsAreNamedAndCountNoBytes) {
  constexpr std::uint64_t kExport = 0xFFFFFFFFFFFE0000ull;
  EventStream s;
  s.Alloc(0x1000, 4096, 4096, 0, v1::ALLOCATION_KIND_POOLED)
      .Alloc(kExport + 3, 4096, 4096, 0, v1::ALLOCATION_KIND_IPC_EXPORT)
      .Alloc(0x9000, 8192, 8192, 0, v1::ALLOCATION_KIND_IPC_IMPORT)
      .Free(kExport + 3)
      .Free(0x1000);
  const v1::DeviceReport d = Compute(s).devices(0);
  EXPECT_EQ(d.peak_requested_bytes(), 4096u);
  EXPECT_EQ(d.peak_allocated_bytes(), 4096u);
  EXPECT_EQ(d.peak_bytes_by_kind().at("ipc_export"), 4096u);
  EXPECT_EQ(d.peak_bytes_by_kind().at("ipc_import"), 8192u);
}

// CUDA arrays (requested: texel bytes, allocated: the driver's size) and a device's graph memory
// pool (one entry whose size changes by a free and an alloc) are device memory the driver holds.
TEST(StatsEngineTest, ArrayAndGraphPoolKindsAreReservedAndNamed) {
  constexpr std::uint64_t kPool = 0xFFFFFFFFFFFF0000ull;
  EventStream s;
  s.Alloc(0x10, 1000, 4096, 0, v1::ALLOCATION_KIND_ARRAY)
      .Alloc(kPool, 5000, 5000, 0, v1::ALLOCATION_KIND_GRAPH)
      .Free(kPool)
      .Alloc(kPool, 7000, 7000, 0, v1::ALLOCATION_KIND_GRAPH)
      .Free(0x10);
  const v1::DeviceReport d = Compute(s).devices(0);
  EXPECT_EQ(d.peak_reserved_bytes(), 4096u + 7000u);
  EXPECT_EQ(d.current_reserved_bytes(), 7000u);
  EXPECT_EQ(d.peak_requested_bytes(), 1000u + 7000u);
  EXPECT_EQ(d.peak_bytes_by_kind().at("array"), 4096u);
  EXPECT_EQ(d.peak_bytes_by_kind().at("graph"), 7000u);
}

TEST(StatsEngineTest, FreesAreRoutedByAddressAndUnknownFreesIgnored) {
  EventStream s;
  s.Alloc(0x1, 100, 128, /*device=*/1).Free(0x1, /*device=*/0).Free(0x999);
  const v1::Report report = Compute(s);
  const v1::DeviceReport& d1 = Device(report, 1);
  EXPECT_EQ(d1.current_allocated_bytes(), 0u);
  EXPECT_EQ(d1.free_count(), 1u);
  EXPECT_EQ(Device(report, 0).free_count(), 1u);  // the unknown one, counted, no bytes
  EXPECT_EQ(Device(report, 0).current_allocated_bytes(), 0u);
}

TEST(StatsEngineTest, AReusedLiveAddressRetiresTheOldBlock) {
  EventStream s;
  s.Alloc(0x1, 100, 100).Alloc(0x1, 40, 40);  // the free between them was dropped
  const v1::DeviceReport d = Compute(s).devices(0);
  EXPECT_EQ(d.current_allocated_bytes(), 40u);
  EXPECT_EQ(d.peak_allocated_bytes(), 100u);
  EXPECT_EQ(d.free_count(), 0u);
}

TEST(StatsEngineTest, RingCountersCorrectPeaksAndCurrentsWhenRecordsWereDropped) {
  // The ring dropped the allocation that made the peak, and a free.
  EventStream s;
  s.Start().Alloc(0x1, 100, 128).Drop(2).Alloc(0x3, 10, 16);
  ProcessStatsEngine stats;
  for (const v1::Event& e : s.events()) stats.Add(e);
  v1::DeviceCounters counters;
  counters.set_device(0);
  counters.set_peak_requested_bytes(1100);
  counters.set_peak_allocated_bytes(1152);
  counters.set_peak_reserved_bytes(2048);
  counters.set_current_requested_bytes(110);
  counters.set_current_allocated_bytes(144);
  counters.set_current_reserved_bytes(2048);
  counters.set_records_dropped(2);
  stats.AddCounters(counters);
  const v1::DeviceReport d = stats.Report().devices(0);
  EXPECT_EQ(d.peak_requested_bytes(), 1100u);
  EXPECT_EQ(d.peak_allocated_bytes(), 1152u);
  EXPECT_EQ(d.peak_reserved_bytes(), 2048u);
  EXPECT_EQ(d.current_allocated_bytes(), 144u);
  EXPECT_EQ(d.dropped_records(), 2u);
}

TEST(StatsEngineTest, CountersNeverLowerAPeakSeenInEvents) {
  EventStream s;
  s.Alloc(0x1, 100, 128);
  ProcessStatsEngine stats;
  for (const v1::Event& e : s.events()) stats.Add(e);
  v1::DeviceCounters stale;  // a snapshot from before the allocation
  stale.set_device(0);
  stats.AddCounters(stale);
  const v1::DeviceReport d = stats.Report().devices(0);
  EXPECT_EQ(d.peak_allocated_bytes(), 128u);
  EXPECT_EQ(d.current_allocated_bytes(), 128u);  // no drops: events are complete
}

TEST(StatsEngineTest, NvtxRangesPeakGrowthAndInnermostAllocations) {
  // step { alloc 100; fwd { alloc 1000; free it; alloc 10 } ; free 100 }   (thread 1)
  EventStream s;
  s.Alloc(0x1, 50, 50)  // before any range: at push, allocated is 50
      .Push(1, "step")
      .Alloc(0x10, 100, 100)
      .Push(2, "fwd")
      .Alloc(0x20, 1000, 1000)
      .Free(0x20)
      .Alloc(0x30, 10, 10)
      .Pop(2)
      .Free(0x10)
      .Pop(1)
      .Push(3, "step")
      .Pop(3);
  const v1::DeviceReport d = Compute(s).devices(0);
  ASSERT_EQ(d.nvtx_ranges_size(), 2);
  // Equal peaks: ordered by name.
  const v1::NvtxRangeStats& fwd = d.nvtx_ranges(0);
  const v1::NvtxRangeStats& step = d.nvtx_ranges(1);
  EXPECT_EQ(step.name(), "step");
  EXPECT_EQ(step.count(), 2u);
  EXPECT_EQ(step.peak_allocated_bytes(), 50u + 100 + 1000);
  EXPECT_EQ(step.net_growth_bytes(), 10);  // +10 (0x30 leaked from fwd), then 0
  EXPECT_EQ(step.alloc_count(), 1u);       // 0x10 only; the others were inside fwd
  EXPECT_EQ(step.total_time_ns(), 8000u + 1000u);
  EXPECT_EQ(fwd.name(), "fwd");
  EXPECT_EQ(fwd.count(), 1u);
  EXPECT_EQ(fwd.peak_allocated_bytes(), 1150u);
  EXPECT_EQ(fwd.net_growth_bytes(), 10);
  EXPECT_EQ(fwd.alloc_count(), 2u);
}

TEST(StatsEngineTest, NvtxRangesOnTwoThreadsAndOneLeftOpen) {
  // Thread 1 opens A; thread 2 opens B and allocates the peak; A closes after B's allocation
  // is freed: A's peak must include what happened on thread 2 while it was open.
  EventStream s;
  s.Push(1, "A", 1)
      .Push(2, "B", 2)
      .Alloc(0x1, 700, 700, 0, v1::ALLOCATION_KIND_POOLED, 2)
      .Free(0x1, 0, 2)
      .Pop(2, 2)
      .Alloc(0x2, 5, 5, 0, v1::ALLOCATION_KIND_POOLED, 1)
      .Pop(1, 1)
      .Push(3, "open", 1)
      .Alloc(0x3, 60, 60, 0, v1::ALLOCATION_KIND_POOLED, 1);
  const v1::DeviceReport d = Compute(s).devices(0);
  ASSERT_EQ(d.nvtx_ranges_size(), 3);
  EXPECT_EQ(d.nvtx_ranges(0).name(), "A");
  EXPECT_EQ(d.nvtx_ranges(0).peak_allocated_bytes(), 700u);
  EXPECT_EQ(d.nvtx_ranges(0).alloc_count(), 1u);
  EXPECT_EQ(d.nvtx_ranges(1).name(), "B");
  EXPECT_EQ(d.nvtx_ranges(1).peak_allocated_bytes(), 700u);
  EXPECT_EQ(d.nvtx_ranges(1).alloc_count(), 1u);
  EXPECT_EQ(d.nvtx_ranges(2).name(), "open");  // closed at the last event for the report
  EXPECT_EQ(d.nvtx_ranges(2).peak_allocated_bytes(), 65u);
  EXPECT_EQ(d.nvtx_ranges(2).net_growth_bytes(), 60);
}

TEST(StatsEngineTest, PopOfAnUnknownRangeIsIgnored) {
  EventStream s;
  s.Alloc(0x1, 1, 1).Pop(42).Push(1, "x").Pop(7).Pop(1);
  const v1::DeviceReport d = Compute(s).devices(0);
  ASSERT_EQ(d.nvtx_ranges_size(), 1);
  EXPECT_EQ(d.nvtx_ranges(0).count(), 1u);
}

TEST(StatsEngineTest, LeaksAreTheLiveAllocationsAtExitLargestFirst) {
  EventStream s;
  s.Start()
      .Alloc(0x1, 10, 16, 0, v1::ALLOCATION_KIND_POOLED, 1, 7)
      .Alloc(0x2, 500, 512)
      .Alloc(0x3, 40, 48);
  s.Free(0x3);
  EXPECT_EQ(Compute(s).devices(0).leaks_size(), 0);  // still running: not leaks yet
  s.Exit(0);
  const v1::Report report = Compute(s);
  EXPECT_TRUE(report.finished());
  const v1::DeviceReport& d = report.devices(0);
  ASSERT_EQ(d.leaks_size(), 2);
  EXPECT_EQ(d.leaks(0).address(), 0x2u);
  EXPECT_EQ(d.leaks(0).requested_bytes(), 500u);
  EXPECT_EQ(d.leaks(1).address(), 0x1u);
  EXPECT_EQ(d.leaks(1).site(), 7u);
  StatsOptions one;
  one.max_leaks = 1;
  EXPECT_EQ(Compute(s, one).devices(0).leaks_size(), 1);
}

TEST(StatsEngineTest, FragmentationNowAndAtPeak) {
  EventStream s;
  s.Reserve(1000)
      .Alloc(0x1, 100, 100)
      .PoolState(/*free=*/900, /*largest=*/900, 0)
      .Reserve(1000)  // the peak: 2000 reserved
      .Alloc(0x2, 200, 200)
      .PoolState(/*free=*/1700, /*largest=*/850, /*unreleasable=*/800)
      .Release(1000)
      .PoolState(/*free=*/700, /*largest=*/700, 0);
  const v1::DeviceReport d = Compute(s).devices(0);
  EXPECT_DOUBLE_EQ(d.fragmentation().external_fragmentation(), 0.0);
  EXPECT_EQ(d.fragmentation().free_bytes(), 700u);
  EXPECT_EQ(d.fragmentation().largest_allocatable_bytes(), 700u);
  EXPECT_DOUBLE_EQ(d.fragmentation_at_peak().external_fragmentation(), 0.5);
  EXPECT_EQ(d.fragmentation_at_peak().unreleasable_free_bytes(), 800u);
  EXPECT_EQ(d.fragmentation_at_peak().largest_free_block_bytes(), 850u);
}

// The pool keeps its reservation to the end while allocations are freed: the snapshots taken
// then (every 256 frees, at exit) are not the pool at its peak, and must not replace the one
// written just after the allocation that made the peak.
TEST(StatsEngineTest, FragmentationAtPeakIsTakenAtThePeakNotWhileReservedStaysThere) {
  EventStream s;
  s.Reserve(1000)
      .Alloc(0x1, 600, 600)
      .PoolState(/*free=*/400, /*largest=*/400, 0)
      .Reserve(2000)  // the peak: 3000 reserved
      .Alloc(0x2, 1800, 1800)
      .PoolState(/*free=*/600, /*largest=*/400, /*unreleasable=*/200)  // at the peak
      .Free(0x1)
      .PoolState(/*free=*/1200, /*largest=*/600, /*unreleasable=*/1200)
      .Free(0x2)
      .PoolState(/*free=*/3000, /*largest=*/2000, /*unreleasable=*/0)
      .Exit();
  const v1::DeviceReport d = Compute(s).devices(0);
  EXPECT_EQ(d.current_reserved_bytes(), 3000u);
  EXPECT_EQ(d.peak_reserved_bytes(), 3000u);
  EXPECT_EQ(d.fragmentation().free_bytes(), 3000u);
  EXPECT_NEAR(d.fragmentation().external_fragmentation(), 1.0 / 3.0, 1e-12);
  EXPECT_EQ(d.fragmentation_at_peak().free_bytes(), 600u);
  EXPECT_EQ(d.fragmentation_at_peak().largest_free_block_bytes(), 400u);
  EXPECT_EQ(d.fragmentation_at_peak().unreleasable_free_bytes(), 200u);
  EXPECT_NEAR(d.fragmentation_at_peak().external_fragmentation(), 1.0 / 3.0, 1e-12);
  EXPECT_EQ(d.fragmentation_at_peak().rounding_waste_bytes(), 0u);
}

// Reserved leaves its peak before any snapshot: the state from before the reservation stays (the
// best there is), and a later state at a lower reservation is not "at the peak".
TEST(StatsEngineTest, FragmentationAtPeakWithoutASnapshotAtThePeak) {
  EventStream s;
  s.Reserve(1000)
      .Alloc(0x1, 500, 500)
      .PoolState(/*free=*/500, /*largest=*/250, 0)
      .Reserve(1000)
      .Release(1000)
      .PoolState(/*free=*/500, /*largest=*/500, 0)
      .Reserve(1000)  // back at the peak, not a new one
      .PoolState(/*free=*/1500, /*largest=*/1000, 0);
  const v1::DeviceReport d = Compute(s).devices(0);
  EXPECT_EQ(d.fragmentation_at_peak().free_bytes(), 500u);
  EXPECT_DOUBLE_EQ(d.fragmentation_at_peak().external_fragmentation(), 0.5);
}

TEST(StatsEngineTest, BlocksWaitingForTheirFenceAreNotFragmentation) {
  EventStream s;
  s.Reserve(1000).Alloc(0x1, 400, 400).Free(0x1);
  // Everything freed still waits for its fence: no usable free memory, nothing fragmented.
  s.PoolState(/*free=*/1000, /*largest=*/0, 0, 0, /*pending=*/1000);
  EXPECT_DOUBLE_EQ(Compute(s).devices(0).fragmentation().external_fragmentation(), 0.0);
  EXPECT_EQ(Compute(s).devices(0).fragmentation().free_bytes(), 1000u);
  EXPECT_EQ(Compute(s).devices(0).fragmentation().pending_fence_bytes(), 1000u);
  // 600 usable in two runs of 300 (400 pending): half of the usable memory is out of reach.
  s.PoolState(/*free=*/1000, /*largest=*/300, 0, 0, /*pending=*/400);
  EXPECT_DOUBLE_EQ(Compute(s).devices(0).fragmentation().external_fragmentation(), 0.5);
  EXPECT_EQ(Compute(s).devices(0).fragmentation().pending_fence_bytes(), 400u);
  // A state whose pending bytes exceed its free bytes (read at different moments) reports no
  // more pending than free.
  s.PoolState(/*free=*/300, /*largest=*/0, 0, 0, /*pending=*/400);
  EXPECT_EQ(Compute(s).devices(0).fragmentation().pending_fence_bytes(), 300u);
}

TEST(StatsEngineTest, OomVerdicts) {
  EventStream s;
  s.Oom(100, 500, 50)                                // enough free, no block: fragmentation
      .Oom(1000, 500, 50)                            // not enough free: capacity
      .Oom(10, 500, 500, v1::OOM_VERDICT_CAPACITY);  // the shim's verdict is kept
  const v1::DeviceReport d = Compute(s).devices(0);
  ASSERT_EQ(d.ooms_size(), 3);
  EXPECT_EQ(d.ooms(0).verdict(), v1::OOM_VERDICT_FRAGMENTATION);
  EXPECT_EQ(d.ooms(1).verdict(), v1::OOM_VERDICT_CAPACITY);
  EXPECT_EQ(d.ooms(2).verdict(), v1::OOM_VERDICT_CAPACITY);
  EXPECT_EQ(d.ooms(1).requested_bytes(), 1000u);
}

TEST(StatsEngineTest, TopSitesByPeakLiveBytes) {
  EventStream s;
  for (int i = 0; i < 5; ++i) s.Alloc(0x100 + i, 10, 10, 0, v1::ALLOCATION_KIND_POOLED, 1, 1);
  for (int i = 0; i < 5; ++i) s.Free(0x100 + i);
  s.Alloc(0x200, 30, 30, 0, v1::ALLOCATION_KIND_POOLED, 1, 2);
  StatsOptions options;
  options.max_top_sites = 1;
  const v1::DeviceReport d = Compute(s, options).devices(0);
  ASSERT_EQ(d.top_sites_size(), 1);
  EXPECT_EQ(d.top_sites(0).site(), 1u);
  EXPECT_EQ(d.top_sites(0).alloc_count(), 5u);
  EXPECT_EQ(d.top_sites(0).total_bytes(), 50u);
  EXPECT_EQ(d.top_sites(0).peak_live_bytes(), 50u);
}

// Calling libraries (DeviceReport.peak_requested_bytes_by_library). Frames as the drain names
// them, innermost first.
const std::vector<std::string> kTorchSite = {"/usr/local/cuda/lib64/libcudart.so.13+0x4a10",
                                             "/opt/torch/lib/libc10_cuda.so+0x2200",
                                             "/usr/bin/python3.12+0x30"};
const std::vector<std::string> kCublasSite = {"/usr/lib/x86_64-linux-gnu/libcuda.so.1+0x5",
                                              "/opt/nv/lib/libcublas.so.13+0x99f0",
                                              "/opt/torch/lib/libtorch_cuda.so+0x10"};
constexpr v1::AllocationKind kPooled = v1::ALLOCATION_KIND_POOLED;

TEST(StatsEngineTest, CallingLibrarySkipsRuntimeDriverAndShimFrames) {
  using V = std::vector<std::string>;
  EXPECT_EQ(CallingLibrary(kTorchSite), "libc10_cuda.so");
  EXPECT_EQ(CallingLibrary(kCublasSite), "libcublas.so.13");
  EXPECT_EQ(CallingLibrary(V{"/x/libvramscope.so+0x1", "/cuda/lib64/libcudart.so.13.0.48+0x2",
                             "/lib/libcuda.so.1+0x3", "/opt/app/libfoo.so+0x4"}),
            "libfoo.so");
  // A statically linked cudart: its frames are in the library (or program) that holds it,
  // which is the caller.
  EXPECT_EQ(CallingLibrary(V{"/opt/nv/lib/libcublas.so.13+0x123", "/app/main+0x10"}),
            "libcublas.so.13");
  EXPECT_EQ(CallingLibrary(V{"/app/train+0x500", "/lib/libc.so.6+0x29d90"}), "train");
  // Only "libcuda.so*" is the driver; other CUDA libraries are callers.
  EXPECT_EQ(CallingLibrary(V{"/lib/libcudnn_ops.so.9+0x1"}), "libcudnn_ops.so.9");
  EXPECT_EQ(CallingLibrary(V{"/lib/libcudadevrt.so+0x1"}), "libcudadevrt.so");
  // The last "+0x" separates the offset.
  EXPECT_EQ(CallingLibrary(V{"/odd+0xdir/libz.so+0x10"}), "libz.so");
  // No module, not the drain's form, every frame skipped, no frames: unknown.
  EXPECT_EQ(CallingLibrary(V{"/lib/libcudart.so.12+0x1", "0x7f0012345678", "/app/main+0x1"}),
            "(unknown)");
  EXPECT_EQ(CallingLibrary(V{"AllocateBlock (app.cc:12)", "/app/main+0x1"}), "(unknown)");
  EXPECT_EQ(CallingLibrary(V{"/lib/libz.so+0xzz"}), "(unknown)");
  EXPECT_EQ(CallingLibrary(V{"/lib/libcuda.so.1+0x1", "/x/libvramscope.so+0x2"}), "(unknown)");
  EXPECT_EQ(CallingLibrary(V{}), "(unknown)");
}

TEST(StatsEngineTest, PeakRequestedPerCallingLibraryIsExactPerLibrary) {
  EventStream s;
  s.Start()
      .Site(1, kTorchSite)
      .Site(2, kCublasSite)
      .Alloc(0x1, 70, 512)  // no site
      .Alloc(0x10, 100, 512, 0, kPooled, 1, 1)
      .Alloc(0x20, 50, 512, 0, kPooled, 2, 2)
      .Alloc(0x30, 200, 512, 0, kPooled, 1, 1)                       // c10 300 (its peak)
      .Alloc(0x99, 10000, 10240, 0, v1::ALLOCATION_KIND_HOST, 1, 1)  // counts no device bytes
      .Free(0x10)
      .Alloc(0x40, 400, 512, 0, kPooled, 2, 2)  // cublas 450
      .Free(0x30)
      .Free(0x20)
      .Alloc(0x50, 250, 512, 0, kPooled, 1, 1)
      .Alloc(0x60, 100, 512, 0, kPooled, 2, 2)  // cublas 500; total 70 + 250 + 500 (its peak)
      .Free(0x40)
      .Alloc(0x70, 1000, 1024, 1, kPooled, 1, 1)  // device 1: only c10
      .Free(0x1)
      .Free(0x99);
  const v1::Report report = Compute(s);
  const v1::DeviceReport& d = Device(report, 0);
  EXPECT_EQ(d.peak_requested_bytes(), 820u);
  EXPECT_EQ(d.peak_requested_bytes_by_library_size(), 2) << d.DebugString();
  EXPECT_EQ(d.peak_requested_bytes_by_library().at("libc10_cuda.so"), 300u);
  EXPECT_EQ(d.peak_requested_bytes_by_library().at("libcublas.so.13"), 500u);
  EXPECT_EQ(d.unattributed_peak_requested_bytes(), 70u);
  const v1::DeviceReport& d1 = Device(report, 1);
  EXPECT_EQ(d1.peak_requested_bytes_by_library_size(), 1) << d1.DebugString();
  EXPECT_EQ(d1.peak_requested_bytes_by_library().at("libc10_cuda.so"), 1000u);
  EXPECT_EQ(d1.unattributed_peak_requested_bytes(), 0u);
}

// DeviceReport.allocations: the state at the peak of allocated bytes and the largest others.
TEST(StatsEngineTest, AllocationsLiveAtThePeakAndTheLargestOthers) {
  EventStream s;
  s.Site(7, kTorchSite)
      .Push(1, "fwd")
      .Alloc(0x1, 100, 128, 0, kPooled, 1, 7)  // live at the peak, freed after it
      .Alloc(0x2, 300, 320)                    // freed before the peak
      .Free(0x2)
      .Alloc(0x3, 50, 64)    // live at the peak and at the end
      .Alloc(0x4, 400, 416)  // the peak: 128 + 64 + 416 allocated
      .Pop(1)
      .Free(0x1)
      .Free(0x4)
      .Alloc(0x5, 10, 16)                                // after the peak
      .Alloc(0x6, 20, 20, 0, v1::ALLOCATION_KIND_HOST);  // no device bytes: not listed
  const std::uint64_t peak_time = s.events()[6].time_ns();
  const v1::DeviceReport d = Compute(s).devices(0);
  EXPECT_EQ(d.peak_allocated_bytes(), 128u + 64 + 416);
  EXPECT_EQ(d.peak_time_ns(), peak_time);
  EXPECT_EQ(d.peak_live_count(), 3u);
  EXPECT_EQ(d.peak_live_omitted(), 0u);
  EXPECT_EQ(d.allocations_omitted(), 0u);
  ASSERT_EQ(d.allocations_size(), 5);
  const std::uint64_t address[] = {0x1, 0x2, 0x3, 0x4, 0x5};  // in order of allocation
  const bool at_peak[] = {true, false, true, true, false};
  const bool freed[] = {true, true, false, true, false};
  for (int i = 0; i < 5; ++i) {
    const v1::AllocationRecord& a = d.allocations(i);
    EXPECT_EQ(a.address(), address[i]) << i;
    EXPECT_EQ(a.live_at_peak(), at_peak[i]) << i;
    EXPECT_EQ(a.free_time_ns() != 0, freed[i]) << i;
    EXPECT_EQ(a.nvtx_name(), i < 4 ? "fwd" : "") << i;
    EXPECT_EQ(a.kind(), kPooled);
    EXPECT_EQ(a.thread_id(), 1u);
  }
  const v1::AllocationRecord& first = d.allocations(0);
  EXPECT_EQ(first.requested_bytes(), 100u);
  EXPECT_EQ(first.allocated_bytes(), 128u);
  EXPECT_EQ(first.site(), 7u);
  EXPECT_EQ(first.alloc_time_ns(), s.events()[2].time_ns());
  EXPECT_EQ(first.free_time_ns(), s.events()[8].time_ns());
  ASSERT_EQ(d.allocation_sites_size(), 1);
  EXPECT_EQ(d.allocation_sites(0).site(), 7u);
  EXPECT_EQ(d.allocation_sites(0).library(), "libc10_cuda.so");
  ASSERT_EQ(d.allocation_sites(0).frames_size(), 3);
  EXPECT_EQ(d.allocation_sites(0).frames(1), kTorchSite[1]);

  // Bounded: the two largest live at the peak, the largest other; the rest counted.
  StatsOptions small;
  small.max_peak_allocations = 2;
  small.max_allocations = 1;
  const v1::DeviceReport b = Compute(s, small).devices(0);
  EXPECT_EQ(b.peak_live_count(), 3u);
  EXPECT_EQ(b.peak_live_omitted(), 1u);
  EXPECT_EQ(b.peak_live_omitted_bytes(), 50u);
  ASSERT_EQ(b.allocations_size(), 3);
  EXPECT_EQ(b.allocations(0).address(), 0x1u);
  EXPECT_EQ(b.allocations(1).address(), 0x2u);
  EXPECT_EQ(b.allocations(2).address(), 0x4u);
  EXPECT_EQ(b.allocations_omitted(), 2u);
}

TEST(StatsEngineTest, LiveReportsLeaveTheAllocationsOut) {
  EventStream s;
  s.Alloc(0x1, 100, 100).Alloc(0x2, 50, 50).Free(0x1);
  ProcessStatsEngine stats;
  for (const v1::Event& e : s.events()) stats.Add(e);
  EXPECT_EQ(stats.Report().devices(0).allocations_size(), 2);
  const v1::DeviceReport live = stats.Report(ReportAllocations::kLeaveOut).devices(0);
  EXPECT_EQ(live.allocations_size(), 0);
  EXPECT_EQ(live.peak_live_count(), 0u);
  EXPECT_EQ(live.peak_allocated_bytes(), 150u);
}

TEST(StatsEngineTest, FiguresOnlyReportsLeaveTheListsOutAndKeepTheFigures) {
  // What a Watch update shows: every figure of the full report, none of its lists (the timeline's
  // points were most of the cost of building an update for every process on every tick).
  EventStream s;
  s.Start().Site(1, kTorchSite).Alloc(0x1, 100, 100, 0, kPooled, 1, 1).Alloc(0x2, 50, 50);
  s.Free(0x1).Reserve(4096).Exit(0);  // finished with 0x2 live: a leak in the full report
  ProcessStatsEngine stats;
  for (const v1::Event& e : s.events()) stats.Add(e);
  const v1::Report full = stats.Report();
  ASSERT_GT(full.devices(0).timeline_size(), 0);
  ASSERT_GT(full.devices(0).top_sites_size(), 0);
  ASSERT_GT(full.devices(0).leaks_size(), 0);
  v1::Report figures = stats.Report(ReportAllocations::kFiguresOnly);
  const v1::DeviceReport& d = figures.devices(0);
  EXPECT_EQ(d.timeline_size(), 0);
  EXPECT_EQ(d.top_sites_size(), 0);
  EXPECT_EQ(d.leaks_size(), 0);
  EXPECT_EQ(d.allocations_size(), 0);
  EXPECT_EQ(d.allocation_sites_size(), 0);
  // Everything else as in the full report without its lists.
  v1::Report expected = stats.Report(ReportAllocations::kLeaveOut);
  for (v1::DeviceReport& device : *expected.mutable_devices()) {
    device.clear_timeline();
    device.clear_top_sites();
    device.clear_leaks();
    device.clear_allocation_sites();
  }
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(figures, expected));
}

TEST(StatsEngineTest, ANewPeakReplacesTheStateAtTheOldOne) {
  EventStream s;
  s.Alloc(0x1, 100, 100).Alloc(0x2, 50, 50);  // peak 150
  s.Free(0x1).Free(0x2);                      // both were live at it
  s.Alloc(0x3, 200, 200);                     // new peak: only 0x3
  const v1::DeviceReport d = Compute(s).devices(0);
  EXPECT_EQ(d.peak_live_count(), 1u);
  ASSERT_EQ(d.allocations_size(), 3);
  EXPECT_FALSE(d.allocations(0).live_at_peak());
  EXPECT_FALSE(d.allocations(1).live_at_peak());
  EXPECT_TRUE(d.allocations(2).live_at_peak());
  EXPECT_EQ(d.peak_time_ns(), s.events()[4].time_ns());
}

TEST(StatsEngineTest, OnlyTheLargestFreedAllocationsAreKept) {
  EventStream s;
  for (int i = 1; i <= 100; ++i) s.Alloc(0x1000 + i, i, i).Free(0x1000 + i);
  StatsOptions options;
  options.max_allocations = 10;
  const v1::DeviceReport d = Compute(s, options).devices(0);
  EXPECT_EQ(d.peak_live_count(), 1u);  // the last, largest one
  ASSERT_EQ(d.allocations_size(), 11);
  for (int i = 0; i < 11; ++i) EXPECT_EQ(d.allocations(i).requested_bytes(), 90u + i) << i;
  EXPECT_TRUE(d.allocations(10).live_at_peak());
  EXPECT_EQ(d.allocations_omitted(), 89u);
}

TEST(StatsEngineTest, SizesThatWouldWrapSaturateAndAreCounted) {
  // A hostile or corrupt ring can claim any size: sums are held at 2^64-1 (not wrapped to
  // small numbers) and every event that had to be held is counted.
  constexpr std::uint64_t kMax = UINT64_MAX;
  EventStream s;
  s.Start()
      .Site(1, kTorchSite)
      .Push(7, "step")
      .Alloc(0x10, kMax, kMax, 0, kPooled, 1, 1)  // fits exactly: not saturated
      .Alloc(0x20, 2, 2, 0, kPooled, 1, 1)        // 1: requested, allocated, site, library
      .Alloc(0x30, kMax, kMax, 0, v1::ALLOCATION_KIND_STREAM_ORDERED)  // 2
      .Reserve(kMax)                                                   // 3: reserved
      .Pop(7)
      .Drop(kMax)
      .Drop(5);  // 4: dropped records
  const v1::Report report = Compute(s);
  EXPECT_EQ(report.saturated_events(), 4u);
  const v1::DeviceReport& d = Device(report, 0);
  EXPECT_EQ(d.current_requested_bytes(), kMax);
  EXPECT_EQ(d.peak_requested_bytes(), kMax);
  EXPECT_EQ(d.current_allocated_bytes(), kMax);
  EXPECT_EQ(d.peak_allocated_bytes(), kMax);
  EXPECT_EQ(d.current_reserved_bytes(), kMax);
  EXPECT_EQ(d.peak_reserved_bytes(), kMax);
  EXPECT_EQ(d.peak_bytes_by_kind().at("pooled"), kMax);
  EXPECT_EQ(d.peak_requested_bytes_by_library().at("libc10_cuda.so"), kMax);
  ASSERT_EQ(d.top_sites_size(), 1);
  EXPECT_EQ(d.top_sites(0).total_bytes(), kMax);
  EXPECT_EQ(d.top_sites(0).peak_live_bytes(), kMax);
  EXPECT_EQ(d.dropped_records(), kMax);
  ASSERT_GT(d.timeline_size(), 0);
  EXPECT_EQ(d.timeline(d.timeline_size() - 1).requested_bytes(), kMax);
  EXPECT_EQ(d.timeline(d.timeline_size() - 1).reserved_bytes(), kMax);
  ASSERT_EQ(d.nvtx_ranges_size(), 1);
  EXPECT_EQ(d.nvtx_ranges(0).net_growth_bytes(), INT64_MAX);
  EXPECT_EQ(d.nvtx_ranges(0).peak_allocated_bytes(), kMax);

  // Ordinary sizes saturate nothing.
  EventStream fine;
  fine.Start().Alloc(0x10, 100, 128).Free(0x10);
  EXPECT_EQ(Compute(fine).saturated_events(), 0u);
}

TEST(StatsEngineTest, NoSitesNoLibraries) {
  EventStream s;
  s.Start().Alloc(0x10, 100, 512).Free(0x10);
  const v1::DeviceReport d = Compute(s).devices(0);
  EXPECT_EQ(d.peak_requested_bytes_by_library_size(), 0);
  EXPECT_EQ(d.unattributed_peak_requested_bytes(), 0u);
}

TEST(StatsEngineTest, SiteDefinedAfterItsAllocationsMovesTheirLiveBytes) {
  // Another thread's allocations overtook the definition: counted as unresolved until it
  // arrives, then the site's live bytes move to its library; the unresolved peak stays.
  EventStream s;
  s.Start()
      .Alloc(0x10, 300, 512, 0, kPooled, 1, 5)
      .Alloc(0x20, 200, 512, 0, kPooled, 2, 5)  // unresolved 500 (its peak)
      .Alloc(0x80, 40, 512, 0, kPooled, 2, 8)   // site 8: defined only after its free
      .Alloc(0x90, 64, 512, 1, kPooled, 2, 5)   // the same site on device 1
      .Free(0x10)                               // unresolved 240 on device 0
      .Free(0x80)                               // unresolved 200
      .Site(5, {"/lib/libcudart.so.13+0x1", "/opt/lib/libfoo.so+0x2"})  // moves 200 (and 64)
      .Site(5, {"/lib/libcudart.so.13+0x1", "/opt/lib/libfoo.so+0x2"})  // again: no change
      .Site(8, {"/opt/lib/libbar.so+0x3"})
      .Alloc(0x30, 100, 512, 0, kPooled, 1, 5)  // libfoo 300
      .Free(0x20)
      .Free(0x30)
      .Alloc(0x40, 10, 512, 0, kPooled, 1, 5)
      .Free(0x90);
  const v1::Report report = Compute(s);
  const v1::DeviceReport& d = Device(report, 0);
  EXPECT_EQ(d.peak_requested_bytes(), 540u);
  EXPECT_EQ(d.peak_requested_bytes_by_library_size(), 2) << d.DebugString();
  EXPECT_EQ(d.peak_requested_bytes_by_library().at("libfoo.so"), 300u);
  EXPECT_EQ(d.peak_requested_bytes_by_library().at("(unresolved)"), 540u);
  // libbar.so's bytes were all freed before its definition: it held none once resolved.
  EXPECT_EQ(d.peak_requested_bytes_by_library().count("libbar.so"), 0u);
  const v1::DeviceReport& d1 = Device(report, 1);
  EXPECT_EQ(d1.peak_requested_bytes_by_library().at("libfoo.so"), 64u) << d1.DebugString();
  EXPECT_EQ(d1.peak_requested_bytes_by_library().at("(unresolved)"), 64u);

  // Freed after the move: the bytes leave libfoo, not the unresolved count.
  EventStream t;
  t.Start()
      .Alloc(0x10, 300, 512, 0, kPooled, 1, 5)
      .Site(5, {"/opt/lib/libfoo.so+0x2"})      // libfoo 300
      .Alloc(0x20, 250, 512, 0, kPooled, 1, 6)  // unresolved 250
      .Free(0x10)                               // libfoo 0
      .Alloc(0x30, 100, 512, 0, kPooled, 1, 6)  // unresolved 350
      .Alloc(0x40, 20, 512, 0, kPooled, 1, 5);  // libfoo 20
  const v1::DeviceReport e = Compute(t).devices(0);
  EXPECT_EQ(e.peak_requested_bytes_by_library().at("libfoo.so"), 300u);
  EXPECT_EQ(e.peak_requested_bytes_by_library().at("(unresolved)"), 350u);
}

TEST(StatsEngineTest, SitesNeverDefinedAndUnknownFramesAreKept) {
  EventStream s;
  s.Start()
      .Site(3, {"0x7f0000001000", "/app/main+0x10"})
      .Site(4, {"/lib/libcuda.so.1+0x1"})
      .Alloc(0x10, 64, 512, 0, kPooled, 1, 9)  // site 9 never defined
      .Free(0x10)
      .Free(0x777)  // an address never allocated: ignored
      .Alloc(0x20, 32, 512, 0, kPooled, 1, 9)
      .Alloc(0x30, 16, 512, 0, kPooled, 1, 3)
      .Alloc(0x40, 8, 512, 0, kPooled, 1, 4)
      .Free(0x20)
      .Free(0x30)
      .Free(0x40);
  const v1::DeviceReport d = Compute(s).devices(0);
  EXPECT_EQ(d.peak_requested_bytes_by_library_size(), 2) << d.DebugString();
  EXPECT_EQ(d.peak_requested_bytes_by_library().at("(unresolved)"), 64u);
  EXPECT_EQ(d.peak_requested_bytes_by_library().at("(unknown)"), 24u);
  EXPECT_EQ(d.peak_requested_bytes(), 64u);
  EXPECT_EQ(d.current_requested_bytes(), 0u);
}

TEST(StatsEngineTest, TimelineIsBoundedAndKeepsTheMaximum) {
  EventStream s;
  for (int i = 0; i < 50000; ++i) {
    const std::uint64_t size = i == 31337 ? 1000000 : 100 + i % 7;
    s.Alloc(0x1000 + i, size, size).Free(0x1000 + i);
  }
  StatsOptions options;
  options.max_timeline_points = 500;
  const v1::DeviceReport d = Compute(s, options).devices(0);
  ASSERT_GT(d.timeline_size(), 100);
  EXPECT_LE(d.timeline_size(), 500);
  std::uint64_t highest = 0;
  std::uint64_t previous_time = 0;
  for (const v1::TimelinePoint& p : d.timeline()) {
    highest = std::max(highest, p.allocated_bytes());
    EXPECT_GE(p.time_ns(), previous_time);
    previous_time = p.time_ns();
  }
  EXPECT_EQ(highest, 1000000u);
  EXPECT_EQ(highest, d.peak_allocated_bytes());
}

// Timeline's points against the rule it implements, computed the plain way (every sample's
// bucket by division): the same points for times in and out of order, sparse and dense, and
// near the end of the clock's range.
class ReferenceTimeline {
 public:
  explicit ReferenceTimeline(std::size_t max_points) : max_(max_points) {}
  void Add(std::uint64_t t, std::uint64_t r, std::uint64_t a, std::uint64_t v) {
    if (points_.empty()) {
      origin_ = t;
      points_.push_back({t, r, a, v});
      return;
    }
    t = std::max(t, points_.back()[0]);
    if ((t - origin_) / width_ == (points_.back()[0] - origin_) / width_) {
      auto& p = points_.back();
      p = {p[0], std::max(p[1], r), std::max(p[2], a), std::max(p[3], v)};
      return;
    }
    points_.push_back({t, r, a, v});
    while (points_.size() > max_) {
      width_ *= 2;
      std::vector<std::array<std::uint64_t, 4>> merged;
      for (const auto& p : points_) {
        if (!merged.empty() && (p[0] - origin_) / width_ == (merged.back()[0] - origin_) / width_) {
          auto& q = merged.back();
          q = {q[0], std::max(q[1], p[1]), std::max(q[2], p[2]), std::max(q[3], p[3])};
        } else {
          merged.push_back(p);
        }
      }
      points_ = merged;
    }
  }
  std::vector<std::array<std::uint64_t, 4>> points_;

 private:
  std::size_t max_;
  std::uint64_t origin_ = 0;
  std::uint64_t width_ = 1000;
};

TEST(TimelineTest, PointsAreThoseOfTheBucketRule) {
  std::mt19937_64 random(7);
  for (int round = 0; round < 200; ++round) {
    const std::size_t max_points = 2 + random() % 20;
    Timeline timeline(max_points);
    ReferenceTimeline reference(max_points);
    std::uint64_t t = round % 3 == 0 ? UINT64_MAX - (std::uint64_t{1} << 40) : random() % 100000;
    for (int i = 0; i < 3000; ++i) {
      // Every other round only whole numbers of bucket widths (1000 ns doubled) from the
      // origin: samples land on bucket edges.
      const std::uint64_t kind = round % 2 == 1 ? 2 : random() % 4;
      const std::uint64_t step = kind == 0 ? random() % (std::uint64_t{1} << (random() % 40))
                                 : kind == 1
                                     ? random() % 1500
                                     : (random() % 3) * (std::uint64_t{1000} << (random() % 6));
      t = t > UINT64_MAX - step ? UINT64_MAX : t + step;
      const std::uint64_t at =
          round % 2 == 0 && random() % 10 == 0 ? t - std::min(t, random() % 5000) : t;
      const std::uint64_t r = random() % 1000, a = random() % 1000, v = random() % 1000;
      timeline.Add(at, r, a, v);
      reference.Add(at, r, a, v);
    }
    google::protobuf::RepeatedPtrField<v1::TimelinePoint> points;
    timeline.AppendTo(&points);
    ASSERT_EQ(static_cast<std::size_t>(points.size()), reference.points_.size()) << round;
    for (int i = 0; i < points.size(); ++i) {
      const auto& want = reference.points_[static_cast<std::size_t>(i)];
      ASSERT_EQ(points[i].time_ns(), want[0]) << round << " " << i;
      ASSERT_EQ(points[i].requested_bytes(), want[1]);
      ASSERT_EQ(points[i].allocated_bytes(), want[2]);
      ASSERT_EQ(points[i].reserved_bytes(), want[3]);
    }
  }
}

TEST(StatsEngineTest, EngineKeysProcessesAndUsesBatchCounters) {
  StatsEngine engine;
  v1::EventBatch batch;
  batch.mutable_process()->set_host("h");
  batch.mutable_process()->set_pid(5);
  batch.mutable_process()->set_start_time_ns(1000);
  v1::Event* e = batch.add_events();
  e->set_time_ns(10);
  e->mutable_alloc()->set_address(1);
  e->mutable_alloc()->set_requested_bytes(8);
  e->mutable_alloc()->set_allocated_bytes(8);
  e->mutable_alloc()->set_kind(v1::ALLOCATION_KIND_POOLED);
  v1::DeviceCounters* c = batch.add_counters();
  c->set_device(0);
  c->set_peak_reserved_bytes(4096);
  engine.AddBatch(batch);
  batch.mutable_process()->set_pid(6);
  engine.AddBatch(batch);
  engine.AddBatch(batch);
  ASSERT_EQ(engine.size(), 2u);
  const std::vector<v1::Report> reports = engine.Reports();
  EXPECT_EQ(reports[0].process().pid(), 5u);
  EXPECT_EQ(reports[0].process().host(), "h");
  EXPECT_EQ(reports[0].devices(0).peak_reserved_bytes(), 4096u);
  EXPECT_EQ(reports[1].events(), 2u);
}

}  // namespace
}  // namespace vramscope::collector
