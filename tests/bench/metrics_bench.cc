// The collector's Prometheus exposition at fleet size, and ingest while it is scraped.
//
// BM_Scrape: a collector holding 10,000 live processes (one device each, two run labels) answers
// a scrape as its /metrics handler does: CollectorMetrics::Render (Collector::Metrics copies each
// process's figures under its lock, then the text is written with no lock held). Reported: time
// per scrape and bytes of text. Goal (issue 21): < 100 ms. BM_Snapshot is the copying part alone;
// BM_ScrapePrometheusCpp the same text through prometheus-cpp's families and TextSerializer.
//
// BM_Ingest/scrape:0|1: batches of 1,024 alloc/free events into 8 of those processes from one
// thread (Collector::Ingest: log append and stats engine, no gRPC), without and with a thread
// scraping the whole fleet every 100 ms (ten times a 1 s scrape interval). Reported: events/s.
//
//   build/tests/bench/metrics_bench --benchmark_min_time=2
#include <absl/strings/str_cat.h>
#include <benchmark/benchmark.h>
#include <prometheus/text_serializer.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/collector/test_util.h"
#include "vramscope/collector/collector.h"
#include "vramscope/collector/metrics.h"
#include "vramscope/log.h"

namespace vramscope::collector {
namespace {

constexpr int kProcesses = 10000;
constexpr int kActive = 8;
constexpr int kEventsPerBatch = 1024;

v1::ProcessKey FleetKey(int i) {
  return testing::Key(static_cast<uint32_t>(100000 + i), absl::StrCat("node", i / 8));
}

// The first batch of fleet process `i`: its start (command line, two labels) and 16 allocations.
v1::EventBatch StartBatch(int i) {
  v1::EventBatch batch = testing::Batch(FleetKey(i), 1, 17);
  v1::ProcessStartEvent* start = batch.mutable_events(0)->mutable_process_start();
  start->set_command_line(0, "/usr/bin/python3");
  (*start->mutable_labels())["job"] = absl::StrCat("train-", i % 50);
  (*start->mutable_labels())["git_commit"] = "0123456789abcdef";
  return batch;
}

// Batch `sequence` (>= 2) of an active process: alternating allocations and frees.
v1::EventBatch WorkBatch(const v1::ProcessKey& key, uint64_t sequence) {
  v1::EventBatch batch;
  *batch.mutable_process() = key;
  batch.set_sequence(sequence);
  for (int i = 0; i < kEventsPerBatch; ++i) {
    v1::Event* event = batch.add_events();
    event->set_time_ns(1000000 + static_cast<uint64_t>(i));
    const uint64_t address = 0x7f0000000000 + static_cast<uint64_t>(i / 2) * 0x1000;
    if (i % 2 == 0) {
      event->mutable_alloc()->set_address(address);
      event->mutable_alloc()->set_requested_bytes(4000);
      event->mutable_alloc()->set_allocated_bytes(4096);
      event->mutable_alloc()->set_kind(v1::ALLOCATION_KIND_POOLED);
    } else {
      event->mutable_free()->set_address(address);
    }
  }
  return batch;
}

struct Fleet {
  testing::TempDir dir;
  std::unique_ptr<Collector> collector;
  std::shared_ptr<CollectorMetrics> metrics;
  std::vector<uint64_t> next_sequence = std::vector<uint64_t>(kActive, 2);
};

Fleet& TheFleet() {
  static Fleet* fleet = [] {
    SetMinLogLevel(LogLevel::kError);
    auto* f = new Fleet;
    CollectorOptions options;
    options.data_dir = f->dir.path();
    options.max_processes = kProcesses;
    f->collector = std::move(*Collector::Open(options));
    for (int i = 0; i < kProcesses; ++i) (void)f->collector->Ingest(StartBatch(i));
    f->metrics = std::make_shared<CollectorMetrics>(f->collector.get(), MetricsOptions{});
    return f;
  }();
  return *fleet;
}

// What the collector's /metrics handler does.
size_t Scrape(const CollectorMetrics& metrics) { return metrics.Render().size(); }

// The same exposition through prometheus-cpp (families + TextSerializer), for comparison.
void BM_ScrapePrometheusCpp(benchmark::State& state) {
  Fleet& fleet = TheFleet();
  for (auto _ : state) {
    benchmark::DoNotOptimize(prometheus::TextSerializer().Serialize(fleet.metrics->Collect()));
  }
}
BENCHMARK(BM_ScrapePrometheusCpp)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Scrape(benchmark::State& state) {
  Fleet& fleet = TheFleet();
  size_t bytes = 0;
  for (auto _ : state) bytes = Scrape(*fleet.metrics);
  state.counters["processes"] = static_cast<double>(fleet.collector->Metrics(0).processes.size());
  state.counters["text_bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_Scrape)->Unit(benchmark::kMillisecond)->UseRealTime();

// The snapshot alone (no text): the part that holds the process locks, one at a time.
void BM_Snapshot(benchmark::State& state) {
  Fleet& fleet = TheFleet();
  for (auto _ : state) benchmark::DoNotOptimize(fleet.collector->Metrics(0));
}
BENCHMARK(BM_Snapshot)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Ingest(benchmark::State& state) {
  Fleet& fleet = TheFleet();
  std::mutex mu;
  std::condition_variable stop_cv;
  bool stop = false;
  std::atomic<int> scrapes{0};
  std::thread scraper;
  if (state.range(0) != 0) {
    scraper = std::thread([&] {
      std::unique_lock<std::mutex> lock(mu);
      while (!stop) {
        lock.unlock();
        if (state.range(0) == 1) {
          Scrape(*fleet.metrics);
        } else {
          benchmark::DoNotOptimize(fleet.collector->Metrics(0));
        }
        scrapes.fetch_add(1);
        lock.lock();
        stop_cv.wait_for(lock, std::chrono::seconds(1), [&] { return stop; });
      }
    });
  }
  std::vector<v1::EventBatch> batches;
  for (int p = 0; p < kActive; ++p) batches.push_back(WorkBatch(FleetKey(p), 2));
  int64_t events = 0;
  for (auto _ : state) {
    for (int p = 0; p < kActive; ++p) {
      batches[p].set_sequence(fleet.next_sequence[p]);
      if (!fleet.collector->Ingest(batches[p]).ok()) state.SkipWithError("ingest failed");
      ++fleet.next_sequence[p];
      events += kEventsPerBatch;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  stop_cv.notify_all();
  if (scraper.joinable()) scraper.join();
  state.counters["events_per_s"] =
      benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
  state.counters["scrapes"] = scrapes.load();
}
BENCHMARK(BM_Ingest)->ArgName("scrape")->Arg(0)->Arg(1)->Arg(2)->UseRealTime();

}  // namespace
}  // namespace vramscope::collector

BENCHMARK_MAIN();
