// The collector's own CPU per event on the Ingest path, without gRPC, TLS or a client: what one
// Ingest stream's thread does per received message (collector/service.cc IngestReactor::Handle):
// parse the wire bytes into the stream's reused arena (CheckIngestMessage), store the record
// (CRC-framed log, no fsync) and feed the stats engine (Collector::Ingest), and build and
// serialize the acknowledgement.
//
// Input, fixed: `--processes` processes one after another, each `--batches` batches of 4,096
// allocation/free events (tests/pipeline/bench_batches.h, the batches ingest_bench streams),
// serialized before the clock starts. Reported: CPU time of the ingesting thread per event and
// its inverse, events/s per core; the median of `--rounds` rounds (a fresh collector each).
// `--goal-ns=N`: exit status 1 when the median is above N ns per event (0 = no verdict).
// Then the CPU of one Watch snapshot (Collector::Snapshot, what the fan-out thread takes for its
// watchers each tick) of `--idle` live processes that received nothing since the one before
// (0 = not measured).
//
// Instruction counts, the steady figure on a loaded machine (IngestAll is the measured loop):
//   valgrind --tool=callgrind --toggle-collect='*IngestAll*'
//       build/tests/pipeline/collector_core_bench --rounds=1 --processes=1 --batches=50
//   (total Ir / 204,800 events = instructions per event)
//
//   build/tests/pipeline/collector_core_bench [--rounds=5] [--processes=4] [--batches=100]
//       [--idle=1000] [--goal-ns=0]
#include <absl/strings/numbers.h>
#include <absl/strings/str_format.h>
#include <google/protobuf/arena.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/collector/test_util.h"
#include "tests/pipeline/bench_batches.h"
#include "vramscope/collector/batch_check.h"
#include "vramscope/collector/collector.h"
#include "vramscope/log.h"
#include "vramscope/v1/collector.pb.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope {
namespace {

struct Flags {
  int rounds = 5;
  int processes = 4;
  int batches = 100;
  double goal_ns = 0;
  int idle = 1000;
};

bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) return false;
    const std::string name = arg.substr(2, eq - 2);
    const std::string value = arg.substr(eq + 1);
    bool ok = false;
    if (name == "rounds") ok = absl::SimpleAtoi(value, &flags->rounds) && flags->rounds > 0;
    if (name == "processes")
      ok = absl::SimpleAtoi(value, &flags->processes) && flags->processes > 0;
    if (name == "batches") ok = absl::SimpleAtoi(value, &flags->batches) && flags->batches > 0;
    if (name == "idle") ok = absl::SimpleAtoi(value, &flags->idle) && flags->idle >= 0;
    if (name == "goal-ns") ok = absl::SimpleAtod(value, &flags->goal_ns) && flags->goal_ns >= 0;
    if (!ok) return false;
  }
  return true;
}

double ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

// The wire bytes of every batch, processes one after another (sequences from 1).
std::vector<std::string> MakeWire(const Flags& flags) {
  std::vector<std::string> wire;
  for (int p = 0; p < flags.processes; ++p) {
    const v1::ProcessKey key = testing::Key(static_cast<uint32_t>(p + 1));
    for (int b = 0; b < flags.batches; ++b) {
      v1::EventBatch batch;
      *batch.mutable_process() = key;
      batch.set_sequence(static_cast<uint64_t>(b) + 1);
      testing::AppendChurn(&batch, static_cast<uint64_t>(b) * testing::kBenchEventsPerBatch,
                           testing::kBenchEventsPerBatch);
      wire.push_back(batch.SerializeAsString());
    }
  }
  return wire;
}

// What IngestReactor::Handle does per message, for every message; false on any failure.
__attribute__((noinline)) bool IngestAll(collector::Collector* core,
                                         const std::vector<std::string>& wire,
                                         google::protobuf::Arena* arena, size_t* ack_bytes) {
  collector::IngestScratch scratch;
  for (const std::string& bytes : wire) {
    arena->Reset();
    collector::IngestMessage message = collector::CheckIngestMessage(bytes, arena, &scratch);
    if (message.kind != collector::IngestMessage::Kind::kBatch) return false;
    absl::StatusOr<uint64_t> acked = core->Ingest(message, bytes, false, "");
    if (!acked.ok()) return false;
    v1::IngestAck ack;
    *ack.mutable_process() = message.batch->process();
    ack.set_acked_sequence(*acked);
    *ack_bytes += ack.SerializeAsString().size();
  }
  return true;
}

