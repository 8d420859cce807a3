// Collector ingest throughput: one agent-like client (the agent's Outbox and Uplink) streams
// batches of 4096 allocation/free events over loopback gRPC to a collector in the same process,
// as the agent streams them: each batch's events are wire bytes before the timing starts (the
// agent writes them from ring records, BM_AgentDrain), the Outbox numbers and composes the
// serialized batch, the Uplink writes those bytes. The collector
// parses, stores (CRC-framed log; fsync per batch or not) and feeds its stats engine.
// Reported: events/s from the first batch handed to the outbox to the last acknowledgement.
// secure:1 runs it over TLS with bearer tokens (certificates made with the openssl command).
//
// BM_CollectorIngestHistory: the same with every process finishing (a ProcessExit in its last
// batch), the run history off or in SQLite: what writing history rows costs ingest.
//
// Agent drain cost: records a ring writer wrote are drained by Agent::Poll into batches of 4096
// events and handed to the Outbox, without a spool and with one (every batch written to a file
// and renamed before the ring's tail moves). No uplink: this is the drain loop alone. Reported:
// events/s of Poll.
//
// Shim-to-Watch latency: a ring writer (the shim's) records an allocation; an agent polling its
// ring every millisecond forwards it; a Watch stream at the smallest interval (50 ms) shows the
// new peak. Reported: time from the write to the update that shows it.
//
//   meson test -C build --benchmark --suite bench ingest_bench --verbose
#include <absl/strings/str_cat.h>
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "drain/event_encoder.h"
#include "history/history_writer.h"
#include "tests/collector/test_util.h"
#include "tests/net/test_certs.h"
#include "tests/pipeline/bench_batches.h"
#include "vramscope/agent/agent.h"
#include "vramscope/agent/outbox.h"
#include "vramscope/agent/uplink.h"
#include "vramscope/collector/collector.h"
#include "vramscope/collector/service.h"
#include "vramscope/log.h"
#include "vramscope/net_security.h"
#include "vramscope/ring/ring_writer.h"
#include "vramscope/v1/collector.grpc.pb.h"

