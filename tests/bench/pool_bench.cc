// Google Benchmark of the pool's hot path (VirtualUpstream, statistics always on).
//
//   meson test -C build-pool --benchmark --suite bench   (or run build-pool/tests/bench/pool_bench)
//
// BM_AllocFreePair is the goal figure: one cached Allocate + Free(fence 0), < 100 ns per pair.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "pool_test_support.h"
#include "vramscope/pool/pool.h"
#include "vramscope/pool/virtual_upstream.h"

namespace vramscope::pool {
namespace {

class NoFences final : public FenceTracker {
 public:
  bool IsComplete(std::uint64_t /*fence*/) override { return true; }
  void Wait(std::uint64_t /*fence*/) override {}
};

struct Fixture {
  explicit Fixture(const char* policy) {
    PoolOptions options;
    options.policy = policy;
    pool = MakePool(&upstream, &fences, options);
  }
  VirtualUpstream upstream;
  NoFences fences;
  std::unique_ptr<Pool> pool;
};

const char* PolicyArg(const benchmark::State& state) {
  return state.range(0) == 0 ? "vmm" : "segments";
}

// One cached pair: the block freed is the block the next Allocate gets back.
void BM_AllocFreePair(benchmark::State& state) {
  Fixture f(PolicyArg(state));
  const auto size = static_cast<std::size_t>(state.range(1));
  std::uintptr_t address = 0;
  // Warm: the memory is held, and some live neighbours make the index non-trivial.
  std::vector<std::uintptr_t> keep(64);
  for (auto& a : keep) (void)f.pool->Allocate(size, &a);
  for (auto _ : state) {
    if (f.pool->Allocate(size, &address) != PoolStatus::kOk) state.SkipWithError("allocate");
    if (f.pool->Free(address, 0) != PoolStatus::kOk) state.SkipWithError("free");
    benchmark::DoNotOptimize(address);
  }
  state.SetLabel(PolicyArg(state));
  state.counters["upstream_calls"] = static_cast<double>(f.pool->Stats().upstream_grow_calls +
                                                         f.pool->Stats().upstream_shrink_calls);
}
BENCHMARK(BM_AllocFreePair)
    ->ArgsProduct({{0, 1}, {256, 64 << 10, 8 << 20}})
    ->ArgNames({"policy", "size"});

// The shim's hot path: each free waits for a device-wide fence (the current epoch), and a
// synchronisation completes the epochs every `batch` pairs, as the shim's helper thread does. The
// block freed is reusable only after that, so the pool cycles through `batch` blocks of the size.
void BM_FencedPair(benchmark::State& state) {
  VirtualUpstream upstream;
  testing::ShimEpochs fences;
  PoolOptions options;
  options.policy = PolicyArg(state);
  std::unique_ptr<Pool> pool = MakePool(&upstream, &fences, options);
  const auto size = static_cast<std::size_t>(state.range(1));
  constexpr int kBatch = 128;
  std::vector<std::uintptr_t> keep(64);
  for (auto& a : keep) (void)pool->Allocate(size, &a);
  int since_sync = 0;
  std::uintptr_t address = 0;
  for (auto _ : state) {
    if (pool->Allocate(size, &address) != PoolStatus::kOk) state.SkipWithError("allocate");
    if (pool->Free(address, fences.epoch) != PoolStatus::kOk) state.SkipWithError("free");
    if (++since_sync == kBatch) {
      since_sync = 0;
      fences.Sync();
    }
  }
  state.SetLabel(PolicyArg(state));
  state.counters["reserved_blocks"] =
      static_cast<double>(pool->Stats().peak_reserved_bytes) / static_cast<double>(size);
}
BENCHMARK(BM_FencedPair)->ArgsProduct({{0, 1}, {4096, 1 << 20}})->ArgNames({"policy", "size"});

// Many live blocks of random sizes: each iteration frees a random one and allocates a new one.
void BM_RandomChurn(benchmark::State& state) {
  Fixture f(PolicyArg(state));
  const auto live = static_cast<std::size_t>(state.range(1));
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<std::size_t> size_dist(1, 1 << 20);
  std::vector<std::uintptr_t> blocks(live);
  for (auto& a : blocks) (void)f.pool->Allocate(size_dist(rng), &a);
  std::uniform_int_distribution<std::size_t> pick(0, live - 1);
  for (auto _ : state) {
    std::uintptr_t& slot = blocks[pick(rng)];
    if (f.pool->Free(slot, 0) != PoolStatus::kOk) state.SkipWithError("free");
    if (f.pool->Allocate(size_dist(rng), &slot) != PoolStatus::kOk) state.SkipWithError("alloc");
  }
  state.SetLabel(PolicyArg(state));
}
BENCHMARK(BM_RandomChurn)->ArgsProduct({{0, 1}, {1000, 10000}})->ArgNames({"policy", "live"});

// Contended pairs from several threads on one pool.
void BM_AllocFreePairThreads(benchmark::State& state) {
  static Fixture* shared = nullptr;
  if (state.thread_index() == 0) shared = new Fixture("vmm");
  std::uintptr_t address = 0;
  for (auto _ : state) {
    (void)shared->pool->Allocate(4096, &address);
    (void)shared->pool->Free(address, 0);
  }
  if (state.thread_index() == 0) {
    delete shared;
    shared = nullptr;
  }
}
BENCHMARK(BM_AllocFreePairThreads)->Threads(1)->Threads(2)->Threads(4);

}  // namespace
}  // namespace vramscope::pool

BENCHMARK_MAIN();
