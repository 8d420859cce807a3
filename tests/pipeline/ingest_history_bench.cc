// What the run history and Prometheus scrapes cost the collector's ingest (issue 21), in one run:
// the same sustained ingest measured side by side, alternating, in rounds.
//
// Each measurement starts a fresh collector (gRPC on loopback, as served) holding `--idle` live
// processes (1,000 by default: each a start with two run labels, so the exposition has that many
// processes), and one agent-like client (the agent's Outbox and Uplink) streams `--processes`
// processes one after another, each `--batches` batches of 4,096 allocation/free events, its last
// batch ending with its ProcessExit: processes finish throughout, and each finished one is a row
// of the run history. Reported: events/s from the first batch handed to the outbox to the last
// acknowledgement. Configurations:
//
//   off       no database (the baseline)
//   sqlite    the run history in SQLite in the data directory (the default)
//   postgres  the run history in a PostgreSQL server started for the run (tests/collector/
//             postgres_server.h; fsync off); "skipped: no postgres" where there is none
//   scrape    no database; /metrics (civetweb, as --metrics-listen) fetched over HTTP every
//             `--scrape-ms` (100 ms: ten times a 1 s scrape interval; 0 = back to back) by
//             another thread
//
// Per configuration: the median of `--rounds` rounds (configurations alternate within a round,
// the order reversed every other round), min-max, the ratio to the median of `off`, and a
// verdict against the goal: within 5% of `off`. For the databases also the rows written by the
// time ingest ended and the rows in the end, and the history writer's deferral: the rows it held
// back while ingest stored batches (median of the rounds), the longest any waited (the most of
// the rounds: at most the quiet period after ingest ends, or the 30 s bound), and how many a
// bound made it write while ingest was busy.
//
// Then the fleet exposition: a collector holding `--fleet` live processes (10,000) answers /metrics
// (CollectorMetrics::Render, what the handler does) `--rounds` times, and once more over HTTP each
// round: medians against the goal, < 100 ms.
//
// Exit status: 0 every verdict ok (or skipped), 1 a goal missed or a measurement failed, 2 usage.
//
// --direct=1: Collector::Ingest called on one thread (no gRPC, no client) and the rate taken per
// second of that thread's CPU, with the CPU of a batch that ends a process and of the others:
// what the history adds to the ingest thread itself, steady on a loaded machine.
//
//   build/tests/pipeline/ingest_history_bench [--rounds=5] [--processes=64] [--batches=8]
//       [--idle=1000] [--scrape-ms=100] [--fleet=10000] [--direct=0] [--defer-ms=30000]
//
// --defer-ms: the collector's --history-defer (rows wait at most that long while batches arrive);
// below the ingest's length (--defer-ms=0: never deferred) it measures the writes forced while
// ingest is busy.
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "history/history_writer.h"
#include "tests/collector/postgres_server.h"
#include "tests/collector/test_util.h"
#include "tests/pipeline/bench_batches.h"
#include "tests/pipeline/http_get.h"
#include "vramscope/agent/outbox.h"
#include "vramscope/agent/uplink.h"
#include "vramscope/collector/collector.h"
#include "vramscope/collector/metrics.h"
#include "vramscope/collector/service.h"
#include "vramscope/log.h"

