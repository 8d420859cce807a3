// Stats engine throughput (goal: >= 2M events/s). Run:
//   meson test -C build --benchmark --suite bench stats_bench   (or the executable directly)
#include <benchmark/benchmark.h>

#include <string>

#include "event_builder.h"
#include "stats/stats_engine.h"

namespace vramscope::collector {
namespace {

// A training-loop-like mix: 64 live blocks churned, NVTX ranges open, periodic pool states.
std::vector<v1::Event> Workload(std::size_t n) {
  testing::EventStream s;
  s.Start().Reserve(1ull << 30).Push(1, "train");
  // Sites 1-16 named like the drain names them: a runtime frame, then one of four libraries.
  for (std::uint64_t site = 1; site <= 16; ++site) {
    s.Site(site, {"/usr/lib/libcudart.so.13+0x4a10",
                  "/opt/lib/libcaller" + std::to_string(site % 4) + ".so+0x" + std::to_string(site),
                  "/usr/bin/python3.12+0x1000"});
  }
  std::uint32_t range = 2;
  for (std::size_t i = 0; s.events().size() < n; ++i) {
    if (i % 64 == 0) s.Push(range, "step");
    s.Alloc(0x100000 + (i % 4096) * 4096, 1000 + i % 512, 1024 + i % 512, 0,
            v1::ALLOCATION_KIND_POOLED, 1, 1 + i % 16);
    if (i >= 64) s.Free(0x100000 + ((i - 64) % 4096) * 4096);
    if (i % 64 == 63) s.Pop(range++);
    if (i % 1000 == 0) s.PoolState(1 << 20, 1 << 19, 1 << 18);
  }
  return s.events();
}

void BM_Ingest(benchmark::State& state) {
  const std::vector<v1::Event> events = Workload(1 << 20);
  for (auto _ : state) {
    ProcessStatsEngine stats;
    for (const v1::Event& e : events) stats.Add(e);
    benchmark::DoNotOptimize(stats.events());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(events.size()));
}
BENCHMARK(BM_Ingest)->Unit(benchmark::kMillisecond);

void BM_Report(benchmark::State& state) {
  const std::vector<v1::Event> events = Workload(1 << 20);
  ProcessStatsEngine stats;
  for (const v1::Event& e : events) stats.Add(e);
  for (auto _ : state) benchmark::DoNotOptimize(stats.Report());
}
BENCHMARK(BM_Report)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace vramscope::collector

BENCHMARK_MAIN();