namespace vramscope {
namespace {

constexpr int kEventsPerBatch = testing::kBenchEventsPerBatch;
constexpr int kBatchesPerIteration = 100;

// Batch `index` of a process: testing::AppendChurn's events from index * 4096 on, as the agent
// hands them to the Outbox: written from ring records into wire bytes (EncodedEvents, as
// Agent::Poll does), the counters encoded. `finish` adds a ProcessExit.
agent::EncodedBatch MakeBatch(const v1::ProcessKey& key, int index, bool finish) {
  agent::EncodedEvents events;
  const uint64_t first = static_cast<uint64_t>(index) * kEventsPerBatch;
  for (uint64_t n = first; n < first + kEventsPerBatch; ++n) {
    vramscope_ring_record record{};
    record.time_ns = 1000000 + n * 1000;
    record.tid = 4242;
    record.kind = n % 2 == 0 ? VRAMSCOPE_RING_KIND_ALLOC : VRAMSCOPE_RING_KIND_FREE;
    record.sub = VRAMSCOPE_RING_ALLOC_POOLED;
    const uint64_t bytes = 4096 + (n / 2 % 97) * 512;
    record.payload.alloc.address = 0x7f0000000000 + (n / 2 % 512) * 0x100000;
    record.payload.alloc.requested_bytes = bytes - 100;
    record.payload.alloc.allocated_bytes = bytes;
    if (!events.AddRecord(record, "").ok()) abort();
  }
  if (finish) {
    v1::Event exit;
    exit.set_time_ns(events.first_time_ns() + kEventsPerBatch * 1000);
    exit.mutable_process_exit()->set_exit_code(0);
    events.AddEvent(exit);
  }
  agent::EncodedBatch encoded;
  encoded.process = key;
  encoded.event_count = events.size();
  encoded.first_time_ns = events.first_time_ns();
  encoded.events = events.TakeBytes();
  v1::DeviceCounters counters;  // as testing::AppendChurn
  counters.set_device(0);
  counters.set_peak_reserved_bytes(512u << 20);
  agent::AppendCountersField(counters, &encoded.counters);
  return encoded;
}

// `finish`: each iteration's process ends (a ProcessExit in its last batch), so with a history
// database its row is queued and written while the next process is ingested.
void RunCollectorIngest(benchmark::State& state, bool fsync, const std::string& database,
                        bool finish) {
  vramscope::SetMinLogLevel(vramscope::LogLevel::kError);
  testing::TempDir data;
  collector::CollectorOptions options;
  options.data_dir = data.path();
  options.fsync = fsync;
  options.database = database;
  auto core = *collector::Collector::Open(options);
  collector::ServerOptions server_options;
  server_options.listen = "127.0.0.1:0";
  agent::UplinkOptions uplink_options;
  // secure:1: TLS (test CA, EC P-256) and writer/reader tokens, as a locked-down deployment.
  testing::TempDir certs_dir;
  if (state.range(1) != 0) {
    testing::TestCerts certs(certs_dir.path());
    if (!certs.ok()) {
      state.SkipWithError(certs.error().c_str());
      return;
    }
    net::ServerSecurity security;
    security.cert_file = certs.server_cert();
    security.key_file = certs.server_key();
    security.writer_token_file =
        certs.WriteSecret("writers", "node-a 0123456789abcdef0123456789abcdef\n");
    security.reader_token_file = certs.WriteSecret("readers", "fedcba9876543210fedcba9876543210\n");
    server_options.guard = *net::ServerGuard::Load(security, collector::CollectorMethodRoles());
    net::ClientSecurity client;
    client.ca_file = certs.ca();
    client.token_file = certs.WriteSecret("token", "0123456789abcdef0123456789abcdef\n");
    uplink_options.credentials = *net::LoadClientCredentials(client);
  }
  auto server = *collector::CollectorServer::Start(core.get(), server_options);

  agent::Outbox outbox(agent::OutboxOptions{});
  uplink_options.collector = absl::StrCat("127.0.0.1:", server->port());
  agent::Uplink uplink(&outbox, uplink_options);
  uplink.Start();

  {
    // The bytes are testing::AppendChurn's events, as the other ingest benchmarks send them.
    agent::EncodedBatch encoded = MakeBatch(testing::Key(1), 1, false);
    v1::EventBatch parsed;
    v1::EventBatch expected;
    testing::AppendChurn(&expected, kEventsPerBatch, kEventsPerBatch);
    if (!parsed.ParseFromString(absl::StrCat(encoded.events, encoded.counters)) ||
        parsed.SerializeAsString() != expected.SerializeAsString()) {
      state.SkipWithError("MakeBatch does not write testing::AppendChurn's events");
      return;
    }
  }
  uint32_t pid = 1;
  uint64_t events = 0;
  uint64_t wire_bytes = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const v1::ProcessKey key = testing::Key(pid++);
    std::vector<agent::EncodedBatch> batches;
    for (int i = 0; i < kBatchesPerIteration; ++i) {
      batches.push_back(MakeBatch(key, i, finish && i + 1 == kBatchesPerIteration));
      // What goes on the wire: the events, counters and the process key (sequence aside).
      wire_bytes +=
          batches.back().events.size() + batches.back().counters.size() + key.ByteSizeLong() + 2;
    }
    state.ResumeTiming();
    for (agent::EncodedBatch& batch : batches) outbox.Add(std::move(batch));
    if (!outbox.WaitAllAcked(absl::Seconds(120))) {
      state.SkipWithError("not acknowledged within 120 s");
      break;
    }
    events += static_cast<uint64_t>(kBatchesPerIteration) * kEventsPerBatch;
  }
  uplink.Stop();
  state.counters["events_per_second"] =
      benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
  state.counters["wire_MB_per_second"] =
      benchmark::Counter(static_cast<double>(wire_bytes) / 1e6, benchmark::Counter::kIsRate);
  state.counters["bytes_per_event"] =
      events == 0 ? 0.0 : static_cast<double>(wire_bytes) / static_cast<double>(events);
  if (core->history() != nullptr) {
    core->history()->WaitIdle(absl::Seconds(120));
    state.counters["history_rows"] = static_cast<double>(core->history()->written());
  }
}

void BM_CollectorIngest(benchmark::State& state) {
  RunCollectorIngest(state, state.range(0) != 0, "off", false);
}

// Every process finishes; the run history off (0) or in SQLite in the data directory (1).
void BM_CollectorIngestHistory(benchmark::State& state) {
  RunCollectorIngest(state, false, state.range(0) != 0 ? "" : "off", true);
}
void BM_AgentDrain(benchmark::State& state) {
  vramscope::SetMinLogLevel(vramscope::LogLevel::kError);
  constexpr uint64_t kRecords = 1 << 18;  // per iteration: 64 batches of 4096
  testing::TempDir rings;
  testing::TempDir spool;
  interposer::RingWriter writer;
  interposer::RingOpenOptions ring_options;
  ring_options.dir = rings.path().c_str();
  ring_options.capacity = kRecords;
  if (writer.Open(ring_options) != interposer::RingError::kOk) {
    state.SkipWithError("cannot open a ring");
    return;
  }
  v1::ProcessKey key;
  key.set_host(writer.header()->host);
  key.set_pid(writer.header()->pid);
  key.set_start_time_ns(writer.header()->start_time_ns);
  agent::AgentOptions options;
  options.ring_dir = rings.path();
  options.batch_events = kEventsPerBatch;
  options.uplink.collector = "127.0.0.1:1";  // nothing listens: no uplink here
  if (state.range(0) != 0) options.outbox.spool_dir = spool.path();
  agent::Agent agent(options);
  agent.Poll().IgnoreError();  // opens the ring, asks the (absent) collector once
  uint64_t events = 0;
  uint64_t n = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (uint64_t i = 0; i < kRecords; ++i, ++n) {
      const uint64_t address = 0x7f0000000000 + (n / 2 % 512) * 0x100000;
      const uint64_t bytes = 4096 + (n / 2 % 97) * 512;
      if (n % 2 == 0) {
        writer.RecordAlloc(0, address, bytes - 100, bytes, VRAMSCOPE_RING_ALLOC_POOLED);
      } else {
        writer.RecordFree(0, address, bytes - 100, bytes, VRAMSCOPE_RING_ALLOC_POOLED);
      }
    }
    state.ResumeTiming();
    absl::StatusOr<uint64_t> drained = agent.Poll();
    state.PauseTiming();
    if (!drained.ok() || *drained < kRecords) {
      state.SkipWithError("the drain did not take every record");
      break;
    }
    events += *drained;
    agent.outbox().Ack(key, agent.counters().batches_cut);  // files go on acknowledgement
    state.ResumeTiming();
  }
  state.counters["events_per_second"] =
      benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
  state.counters["spooled"] = static_cast<double>(agent.counters().batches_spooled);
}
BENCHMARK(BM_AgentDrain)->ArgName("spool")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