namespace vramscope {
namespace {

constexpr int kEventsPerBatch = testing::kBenchEventsPerBatch;
constexpr double kIngestGoal = 0.95;  // within 5% of the rate without a database
constexpr double kScrapeGoalMs = 100;

struct Flags {
  int rounds = 5;
  int processes = 64;
  int batches = 8;
  int idle = 1000;
  int scrape_ms = 100;
  int fleet = 10000;
  int direct = 0;  // 1: Collector::Ingest on one thread, rate per CPU second of that thread
  // CollectorOptions::history_max_defer (--history-defer): how long history rows may wait while
  // batches arrive; a value under the ingest's length measures the forced writes.
  int defer_ms = 30000;
};

// Host "bench" for the streamed processes, "idle" for the ones that only started: pids never
// repeat within a run, so every history row is a new one (PostgreSQL keeps one server).
uint32_t next_pid = 1;

v1::ProcessKey StreamKey() { return testing::Key(next_pid++, "bench"); }

// A started process with a command line and two run labels, as a fleet's idle process.
v1::EventBatch StartBatch(const v1::ProcessKey& key) {
  v1::EventBatch batch = testing::Batch(key, 1, 17);
  v1::ProcessStartEvent* start = batch.mutable_events(0)->mutable_process_start();
  start->set_command_line(0, "/usr/bin/python3");
  (*start->mutable_labels())["job"] = absl::StrCat("train-", key.pid() % 50);
  (*start->mutable_labels())["git_commit"] = "0123456789abcdef";
  return batch;
}

// Batch `index` (0-based) of a streamed process: alternating allocations and frees of a working
// set, as a training loop produces them; the first starts the process, the last ends it.
v1::EventBatch WorkBatch(const v1::ProcessKey& key, int index, int batches) {
  v1::EventBatch batch;
  *batch.mutable_process() = key;
  if (index == 0) {
    v1::ProcessStartEvent* start = batch.add_events()->mutable_process_start();
    start->set_pid(key.pid());
    start->add_command_line("/usr/bin/python3");
    start->add_command_line("train.py");
    (*start->mutable_labels())["job"] = "bench";
  }
  testing::AppendChurn(&batch, static_cast<uint64_t>(index) * kEventsPerBatch, kEventsPerBatch);
  if (index == batches - 1) {
    v1::Event* exit = batch.add_events();
    exit->set_time_ns(1000000 + static_cast<uint64_t>(index + 1) * kEventsPerBatch * 1000);
    exit->mutable_process_exit()->set_exit_code(0);
  }
  return batch;
}

struct Config {
  std::string name;
  std::string database;  // CollectorOptions::database
  bool scrape = false;
  std::string skipped;  // why it is not measured ("" = measured)
};

struct Sample {
  double events_per_s = 0;
  uint64_t rows_during = 0;  // history rows written when the last batch was acknowledged
  uint64_t rows_end = 0;
  uint64_t scrapes = 0;
  // Rows the history writer held back while ingest was busy, of those written anyway (a bound
  // passed), and the longest a row waited.
  uint64_t deferred = 0;
  uint64_t forced = 0;
  double longest_deferral_ms = 0;
  // --direct: CPU per batch ending a process (its history row queued there) and per other batch.
  double exit_batch_ms = 0;
  double batch_ms = 0;
  std::string error;
};

// Fetches /metrics every `interval` (0: back to back) until stopped; counts the good answers.
class Scraper {
 public:
  Scraper(int port, std::chrono::milliseconds interval)
      : thread_([this, port, interval] {
          std::unique_lock<std::mutex> lock(mu_);
          while (!stop_) {
            lock.unlock();
            const testing::HttpResponse response = testing::HttpGet(port, "/metrics");
            lock.lock();
            ++(response.status == 200 ? scrapes_ : failures_);
            // The pace of the scrapes (Prometheus's interval), not a wait for something.
            cv_.wait_for(lock, interval, [this] { return stop_; });
          }
        }) {}
  // Stops and joins; the good scrapes, or -1 when one failed.
  int64_t Finish() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    return failures_ > 0 ? -1 : static_cast<int64_t>(scrapes_);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t scrapes_ = 0;
  uint64_t failures_ = 0;
  std::thread thread_;
};

double ThreadCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

void TakeDeferral(const collector::HistoryWriter& history, Sample* sample) {
  const collector::HistoryWriterStats stats = history.stats();
  sample->deferred = stats.deferred;
  sample->forced = stats.forced;
  sample->longest_deferral_ms = absl::ToDoubleMilliseconds(stats.longest_deferral);
}

Sample Measure(const Config& config, const Flags& flags) {
  Sample sample;
  testing::TempDir data;
  collector::CollectorOptions options;
  options.data_dir = data.path();
  options.database = config.database;
  options.history_max_defer = absl::Milliseconds(flags.defer_ms);
  options.max_processes = static_cast<uint32_t>(flags.idle + flags.processes + 16);
  absl::StatusOr<std::unique_ptr<collector::Collector>> core = collector::Collector::Open(options);
  if (!core.ok()) {
    sample.error = std::string(core.status().message());
    return sample;
  }
  for (int i = 0; i < flags.idle; ++i) {
    if (!(*core)->Ingest(StartBatch(testing::Key(next_pid++, "idle"))).ok()) {
      sample.error = "an idle process was refused";
      return sample;
    }
  }
  collector::ServerOptions server_options;
  server_options.listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<collector::CollectorServer>> server =
      collector::CollectorServer::Start(core->get(), server_options);
  if (!server.ok()) {
    sample.error = std::string(server.status().message());
    return sample;
  }
  auto metrics =
      std::make_shared<collector::CollectorMetrics>(core->get(), collector::MetricsOptions{});
  std::unique_ptr<collector::MetricsServer> metrics_server;
  if (config.scrape) {
    absl::StatusOr<std::unique_ptr<collector::MetricsServer>> served =
        collector::ServeMetrics("127.0.0.1:0", [metrics] { return metrics->Render(); });
    if (!served.ok()) {
      sample.error = std::string(served.status().message());
      return sample;
    }
    metrics_server = *std::move(served);
  }

  std::vector<v1::EventBatch> batches;
  batches.reserve(static_cast<size_t>(flags.processes) * flags.batches);
  for (int p = 0; p < flags.processes; ++p) {
    const v1::ProcessKey key = StreamKey();
    for (int b = 0; b < flags.batches; ++b) batches.push_back(WorkBatch(key, b, flags.batches));
  }
  uint64_t events = 0;
  for (const v1::EventBatch& batch : batches) events += static_cast<uint64_t>(batch.events_size());

  collector::HistoryWriter* history = (*core)->history();
  if (flags.direct) {
    std::unique_ptr<Scraper> scraper;
    if (config.scrape) {
      scraper = std::make_unique<Scraper>(metrics_server->port(),
                                          std::chrono::milliseconds(flags.scrape_ms));
    }
    const double cpu_start = ThreadCpuMs();
    uint64_t sequence = 0;
    for (v1::EventBatch& batch : batches) {
      sequence = batch.events(0).has_process_start() ? 1 : sequence + 1;
      batch.set_sequence(sequence);
      const bool last = batch.events(batch.events_size() - 1).has_process_exit();
      const double before = ThreadCpuMs();
      if (!(*core)->Ingest(batch).ok()) sample.error = "a batch was refused";
      (last ? sample.exit_batch_ms : sample.batch_ms) += ThreadCpuMs() - before;
    }
    const double cpu_ms = ThreadCpuMs() - cpu_start;
    sample.exit_batch_ms /= flags.processes;
    sample.batch_ms /= static_cast<double>(batches.size()) - flags.processes;
    if (history != nullptr) sample.rows_during = history->written();
    if (scraper != nullptr) sample.scrapes = static_cast<uint64_t>(scraper->Finish());
    if (history != nullptr) {
      history->WaitIdle(absl::Seconds(120));
      TakeDeferral(*history, &sample);
    }
    sample.events_per_s = static_cast<double>(events) / (cpu_ms / 1e3);
    return sample;
  }
  agent::OutboxOptions outbox_options;
  outbox_options.max_memory_bytes = uint64_t{1} << 30;
  agent::Outbox outbox(outbox_options);
  agent::UplinkOptions uplink_options;
  uplink_options.collector = absl::StrCat("127.0.0.1:", (*server)->port());
  agent::Uplink uplink(&outbox, uplink_options);
  uplink.Start();
  std::unique_ptr<Scraper> scraper;
  if (config.scrape) {
    scraper = std::make_unique<Scraper>(metrics_server->port(),
                                        std::chrono::milliseconds(flags.scrape_ms));
  }
  const auto start = std::chrono::steady_clock::now();
  for (v1::EventBatch& batch : batches) {
    if (!outbox.Add(std::move(batch))) sample.error = "the outbox dropped a batch";
  }
  const bool acked = outbox.WaitAllAcked(absl::Seconds(300));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (history != nullptr) sample.rows_during = history->written();
  if (scraper != nullptr) {
    const int64_t scrapes = scraper->Finish();
    if (scrapes < 0) sample.error = "a scrape failed";
    sample.scrapes = static_cast<uint64_t>(std::max<int64_t>(scrapes, 0));
  }
  uplink.Stop();
  if (!acked) sample.error = "not acknowledged within 300 s";
  if ((*core)->Metrics(0).events_stored < events) sample.error = "not every event was stored";
  if (history != nullptr) {
    if (!history->WaitIdle(absl::Seconds(120))) sample.error = "history rows still queued";
    sample.rows_end = history->written();
    TakeDeferral(*history, &sample);
    if (sample.rows_end != static_cast<uint64_t>(flags.processes)) {
      sample.error = absl::StrFormat("%d history rows, want %d", sample.rows_end, flags.processes);
    }
  }
  sample.events_per_s = static_cast<double>(events) / seconds;
  return sample;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n == 0 ? 0 : n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// The fleet exposition: render and serve /metrics of `flags.fleet` live processes.
bool FleetScrape(const Flags& flags) {
  testing::TempDir data;
  collector::CollectorOptions options;
  options.data_dir = data.path();
  options.max_processes = static_cast<uint32_t>(flags.fleet + 16);
  auto core = collector::Collector::Open(options);
  if (!core.ok()) {
    std::printf("fleet scrape: FAIL %s\n", std::string(core.status().message()).c_str());
    return false;
  }
  for (int i = 0; i < flags.fleet; ++i) {
    (void)(*core)->Ingest(
        StartBatch(testing::Key(static_cast<uint32_t>(100000 + i), absl::StrCat("node", i / 8))));
  }
  auto metrics =
      std::make_shared<collector::CollectorMetrics>(core->get(), collector::MetricsOptions{});
  auto server = collector::ServeMetrics("127.0.0.1:0", [metrics] { return metrics->Render(); });
  if (!server.ok()) {
    std::printf("fleet scrape: FAIL %s\n", std::string(server.status().message()).c_str());
    return false;
  }
  std::vector<double> wall, cpu, http;
  size_t bytes = 0;
  bool answered = true;
  for (int r = 0; r < flags.rounds; ++r) {
    const double cpu_start = ThreadCpuMs();
    const auto start = std::chrono::steady_clock::now();
    bytes = metrics->Render().size();
    wall.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
    cpu.push_back(ThreadCpuMs() - cpu_start);
    const auto fetch = std::chrono::steady_clock::now();
    const testing::HttpResponse response = testing::HttpGet((*server)->port(), "/metrics");
    http.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - fetch)
            .count());
    answered = answered && response.status == 200 && response.body.size() >= bytes / 2;
  }
  const size_t shown = (*core)->Metrics(0).processes.size();
  const bool ok = answered && shown == static_cast<size_t>(flags.fleet) &&
                  Median(wall) < kScrapeGoalMs && Median(http) < kScrapeGoalMs;
  std::printf(
      "fleet scrape, %zu live processes (%.1f MB of text): render %.1f ms (CPU %.1f ms), "
      "over HTTP %.1f ms (medians of %d; goal < %.0f ms): %s\n",
      shown, static_cast<double>(bytes) / 1e6, Median(wall), Median(cpu), Median(http),
      flags.rounds, kScrapeGoalMs,
      !answered ? "FAIL a scrape was not answered"
      : ok      ? "ok"
                : "FAIL over the goal");
  return ok;
}

bool ParseFlags(int argc, char** argv, Flags* flags) {
  const std::map<std::string, int*> names = {
      {"--rounds", &flags->rounds},       {"--processes", &flags->processes},
      {"--batches", &flags->batches},     {"--idle", &flags->idle},
      {"--scrape-ms", &flags->scrape_ms}, {"--fleet", &flags->fleet},
      {"--direct", &flags->direct},       {"--defer-ms", &flags->defer_ms}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t equals = arg.find('=');
    const auto found = names.find(arg.substr(0, equals));
    if (equals == std::string::npos || found == names.end() ||
        !absl::SimpleAtoi(arg.substr(equals + 1), found->second) || *found->second < 0) {
      std::fprintf(stderr, "ingest_history_bench: bad argument %s\n", arg.c_str());
      return false;
    }
  }
  if (flags->rounds < 1 || flags->processes < 1 || flags->batches < 1) {
    std::fprintf(stderr, "ingest_history_bench: --rounds, --processes, --batches must be >= 1\n");
    return false;
  }
  return true;
}

int Main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  vramscope::SetMinLogLevel(vramscope::LogLevel::kError);

