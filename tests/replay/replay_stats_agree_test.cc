// `vramscope replay` and the stats engine of `vramscope run` agree on fragmentation at peak. Each
// bundled trace goes through the pool over a VirtualUpstream (as the replay does), and the events
// the shim would write for it go to the stats engine in the shim's order: a reservation before
// the allocation that needed it, a pool snapshot after it (and after every release and every 256
// frees, as interposer/shim/device_pools.cc writes them). Both must name the same moment (the
// last time reserved bytes reached a new high) and so the same figure, although the pool keeps
// its reservation while the trace frees its allocations.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "replay/replay.h"
#include "replay/trace_loader.h"
#include "stats/stats_engine.h"
#include "trace_test_util.h"
#include "vramscope/pool/pool.h"
#include "vramscope/pool/virtual_upstream.h"

namespace vramscope::cli {
namespace {

class CompletedFences final : public pool::FenceTracker {
 public:
  bool IsComplete(std::uint64_t /*fence*/) override { return true; }
  void Wait(std::uint64_t /*fence*/) override {}
};

// Feeds the engine what the shim's ring would hold for `trace` replayed through the default pool.
v1::DeviceReport EngineReport(const LoadedTrace& trace) {
  // As the replay's: whole pieces of the shim's default size (ReplayOptions::map_piece_bytes).
  pool::VirtualUpstream upstream(pool::VirtualUpstreamOptions{
      .allow_partial_unmap = false, .map_piece_bytes = pool::kDefaultMapPieceBytes});
  CompletedFences fences;
  std::unique_ptr<pool::Pool> p = pool::MakePool(&upstream, &fences, pool::PoolOptions{});
  collector::ProcessStatsEngine engine;
  std::uint64_t time = 1000;
  auto event = [&]() {
    v1::Event e;
    e.set_time_ns(time += 1000);
    e.set_thread_id(1);
    return e;
  };
  v1::Event start = event();
  start.mutable_process_start()->set_pid(1);
  engine.Add(start);
  std::uint64_t physical = 0;
  // A reservation or release between two calls, as the upstream's ring records write it.
  auto follow_upstream = [&]() {
    const std::uint64_t now = upstream.Counters().current_physical_bytes;
    if (now == physical) return false;
    v1::Event e = event();
    if (now > physical) {
      e.mutable_pool_reserve()->set_bytes(now - physical);
    } else {
      e.mutable_pool_release()->set_bytes(physical - now);
    }
    physical = now;
    engine.Add(e);
    return true;
  };
  auto state = [&]() {
    const pool::PoolStats stats = p->Stats();
    v1::Event e = event();
    v1::PoolStateEvent* s = e.mutable_pool_state();
    s->set_free_bytes(stats.free_bytes);
    s->set_largest_free_block_bytes(stats.largest_free_block_bytes);
    s->set_pending_bytes(stats.pending_bytes);
    s->set_unreleasable_free_bytes(stats.unreleasable_free_bytes);
    s->set_reserved_bytes(stats.current_reserved_bytes);
    engine.Add(e);
  };
  std::vector<std::uintptr_t> addresses(trace.alloc_events, 0);
  int frees = 0;
  for (const ReplayOp& op : trace.ops) {
    pool::BlockSizes sizes;
    if (op.is_free) {
      if (addresses[op.slot] == 0) continue;
      EXPECT_EQ(p->FreeSized(addresses[op.slot], 0, &sizes), pool::PoolStatus::kOk);
      const bool released = follow_upstream();
      v1::Event e = event();
      e.mutable_free()->set_address(addresses[op.slot]);
      engine.Add(e);
      addresses[op.slot] = 0;
      if (released || ++frees >= 256) {
        frees = 0;
        state();
      }
      continue;
    }
    if (p->AllocateSized(op.size, &addresses[op.slot], &sizes) != pool::PoolStatus::kOk) {
      addresses[op.slot] = 0;
      continue;
    }
    const bool reserved = follow_upstream();
    v1::Event e = event();
    v1::AllocEvent* a = e.mutable_alloc();
    a->set_address(addresses[op.slot]);
    a->set_requested_bytes(sizes.requested);
    a->set_allocated_bytes(sizes.allocated);
    a->set_kind(v1::ALLOCATION_KIND_POOLED);
    engine.Add(e);
    if (reserved) state();
  }
  state();  // at exit, the pool still holding what it holds
  v1::Event exit = event();
  exit.mutable_process_exit()->set_exit_code(0);
  engine.Add(exit);
  const v1::Report report = engine.Report();
  EXPECT_EQ(report.devices_size(), 1);
  return report.devices_size() == 1 ? report.devices(0) : v1::DeviceReport();
}

class ReplayStatsAgreeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReplayStatsAgreeTest, FragmentationAtPeakIsTheSameMoment) {
  const absl::StatusOr<LoadedTrace> trace =
      LoadTraceFile(testing::TracesDir() + "/" + GetParam() + ".csv.gz");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const absl::StatusOr<ReplayResult> replay = ReplayTrace(*trace, "");
  ASSERT_TRUE(replay.ok()) << replay.status();
  const v1::DeviceReport d = EngineReport(*trace);
  EXPECT_EQ(d.peak_reserved_bytes(), replay->upstream_peak_physical_bytes);
  EXPECT_EQ(d.peak_allocated_bytes(), replay->stats.peak_allocated_bytes);
  EXPECT_EQ(d.fragmentation_at_peak().free_bytes(), replay->free_bytes_at_peak);
  EXPECT_EQ(d.fragmentation_at_peak().largest_free_block_bytes(),
            replay->largest_free_block_at_peak);
  EXPECT_DOUBLE_EQ(d.fragmentation_at_peak().external_fragmentation(),
                   replay->fragmentation_at_peak);
  // The state at exit is another moment, which the figure at peak must not be.
  RecordProperty("fragmentation_at_peak", std::to_string(replay->fragmentation_at_peak));
  RecordProperty("fragmentation_at_exit",
                 std::to_string(d.fragmentation().external_fragmentation()));
}

INSTANTIATE_TEST_SUITE_P(BundledTraces, ReplayStatsAgreeTest,
                         ::testing::Values("gpt2_train", "resnet50_train", "mlp_dynamic_train"));

}  // namespace
}  // namespace vramscope::cli