BENCHMARK(BM_CollectorIngestHistory)
    ->ArgName("database")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(3.0);

BENCHMARK(BM_CollectorIngest)
    ->ArgNames({"fsync", "secure"})
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({0, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(3.0);

void BM_ShimToWatchLatency(benchmark::State& state) {
  vramscope::SetMinLogLevel(vramscope::LogLevel::kError);
  testing::TempDir data;
  testing::TempDir rings;
  collector::CollectorOptions options;
  options.data_dir = data.path();
  options.fsync = false;
  auto core = *collector::Collector::Open(options);
  collector::ServerOptions server_options;
  server_options.listen = "127.0.0.1:0";
  auto server = *collector::CollectorServer::Start(core.get(), server_options);
  const std::string address = absl::StrCat("127.0.0.1:", server->port());

  interposer::RingWriter writer;
  interposer::RingOpenOptions ring_options;
  ring_options.dir = rings.path().c_str();
  if (writer.Open(ring_options) != interposer::RingError::kOk) {
    state.SkipWithError("cannot open a ring");
    return;
  }
  agent::AgentOptions agent_options;
  agent_options.ring_dir = rings.path();
  agent_options.uplink.collector = address;
  agent::Agent agent(agent_options);
  agent.StartUplink();
  std::atomic<bool> stop{false};
  std::thread poller([&] {
    while (!stop.load()) {
      (void)agent.Poll();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });

  absl::Mutex mu;
  uint64_t peak = 0;
  grpc::ClientContext context;
  v1::WatchRequest request;
  request.set_interval_ms(50);
  auto stub =
      v1::Collector::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  auto stream = stub->Watch(&context, request);
  std::thread watcher([&] {
    v1::StatsUpdate update;
    while (stream->Read(&update)) {
      for (const v1::ProcessStats& process : update.processes()) {
        for (const v1::DeviceReport& device : process.devices()) {
          absl::MutexLock lock(&mu);
          peak = std::max(peak, device.peak_allocated_bytes());
        }
      }
    }
  });

  constexpr uint64_t kBytes = 1 << 20;
  uint64_t expected = 0;
  for (auto _ : state) {
    expected += kBytes;
    const auto start = std::chrono::steady_clock::now();
    writer.RecordAlloc(0, 0x7f0000000000 + expected, kBytes, kBytes, VRAMSCOPE_RING_ALLOC_POOLED);
    absl::MutexLock lock(&mu);
    auto seen = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return peak >= expected; };
    if (!mu.AwaitWithTimeout(absl::Condition(&seen), absl::Seconds(10))) {
      state.SkipWithError("the allocation never showed in Watch");
      break;
    }
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  context.TryCancel();
  watcher.join();
  stream->Finish();
  stop.store(true);
  poller.join();
  agent.StopUplink();
  writer.Close();
}
BENCHMARK(BM_ShimToWatchLatency)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(40);

}  // namespace
}  // namespace vramscope

BENCHMARK_MAIN();