  std::vector<Config> configs = {{"off", "off", false, ""},
                                 {"sqlite", "", false, ""},
                                 {"postgres", "", false, ""},
                                 {"scrape", "off", true, ""}};
  testing::PostgresServer postgres;
  if (const std::string why = postgres.Init(); !why.empty()) {
    configs[2].skipped = "skipped: no postgres (" + why + ")";
  } else if (!postgres.Start()) {
    configs[2].skipped = "skipped: no postgres (the server did not start)";
  } else {
    configs[2].database = postgres.Uri();
  }
  std::printf(
      "ingest %s: %d processes x %d batches x %d events per measurement, each process "
      "finishing; %d idle live processes; scrape every %d ms; history rows deferred at most %d "
      "ms while batches arrive; %d rounds, alternating\n",
      flags.direct != 0 ? "on one thread (--direct, per CPU second)" : "over gRPC", flags.processes,
      flags.batches, kEventsPerBatch, flags.idle, flags.scrape_ms, flags.defer_ms, flags.rounds);
  std::fflush(stdout);

  std::vector<std::vector<Sample>> samples(configs.size());
  bool ok = true;
  for (int round = 0; round < flags.rounds; ++round) {
    for (size_t k = 0; k < configs.size(); ++k) {
      const size_t c = round % 2 == 0 ? k : configs.size() - 1 - k;
      if (!configs[c].skipped.empty()) continue;
      Sample sample = Measure(configs[c], flags);
      std::printf("  round %d %-8s %6.3f M events/s%s%s%s\n", round + 1, configs[c].name.c_str(),
                  sample.events_per_s / 1e6,
                  flags.direct == 0
                      ? ""
                      : absl::StrFormat("  (CPU per batch: %.2f ms, ending a process %.2f ms)",
                                        sample.batch_ms, sample.exit_batch_ms)
                            .c_str(),
                  sample.error.empty() ? "" : "  FAIL ", sample.error.c_str());
      std::fflush(stdout);
      if (!sample.error.empty()) ok = false;
      samples[c].push_back(sample);
    }
  }

