// Cost of a record write on the hot path (goal: < 30 ns), and of reading records back out of a
// file ring (RingReader::Drain, what the agent and `vramscope run` do per record). Run:
//   meson test -C build --benchmark --suite bench ring_bench   (or run the executable directly)
#include <benchmark/benchmark.h>

#include "ring_test_util.h"
#include "vramscope/ring/ring_writer.h"

namespace vramscope::interposer {
namespace {

// A ring whose reader keeps up: the benchmark moves tail itself so no write is dropped.
class Ring {
 public:
  Ring() { (void)writer_.Open({.dir = dir_.path().c_str(), .capacity = 1u << 16}); }
  RingWriter& writer() { return writer_; }
  void Consume() {
    auto* h = const_cast<vramscope_ring_header*>(writer_.header());
    __atomic_store_n(&h->tail, __atomic_load_n(&h->head, __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);
  }

 private:
  testing::TempDir dir_;
  RingWriter writer_;
};

Ring& SharedRing() {
  static Ring* ring = new Ring();
  return *ring;
}

// Write of a filled record (the caller already has time and tid).
void BM_Write(benchmark::State& state) {
  Ring& ring = SharedRing();
  vramscope_ring_record r{};
  r.kind = VRAMSCOPE_RING_KIND_ALLOC;
  r.time_ns = 1;
  std::uint64_t i = 0;
  for (auto _ : state) {
    r.payload.alloc.address = ++i;
    benchmark::DoNotOptimize(ring.writer().Write(r));
    if ((i & 1023) == 0 && state.thread_index() == 0) ring.Consume();
  }
  if (state.thread_index() == 0) ring.Consume();
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Write)->Threads(1)->Threads(2);

// What the shim calls per cudaMalloc: counters + clock + tid + record.
void BM_RecordAlloc(benchmark::State& state) {
  Ring& ring = SharedRing();
  std::uint64_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        ring.writer().RecordAlloc(0, ++i, 1000, 1024, VRAMSCOPE_RING_ALLOC_POOLED));
    if ((i & 1023) == 0 && state.thread_index() == 0) ring.Consume();
  }
  if (state.thread_index() == 0) ring.Consume();
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RecordAlloc)->Threads(1)->Threads(2);

// The drop path: a full ring (no consumer).
void BM_WriteDropped(benchmark::State& state) {
  testing::TempDir dir;
  RingWriter writer;
  (void)writer.Open({.dir = dir.path().c_str(), .capacity = 64});
  vramscope_ring_record r{};
  for (int i = 0; i < 64; ++i) (void)writer.Write(r);
  for (auto _ : state) benchmark::DoNotOptimize(writer.Write(r));
}
BENCHMARK(BM_WriteDropped);

// RingReader::Drain of a mapped file ring: 2^16 alloc/free records per iteration, decoded into
// events (the writes are not timed).
void BM_Drain(benchmark::State& state) {
  constexpr std::uint64_t kRecords = 1u << 16;
  testing::TempDir dir;
  RingWriter writer;
  if (writer.Open({.dir = dir.path().c_str(), .capacity = kRecords}) != RingError::kOk) {
    state.SkipWithError("cannot open a ring");
    return;
  }
  auto reader = agent::RingReader::OpenFile(writer.path());
  if (!reader.ok()) {
    state.SkipWithError(std::string(reader.status().message()).c_str());
    return;
  }
  google::protobuf::RepeatedPtrField<v1::Event> events;
  std::uint64_t records = 0;
  std::uint64_t n = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (std::uint64_t i = 0; i < kRecords; ++i, ++n) {
      const std::uint64_t address = 0x7f0000000000 + (n / 2 % 512) * 0x100000;
      if (n % 2 == 0) {
        writer.RecordAlloc(0, address, 4000, 4096, VRAMSCOPE_RING_ALLOC_POOLED);
      } else {
        writer.RecordFree(0, address, 4000, 4096, VRAMSCOPE_RING_ALLOC_POOLED);
      }
    }
    events.Clear();
    state.ResumeTiming();
    absl::StatusOr<agent::DrainStats> drained = (*reader)->Drain(&events);
    if (!drained.ok() || drained->records < kRecords) {
      state.SkipWithError("the drain did not take every record");
      break;
    }
    records += drained->records;
  }
  state.counters["records_per_second"] =
      benchmark::Counter(static_cast<double>(records), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Drain)->Unit(benchmark::kMillisecond);

void BM_Clock(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(RingNowNs());
}
BENCHMARK(BM_Clock);

}  // namespace
}  // namespace vramscope::interposer

BENCHMARK_MAIN();