int Main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr,
                 "usage: collector_core_bench [--rounds=5] [--processes=4] [--batches=100] "
                 "[--idle=1000] [--goal-ns=0]\n");
    return 2;
  }
  SetMinLogLevel(LogLevel::kError);
  const std::vector<std::string> wire = MakeWire(flags);
  const double events = static_cast<double>(wire.size()) * testing::kBenchEventsPerBatch;
  // As the service: one block reused for every batch of the stream.
  constexpr size_t kArenaBlockBytes = size_t{1} << 20;
  std::unique_ptr<char[]> block(new char[kArenaBlockBytes]);
  google::protobuf::ArenaOptions arena_options;
  arena_options.initial_block = block.get();
  arena_options.initial_block_size = kArenaBlockBytes;
  arena_options.max_block_size = kArenaBlockBytes;
  google::protobuf::Arena arena(arena_options);
  std::vector<double> per_event;
  for (int round = 0; round < flags.rounds; ++round) {
    testing::TempDir data;
    collector::CollectorOptions options;
    options.data_dir = data.path();
    absl::StatusOr<std::unique_ptr<collector::Collector>> core =
        collector::Collector::Open(options);
    if (!core.ok()) {
      std::fprintf(stderr, "cannot open a collector: %s\n", core.status().ToString().c_str());
      return 1;
    }
    size_t ack_bytes = 0;
    const double start = ThreadCpuNs();
    const bool ok = IngestAll(core->get(), wire, &arena, &ack_bytes);
    const double cpu = ThreadCpuNs() - start;
    if (!ok) {
      std::fprintf(stderr, "a batch was not stored\n");
      return 1;
    }
    per_event.push_back(cpu / events);
    std::printf("round %d: %.1f ns CPU per event, %.2f M events/s per core\n", round + 1,
                cpu / events, events / cpu * 1e3);
  }
  // Watch: one snapshot of every process (what the fan-out thread takes per tick), with
  // `--idle` live processes that received nothing since the last one.
  if (flags.idle > 0) {
    testing::TempDir data;
    collector::CollectorOptions options;
    options.data_dir = data.path();
    options.max_processes = static_cast<uint32_t>(flags.idle) + 1;
    auto core = *collector::Collector::Open(options);
    for (int p = 0; p < flags.idle; ++p) {
      v1::EventBatch batch;
      *batch.mutable_process() = testing::Key(static_cast<uint32_t>(100000 + p));
      batch.set_sequence(1);
      testing::AppendChurn(&batch, 0, 64);
      if (!core->Ingest(batch).ok()) return 1;
    }
    // The first snapshot builds every process's figures; the later ones find nothing changed.
    std::vector<double> snapshot_ms;
    for (int round = 0; round <= flags.rounds; ++round) {
      const double start = ThreadCpuNs();
      const v1::StatsUpdate update = core->Snapshot({});
      snapshot_ms.push_back((ThreadCpuNs() - start) / 1e6);
      if (update.processes_size() != flags.idle) return 1;
    }
    const double first = snapshot_ms.front();
    snapshot_ms.erase(snapshot_ms.begin());
    std::sort(snapshot_ms.begin(), snapshot_ms.end());
    std::printf(
        "watch snapshot of %d live processes: %.2f ms CPU the first (figures built), median "
        "%.2f ms of %d more with nothing received between\n",
        flags.idle, first, snapshot_ms[snapshot_ms.size() / 2], flags.rounds);
  }
  std::sort(per_event.begin(), per_event.end());
  const double median = per_event[per_event.size() / 2];
  std::string verdict = "no goal given";
  if (flags.goal_ns > 0) {
    verdict = median <= flags.goal_ns ? absl::StrFormat("ok <= %.0f ns", flags.goal_ns)
                                      : absl::StrFormat("FAIL > %.0f ns", flags.goal_ns);
  }
  std::printf(
      "collector core ingest (parse, log, stats, ack; %d processes x %d batches x %d events): "
      "median %.1f ns CPU per event (%.2f M events/s per core), min %.1f, max %.1f: %s\n",
      flags.processes, flags.batches, testing::kBenchEventsPerBatch, median, 1e3 / median,
      per_event.front(), per_event.back(), verdict.c_str());
  return flags.goal_ns > 0 && median > flags.goal_ns ? 1 : 0;
}

}  // namespace
}  // namespace vramscope

int main(int argc, char** argv) { return vramscope::Main(argc, argv); }