  auto rates = [&](size_t c) {
    std::vector<double> out;
    for (const Sample& s : samples[c]) out.push_back(s.events_per_s);
    return out;
  };
  const double base = Median(rates(0));
  std::printf("%-9s | %-13s | %-15s | %-6s | %-30s | %-34s | %s\n", "database", "M events/s",
              "min-max", "ratio", "during ingest", "rows deferred (longest), forced",
              "verdict (goal: within 5% of off)");
  for (size_t c = 0; c < configs.size(); ++c) {
    if (!configs[c].skipped.empty()) {
      std::printf("%-9s | %-13s | %-15s | %-6s | %-30s | %-34s | %s\n", configs[c].name.c_str(),
                  "-", "-", "-", "-", "-", configs[c].skipped.c_str());
      continue;
    }
    const std::vector<double> r = rates(c);
    const double median = Median(r);
    const double ratio = base > 0 ? median / base : 0;
    std::string during = "-";
    std::string deferral = "-";
    if (configs[c].scrape) {
      std::vector<double> scrapes;
      for (const Sample& s : samples[c]) scrapes.push_back(static_cast<double>(s.scrapes));
      during = absl::StrFormat("%.0f scrapes of %d processes", Median(scrapes), flags.idle);
    } else if (c != 0) {
      std::vector<double> rows;
      for (const Sample& s : samples[c]) rows.push_back(static_cast<double>(s.rows_during));
      during = absl::StrFormat("%.0f of %d rows written", Median(rows), flags.processes);
      std::vector<double> deferred, forced;
      double longest = 0;
      for (const Sample& s : samples[c]) {
        deferred.push_back(static_cast<double>(s.deferred));
        forced.push_back(static_cast<double>(s.forced));
        longest = std::max(longest, s.longest_deferral_ms);
      }
      deferral = absl::StrFormat("%.0f of %d (%.0f ms), %.0f forced", Median(deferred),
                                 flags.processes, longest, Median(forced));
    }
    std::string verdict = "baseline";
    if (c != 0) {
      const bool within = ratio >= kIngestGoal;
      verdict = absl::StrFormat("%s %+.1f%%", within ? "ok" : "FAIL", (ratio - 1) * 100);
      if (!within) ok = false;
    }
    std::printf("%-9s | %-13.3f | %5.3f-%-9.3f | %-6.3f | %-30s | %-34s | %s\n",
                configs[c].name.c_str(), median / 1e6, *std::min_element(r.begin(), r.end()) / 1e6,
                *std::max_element(r.begin(), r.end()) / 1e6, ratio, during.c_str(),
                deferral.c_str(), verdict.c_str());
  }
  std::fflush(stdout);
  if (flags.fleet > 0 && !FleetScrape(flags)) ok = false;
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace vramscope

int main(int argc, char** argv) { return vramscope::Main(argc, argv); }
