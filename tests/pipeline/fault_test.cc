// Fault tests with the real daemons as child processes: the collector SIGKILLed and restarted on
// the same data directory and port while an agent streams (every event counted exactly once), a
// damaged data directory at start-up, the disk limit, vramscope-agent --once end to end, and the
// agent SIGKILLed with unacknowledged batches, restarted on the same --spool-dir.
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/time/clock.h>
#include <absl/time/time.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/collector/test_util.h"
#include "tests/pipeline/subprocess.h"
#include "vramscope/agent/outbox.h"
#include "vramscope/agent/uplink.h"
#include "vramscope/collector/collector.h"
#include "vramscope/collector/record_log.h"
#include "vramscope/log.h"
#include "vramscope/ring/ring_writer.h"
#include "vramscope/v1/collector.grpc.pb.h"

namespace vramscope {
namespace {

using ::testing::HasSubstr;
using ::vramscope::testing::Batch;
using ::vramscope::testing::BinaryFromEnv;
using ::vramscope::testing::Key;
using ::vramscope::testing::Subprocess;
using ::vramscope::testing::TempDir;

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    vramscope::SetMinLogLevel(vramscope::LogLevel::kError);
    collector_bin_ = BinaryFromEnv("VRAMSCOPE_COLLECTOR");
    agent_bin_ = BinaryFromEnv("VRAMSCOPE_AGENT");
    ASSERT_FALSE(collector_bin_.empty()) << "run through meson test (VRAMSCOPE_COLLECTOR unset)";
  }

  // Starts a collector on `listen` over data_; returns its port (0 on failure).
  int StartCollector(Subprocess& process, const std::string& listen,
                     std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {collector_bin_, "--listen=" + listen,
                                     "--data-dir=" + data_.path()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    EXPECT_TRUE(process.Start(argv));
    int port = process.WaitForPort();
    EXPECT_NE(port, 0) << process.output();
    return port;
  }

  std::unique_ptr<v1::Collector::Stub> Stub(int port) {
    return v1::Collector::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }

  v1::Report Report(int port, const v1::ProcessKey& key) {
    grpc::ClientContext context;
    v1::GetReportRequest request;
    *request.mutable_process() = key;
    v1::Report report;
    grpc::Status status = Stub(port)->GetReport(&context, request, &report);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return report;
  }

  // `vramscope-agent --once` over `ring_dir` into the collector on `port`, spooling to spool_;
  // its exit status (-1 when it did not start).
  int AgentOnce(Subprocess& agent, const std::string& ring_dir, int port) {
    if (!agent.Start({agent_bin_, "--once", "--once-timeout=60", "--ring-dir=" + ring_dir,
                      absl::StrCat("--collector=127.0.0.1:", port),
                      "--spool-dir=" + spool_.path()})) {
      return -1;
    }
    return agent.Wait();
  }

  // Every process the collector knows, finished ones included.
  v1::ListProcessesResponse ListAll(int port) {
    grpc::ClientContext context;
    v1::ListProcessesRequest request;
    request.set_include_finished(true);
    v1::ListProcessesResponse list;
    grpc::Status status = Stub(port)->ListProcesses(&context, request, &list);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return list;
  }

  // DropEvent records stored in the data directory's logs whose name contains `part`.
  uint64_t DroppedRecordsStored(const std::string& part) {
    uint64_t dropped = 0;
    for (const auto& entry : std::filesystem::directory_iterator(data_.path())) {
      if (entry.path().filename().string().find(part) == std::string::npos) continue;
      collector::LogScan scan;
      absl::Status read = collector::ReadLog(
          entry.path().string(),
          [&](uint64_t, absl::string_view payload) {
            v1::EventBatch batch;
            batch.ParseFromArray(payload.data(), static_cast<int>(payload.size()));
            for (const v1::Event& event : batch.events()) {
              if (event.has_drop()) dropped += event.drop().dropped_records();
            }
            return absl::OkStatus();
          },
          &scan);
      EXPECT_TRUE(read.ok()) << read;
    }
    return dropped;
  }

  // A log of `batches` batches of 5 events for `key`, written by the core in process.
  void StoreLog(const v1::ProcessKey& key, uint64_t batches) {
    collector::CollectorOptions options;
    options.data_dir = data_.path();
    auto core = *collector::Collector::Open(options);
    for (uint64_t seq = 1; seq <= batches; ++seq)
      ASSERT_TRUE(core->Ingest(Batch(key, seq, 5)).ok());
  }

  // Starts a collector over data_ and asks it for `key`'s report (expecting `events` events):
  // the time from the start until that was answered. Waits at most 5 s for the port.
  absl::Duration StartAndServe(Subprocess& process, const v1::ProcessKey& key, uint64_t events) {
    const absl::Time start = absl::Now();
    EXPECT_TRUE(
        process.Start({collector_bin_, "--listen=127.0.0.1:0", "--data-dir=" + data_.path()}));
    if (!process.WaitForOutput("(port ", absl::Seconds(5))) {
      ADD_FAILURE() << "no port after 5 s: " << process.output();
      return absl::InfiniteDuration();
    }
    EXPECT_EQ(Report(process.WaitForPort(), key).events(), events);
    return absl::Now() - start;
  }

  static constexpr uint32_t kBusyProcesses = 200;
  static constexpr uint64_t kBusyBatches = 10;
  static constexpr int kBusyEvents = 500;

  std::string collector_bin_;
  std::string agent_bin_;
  TempDir data_;
  TempDir spool_;
};

TEST_F(FaultTest, CollectorKilledAndRestartedWhileTheAgentStreams) {
  Subprocess first;
  const int port = StartCollector(first, "127.0.0.1:0");
  ASSERT_NE(port, 0);
  const std::string address = absl::StrCat("127.0.0.1:", port);

  agent::OutboxOptions outbox_options;
  outbox_options.spool_dir = spool_.path();
  agent::Outbox outbox(outbox_options);
  agent::UplinkOptions uplink_options;
  uplink_options.collector = address;
  uplink_options.initial_backoff = absl::Milliseconds(20);
  uplink_options.max_backoff = absl::Milliseconds(200);
  agent::Uplink uplink(&outbox, uplink_options);
  uplink.Start();

  const std::vector<v1::ProcessKey> keys = {Key(501), Key(502), Key(503)};
  constexpr int kBatches = 300;
  constexpr int kEvents = 200;
  int added = 0;
  auto add = [&](int count) {
    for (int i = 0; i < count; ++i, ++added) {
      const v1::ProcessKey& key = keys[static_cast<size_t>(added) % keys.size()];
      ASSERT_TRUE(outbox.Add(Batch(key, static_cast<uint64_t>(added) / keys.size() + 1, kEvents,
                                   0x100000 * static_cast<uint64_t>(added))));
    }
  };
  //   agent:      add 100 ... acked 50 | add 20, KILL | add 80 (spooled) | START  ... acked 150 |
  //   collector:  first ------------------X                                second ----------------
  //   agent:      add 20, KILL | add 80 (spooled) | START | all acked
  //   collector:  ------X                            third -----------
  // Each kill lands while batches are in flight: written, maybe stored, not yet acknowledged.
  add(100);
  ASSERT_TRUE(outbox.WaitAcked(50, absl::Seconds(30)));
  add(20);
  first.Kill(SIGKILL);
  EXPECT_EQ(first.Wait(), 128 + SIGKILL);
  add(80);
  Subprocess second;
  ASSERT_EQ(StartCollector(second, address), port);
  ASSERT_TRUE(outbox.WaitAcked(150, absl::Seconds(30))) << second.output();
  add(20);
  second.Kill(SIGKILL);
  EXPECT_EQ(second.Wait(), 128 + SIGKILL);
  add(80);
  ASSERT_EQ(added, kBatches);
  Subprocess third;
  ASSERT_EQ(StartCollector(third, address), port);
  ASSERT_TRUE(outbox.WaitAllAcked(absl::Seconds(60))) << third.output();
  uplink.Stop();

  const agent::AgentCounters counters = outbox.counters();
  EXPECT_EQ(counters.batches_acked, static_cast<uint64_t>(kBatches));
  EXPECT_EQ(counters.batches_dropped, 0u);
  EXPECT_GT(counters.batches_spooled, 0u);  // while no collector was up
  EXPECT_GE(counters.reconnects, 2u);
  EXPECT_EQ(counters.spool_bytes, 0u);
  RecordProperty("batches_resent", static_cast<int>(counters.batches_resent));

  uint64_t total = 0;
  for (const v1::ProcessKey& key : keys) {
    v1::Report report = Report(port, key);
    EXPECT_EQ(report.events(), static_cast<uint64_t>(kBatches / keys.size() * kEvents));
    total += report.events();
  }
  EXPECT_EQ(total, static_cast<uint64_t>(kBatches * kEvents));
  EXPECT_THAT(third.output(), HasSubstr("loaded 3 process logs"));
  third.Kill(SIGTERM);
  EXPECT_EQ(third.Wait(), 0);
}

TEST_F(FaultTest, DamagedDataDirectoryIsReportedAndTheRestLoads) {
  {
    collector::CollectorOptions options;
    options.data_dir = data_.path();
    auto core = *collector::Collector::Open(options);
    for (uint64_t seq = 1; seq <= 3; ++seq) ASSERT_TRUE(core->Ingest(Batch(Key(601), seq, 5)).ok());
    ASSERT_TRUE(core->Ingest(Batch(Key(602), 1, 7)).ok());
  }
  // A torn last record in one log, a file that is not a log at all.
  for (const auto& entry : std::filesystem::directory_iterator(data_.path())) {
    if (entry.path().string().find("_601_") == std::string::npos) continue;
    std::string torn = collector::FrameRecord(Batch(Key(601), 4, 5).SerializeAsString());
    testing::WriteFile(entry.path().string(),
                       testing::ReadFile(entry.path().string()) + torn.substr(0, 20));
  }
  testing::WriteFile(data_.path() + "/garbage.vslog", "definitely not a log");

  Subprocess process;
  const int port = StartCollector(process, "127.0.0.1:0");
  ASSERT_NE(port, 0);
  const std::string log = process.output();
  EXPECT_THAT(log, HasSubstr("truncated the torn tail"));
  EXPECT_THAT(log, HasSubstr("garbage.vslog: not a vramscope log"));
  EXPECT_THAT(log, HasSubstr("loaded 2 process logs"));
  EXPECT_EQ(Report(port, Key(601)).events(), 15u);
  EXPECT_EQ(Report(port, Key(602)).events(), 7u);
  process.Kill(SIGTERM);
  EXPECT_EQ(process.Wait(), 0);
}

// A FIFO named like a log: opening it for reading would wait for a writer forever, and with it
// the collector, deaf to SIGTERM.
TEST_F(FaultTest, FifoInTheDataDirectoryIsSkipped) {
  StoreLog(Key(801), 3);
  ASSERT_EQ(::mkfifo((data_.path() + "/x.vslog").c_str(), 0600), 0);
  Subprocess process;
  const absl::Duration took = StartAndServe(process, Key(801), 15);
  ASSERT_LT(took, absl::Seconds(1)) << process.output();  // else SIGKILLed on return
  EXPECT_THAT(process.output(), HasSubstr("x.vslog: not a regular file (a FIFO)"));
  process.Kill(SIGTERM);
  EXPECT_EQ(process.Wait(), 0);
}

// 8 GiB that are one hole after the magic: the tail is damage (a zero record), and setting it
// aside must not write its zeros out (that took 37 s and 8 GiB of disk).
TEST_F(FaultTest, SparseLogOfEightGibIsSetAsideAtOnce) {
  StoreLog(Key(802), 2);
  const std::string sparse = data_.path() + "/sparse.vslog";
  testing::WriteFile(sparse, std::string(collector::kLogMagic));
  ASSERT_EQ(::truncate(sparse.c_str(), off_t{8} << 30), 0);
  Subprocess process;
  const absl::Duration took = StartAndServe(process, Key(802), 10);
  ASSERT_LT(took, absl::Seconds(1)) << process.output();  // else SIGKILLed on return
  EXPECT_THAT(process.output(), HasSubstr("sparse.vslog: corrupt record at offset 8"));
  EXPECT_THAT(process.output(), HasSubstr("kept sparse"));
  EXPECT_LT(testing::DiskUsage(data_.path()), uint64_t{1} << 20);
  process.Kill(SIGTERM);
  EXPECT_EQ(process.Wait(), 0);
}

// SIGTERM already pending when the collector starts (blocked in the parent, so it survives the
// exec): handled before recovery, nothing served.
TEST_F(FaultTest, SignalPendingAtStartStopsBeforeRecovery) {
  StoreLog(Key(803), 2);
  sigset_t term;
  sigset_t old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &term, &old), 0);
  Subprocess process;
  const bool started =
      process.Start({collector_bin_, "--listen=127.0.0.1:0", "--data-dir=" + data_.path()});
  if (started) process.Kill(SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, &old, nullptr), 0);
  ASSERT_TRUE(started);
  EXPECT_EQ(process.Wait(), 0);
  EXPECT_THAT(process.output(), HasSubstr("signal 15 before start: exiting"));
  EXPECT_THAT(process.output(), ::testing::Not(HasSubstr("serving on")));
}

// SIGTERM while recovery is busy with many logs: the collector exits at once, exit code 0,
// without serving first.
TEST_F(FaultTest, SignalDuringRecoveryExitsPromptly) {
  {
    collector::CollectorOptions options;
    options.data_dir = data_.path();
    auto core = *collector::Collector::Open(options);
    for (uint32_t pid = 1000; pid < 1000 + kBusyProcesses; ++pid) {
      for (uint64_t seq = 1; seq <= kBusyBatches; ++seq) {
        ASSERT_TRUE(core->Ingest(Batch(Key(pid), seq, kBusyEvents)).ok());
      }
    }
  }
  Subprocess process;
  ASSERT_TRUE(
      process.Start({collector_bin_, "--listen=127.0.0.1:0", "--data-dir=" + data_.path()}));
  ASSERT_TRUE(process.WaitForOutput("recovering", absl::Seconds(5))) << process.output();
  process.Kill(SIGTERM);
  const absl::Time signalled = absl::Now();
  EXPECT_EQ(process.Wait(), 0);
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(1));
  EXPECT_THAT(process.output(), HasSubstr("signal 15 during recovery: exiting"));
  EXPECT_THAT(process.output(), ::testing::Not(HasSubstr("serving on")));
}

TEST_F(FaultTest, DiskLimitRefusesThenAResartWithRoomTakesEverything) {
  Subprocess small;
  const int port = StartCollector(small, "127.0.0.1:0", {"--max-disk-bytes=20K"});
  ASSERT_NE(port, 0);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  agent::Outbox outbox(agent::OutboxOptions{});
  agent::UplinkOptions uplink_options;
  uplink_options.collector = address;
  uplink_options.initial_backoff = absl::Milliseconds(20);
  uplink_options.max_backoff = absl::Milliseconds(100);
  agent::Uplink uplink(&outbox, uplink_options);
  uplink.Start();
  for (uint64_t seq = 1; seq <= 20; ++seq) ASSERT_TRUE(outbox.Add(Batch(Key(701), seq, 100)));
  EXPECT_FALSE(outbox.WaitAllAcked(absl::Milliseconds(500)));
  EXPECT_TRUE(small.WaitForOutput("--max-disk-bytes=20480"));
  EXPECT_EQ(uplink.last_error().code(), absl::StatusCode::kResourceExhausted)
      << uplink.last_error();
  const uint64_t stored = Report(port, Key(701)).events();  // still up, still serving
  EXPECT_GT(stored, 0u);
  EXPECT_LT(stored, 2000u);
  small.Kill(SIGTERM);
  EXPECT_EQ(small.Wait(), 0);

  Subprocess large;
  ASSERT_EQ(StartCollector(large, address, {"--max-disk-bytes=10M"}), port);
  ASSERT_TRUE(outbox.WaitAllAcked(absl::Seconds(30)));
  uplink.Stop();
  EXPECT_EQ(Report(port, Key(701)).events(), 2000u);
}

TEST_F(FaultTest, AgentOnceDrainsRingsAndExits) {
  if (agent_bin_.empty()) GTEST_SKIP() << "VRAMSCOPE_AGENT unset";
  TempDir rings;
  // The traced "application": a child that writes its ring and exits, as the shim would.
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    interposer::RingWriter writer;
    interposer::RingOpenOptions ring_options;
    ring_options.dir = rings.path().c_str();
    if (writer.Open(ring_options) != interposer::RingError::kOk) ::_exit(1);
    for (uint64_t i = 0; i < 5000; ++i) {
      writer.RecordAlloc(0, 0x7f0000000000 + i * 4096, 4000, 4096, VRAMSCOPE_RING_ALLOC_POOLED);
    }
    for (uint64_t i = 0; i < 5000; ++i) {
      writer.RecordFree(0, 0x7f0000000000 + i * 4096, 4000, 4096, VRAMSCOPE_RING_ALLOC_POOLED);
    }
    writer.MarkExited(7);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  Subprocess collector;
  const int port = StartCollector(collector, "127.0.0.1:0");
  ASSERT_NE(port, 0);
  Subprocess agent;
  ASSERT_TRUE(agent.Start({agent_bin_, "--once", "--ring-dir=" + rings.path(),
                           absl::StrCat("--collector=127.0.0.1:", port), "--batch-events=1000"}));
  EXPECT_EQ(agent.Wait(), 0) << agent.output();

  const v1::ListProcessesResponse list = ListAll(port);
  ASSERT_EQ(list.processes_size(), 1);
  EXPECT_EQ(list.processes(0).process().pid(), static_cast<uint32_t>(child));
  v1::Report report = Report(port, list.processes(0).process());
  // ProcessStart, 10000 records, ProcessExit.
  EXPECT_EQ(report.events(), 10002u) << agent.output();
  EXPECT_TRUE(report.finished());
  EXPECT_EQ(report.exit_code(), 7);
  ASSERT_EQ(report.devices_size(), 1);
  EXPECT_EQ(report.devices(0).peak_allocated_bytes(), 5000u * 4096);
  EXPECT_EQ(report.devices(0).current_allocated_bytes(), 0u);
  // Drained and its writer gone: the agent removed the ring.
  EXPECT_TRUE(std::filesystem::is_empty(rings.path()));
  collector.Kill(SIGTERM);
  collector.Wait();
}

TEST_F(FaultTest, AgentKilledAndRestartedContinuesWithoutDuplicates) {
  if (agent_bin_.empty()) GTEST_SKIP() << "VRAMSCOPE_AGENT unset";
  TempDir rings;
  // This test process is the traced application: it keeps writing while agents come and go.
  interposer::RingWriter writer;
  interposer::RingOpenOptions ring_options;
  ring_options.dir = rings.path().c_str();
  ASSERT_EQ(writer.Open(ring_options), interposer::RingError::kOk);
  v1::ProcessKey key;
  key.set_host(writer.header()->host);
  key.set_pid(writer.header()->pid);
  key.set_start_time_ns(writer.header()->start_time_ns);
  auto write = [&](uint64_t from, uint64_t count) {
    for (uint64_t i = from; i < from + count; ++i) {
      ASSERT_TRUE(writer.RecordAlloc(0, 0x7f0000000000 + i * 4096, 4000, 4096,
                                     VRAMSCOPE_RING_ALLOC_POOLED));
    }
  };
  Subprocess collector;
  const int port = StartCollector(collector, "127.0.0.1:0");
  ASSERT_NE(port, 0);
  const std::vector<std::string> agent_argv = {agent_bin_, "--ring-dir=" + rings.path(),
                                               absl::StrCat("--collector=127.0.0.1:", port),
                                               "--poll-interval-ms=5"};
  // The collector is another process: polling it is the only way to see what it holds.
  auto wait_for_allocs = [&](uint64_t allocs) {
    for (int i = 0; i < 1000; ++i) {
      grpc::ClientContext context;
      v1::GetReportRequest request;
      *request.mutable_process() = key;
      v1::Report report;
      if (Stub(port)->GetReport(&context, request, &report).ok() && report.devices_size() == 1 &&
          report.devices(0).alloc_count() >= allocs) {
        return report.devices(0).alloc_count();
      }
      ::usleep(20000);
    }
    return uint64_t{0};
  };

  write(0, 1000);
  Subprocess first;
  ASSERT_TRUE(first.Start(agent_argv));
  ASSERT_EQ(wait_for_allocs(1000), 1000u) << first.output();
  first.Kill(SIGKILL);
  EXPECT_EQ(first.Wait(), 128 + SIGKILL);

  write(1000, 1000);  // the application goes on; nobody reads the ring meanwhile
  Subprocess second;
  ASSERT_TRUE(second.Start(agent_argv));
  // The new agent asks the collector where the first one ended and numbers its batches after
  // that: nothing is taken for a duplicate, nothing is counted twice.
  ASSERT_EQ(wait_for_allocs(2000), 2000u) << second.output();
  EXPECT_THAT(second.output(), HasSubstr("continuing after them"));
  second.Kill(SIGTERM);
  EXPECT_EQ(second.Wait(), 0);
  v1::Report report = Report(port, key);
  ASSERT_EQ(report.devices_size(), 1);
  EXPECT_EQ(report.devices(0).alloc_count(), 2000u);
  EXPECT_EQ(report.devices(0).peak_allocated_bytes(), 2000u * 4096);
  writer.Close();
  collector.Kill(SIGTERM);
  collector.Wait();
}

TEST_F(FaultTest, AgentKilledWithUnacknowledgedBatchesLosesNothingWithASpool) {
  if (agent_bin_.empty()) GTEST_SKIP() << "VRAMSCOPE_AGENT unset";
  TempDir rings;
  interposer::RingWriter writer;  // this test process is the traced application
  interposer::RingOpenOptions ring_options;
  ring_options.dir = rings.path().c_str();
  ASSERT_EQ(writer.Open(ring_options), interposer::RingError::kOk);
  v1::ProcessKey key;
  key.set_host(writer.header()->host);
  key.set_pid(writer.header()->pid);
  key.set_start_time_ns(writer.header()->start_time_ns);
  constexpr uint64_t kAllocs = 3000;
  constexpr uint64_t kFrees = 1000;
  auto alloc = [&](uint64_t from, uint64_t to) {
    for (uint64_t i = from; i < to; ++i) {
      ASSERT_TRUE(writer.RecordAlloc(0, 0x7f0000000000 + i * 4096, 4000, 4096,
                                     VRAMSCOPE_RING_ALLOC_POOLED));
    }
  };
  // Waits (bounded) until an agent has taken every record out of the ring.
  auto drained = [&] {
    for (int i = 0; i < 2000; ++i) {
      if (__atomic_load_n(&writer.header()->tail, __ATOMIC_ACQUIRE) ==
          __atomic_load_n(&writer.header()->head, __ATOMIC_ACQUIRE)) {
        return true;
      }
      ::usleep(10000);
    }
    return false;
  };
  Subprocess collector;
  const int port = StartCollector(collector, "127.0.0.1:0");
  ASSERT_NE(port, 0);
  const std::vector<std::string> agent_argv = {agent_bin_,
                                               "--ring-dir=" + rings.path(),
                                               absl::StrCat("--collector=127.0.0.1:", port),
                                               "--poll-interval-ms=5",
                                               "--batch-events=200",
                                               "--spool-dir=" + spool_.path()};

  //   app:        alloc 0..1000 | alloc 1000..3000, free 0..1000 |                   |
  //   agent 1:    drain, acked  | drain, spool, no acks ......X (SIGKILL)             |
  //   agent 2:                                                  | replay, drain, acked
  //   collector:  up ----------- STOPPED (SIGSTOP) ------------- CONT --------------------
  alloc(0, 1000);
  Subprocess first;
  ASSERT_TRUE(first.Start(agent_argv));
  ASSERT_TRUE(drained()) << first.output();
  ASSERT_TRUE(first.WaitForOutput("draining"));
  collector.Kill(SIGSTOP);
  alloc(1000, kAllocs);
  for (uint64_t i = 0; i < kFrees; ++i) {
    ASSERT_TRUE(
        writer.RecordFree(0, 0x7f0000000000 + i * 4096, 4000, 4096, VRAMSCOPE_RING_ALLOC_POOLED));
  }
  ASSERT_TRUE(drained()) << first.output();  // out of the ring, not acknowledged
  first.Kill(SIGKILL);
  EXPECT_EQ(first.Wait(), 128 + SIGKILL);
  collector.Kill(SIGCONT);
  size_t spooled = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(spool_.path())) {
    ++spooled;
  }
  EXPECT_GT(spooled, 0u);

  Subprocess second;
  ASSERT_TRUE(second.Start(agent_argv));
  // Bounded wait for the collector to hold every allocation and free.
  v1::Report report;
  for (int i = 0; i < 1000; ++i) {
    grpc::ClientContext context;
    v1::GetReportRequest request;
    *request.mutable_process() = key;
    if (Stub(port)->GetReport(&context, request, &report).ok() && report.devices_size() == 1 &&
        report.devices(0).alloc_count() + report.devices(0).free_count() >= kAllocs + kFrees) {
      break;
    }
    ::usleep(20000);
  }
  second.Kill(SIGTERM);  // it waits for the acknowledgements of what is in flight
  EXPECT_EQ(second.Wait(), 0);
  EXPECT_THAT(second.output(), HasSubstr("batches queued to send first"));
  report = Report(port, key);
  ASSERT_EQ(report.devices_size(), 1) << second.output();
  EXPECT_EQ(report.devices(0).alloc_count(), kAllocs) << second.output();
  EXPECT_EQ(report.devices(0).free_count(), kFrees);
  EXPECT_EQ(report.devices(0).peak_allocated_bytes(), kAllocs * 4096);
  EXPECT_EQ(report.devices(0).current_allocated_bytes(), (kAllocs - kFrees) * 4096);
  // Every record once, plus one ProcessStart per agent's reader.
  EXPECT_EQ(report.events(), kAllocs + kFrees + 2);
  EXPECT_TRUE(std::filesystem::is_empty(spool_.path()));
  writer.Close();
  collector.Kill(SIGTERM);
  collector.Wait();
}

TEST_F(FaultTest, DamagedSpoolFilesAreReportedAndTheAgentGoesOn) {
  if (agent_bin_.empty()) GTEST_SKIP() << "VRAMSCOPE_AGENT unset";
  // An earlier run's spool: batch 1 of process 4242 (garbage inside), batch 1 of process 4243
  // (cut short), and a file that is no spool file at all.
  {
    agent::OutboxOptions options;
    options.spool_dir = spool_.path();
    agent::Outbox outbox(options);
    ASSERT_TRUE(outbox.Add(Batch(Key(4242), 0, 30)));
    ASSERT_TRUE(outbox.Add(Batch(Key(4243), 0, 40)));
  }
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(spool_.path())) {
    files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  ASSERT_EQ(files.size(), 2u);
  testing::WriteFile(files[0], std::string(500, 'x'));
  std::filesystem::resize_file(files[1], 100);
  testing::WriteFile(spool_.path() + "/notes.batch", "not a batch");

  TempDir rings;
  interposer::RingWriter writer;
  interposer::RingOpenOptions ring_options;
  ring_options.dir = rings.path().c_str();
  ASSERT_EQ(writer.Open(ring_options), interposer::RingError::kOk);
  for (uint64_t i = 0; i < 10; ++i) {
    ASSERT_TRUE(writer.RecordAlloc(0, 0x1000 + i * 512, 500, 512, VRAMSCOPE_RING_ALLOC_POOLED));
  }
  writer.MarkExited(0);
  writer.Close();
  Subprocess collector;
  const int port = StartCollector(collector, "127.0.0.1:0");
  ASSERT_NE(port, 0);
  Subprocess agent;
  ASSERT_TRUE(
      agent.Start({agent_bin_, "--once", "--ring-dir=" + rings.path(),
                   absl::StrCat("--collector=127.0.0.1:", port), "--spool-dir=" + spool_.path()}));
  EXPECT_EQ(agent.Wait(), 0) << agent.output();
  const std::string log = agent.output();
  for (const std::string& file : {files[0], files[1], spool_.path() + "/notes.batch"}) {
    EXPECT_THAT(log, HasSubstr("spool file " + file + " of an earlier run is unusable"));
    EXPECT_TRUE(std::filesystem::exists(file + ".corrupt")) << file;
  }
  EXPECT_THAT(log, HasSubstr("unusable spool files 3"));
  // The lost batches reach the collector as counted drops under their own sequence numbers;
  // the ring's process is delivered whole.
  const v1::ListProcessesResponse list = ListAll(port);
  ASSERT_EQ(list.processes_size(), 3);
  for (const v1::ProcessSummary& process : list.processes()) {
    if (process.process().pid() == static_cast<uint32_t>(::getpid())) {
      EXPECT_EQ(process.events(), 12u);  // ProcessStart, 10 allocations, ProcessExit
    }
  }
  collector.Kill(SIGTERM);
  collector.Wait();
  EXPECT_EQ(DroppedRecordsStored("_4242_"), 30u);
  EXPECT_EQ(DroppedRecordsStored("_4243_"), 40u);
}

// A traced "application" in a child process: opens a ring in `dir`, lets `hostile` scribble on
// its header (as a process with odd bytes in its name, or a hostile one, can), writes `allocs`
// allocations inside an NVTX range named `range`, and exits. Returns its pid (0 on failure).
pid_t WriteRingInChild(const std::string& dir,
                       const std::function<void(vramscope_ring_header*)>& hostile, int allocs,
                       const std::string& range) {
  pid_t child = ::fork();
  if (child != 0) {
    int status = 0;
    if (child < 0 || ::waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
      return 0;
    }
    return child;
  }
  interposer::RingWriter writer;
  interposer::RingOpenOptions ring_options;
  ring_options.dir = dir.c_str();
  if (writer.Open(ring_options) != interposer::RingError::kOk) ::_exit(1);
  // The writer's own mapping of its header.
  if (hostile) hostile(const_cast<vramscope_ring_header*>(writer.header()));
  writer.SetDeviceInfo(0, "GPU", nullptr, 1 << 30);
  if (!writer.RecordNvtxPush(0, 1, 0, 0, range.data(), range.size(), nullptr, 0)) ::_exit(1);
  for (int i = 0; i < allocs; ++i) {
    if (!writer.RecordAlloc(0, 0x7f0000000000 + static_cast<uint64_t>(i) * 4096, 4000, 4096,
                            VRAMSCOPE_RING_ALLOC_POOLED, 0, 1)) {
      ::_exit(1);
    }
  }
  writer.RecordNvtxPop(0, 1);
  writer.MarkExited(0);
  ::_exit(0);
}

void SetHeaderText(const char* text, size_t size, char* field, size_t capacity) {
  memset(field, 0, capacity);
  memcpy(field, text, std::min(size, capacity));
}

TEST_F(FaultTest, HostileStringsArriveEscapedBesideANormalProcess) {
  if (agent_bin_.empty()) GTEST_SKIP() << "VRAMSCOPE_AGENT unset";
  TempDir rings;
  const pid_t normal = WriteRingInChild(rings.path(), nullptr, 300, "step");
  ASSERT_NE(normal, 0);
  // A program run on a Latin-1 file name, on a host whose name is not UTF-8, with a GPU name
  // and an NVTX range name that are not either.
  const pid_t hostile = WriteRingInChild(
      rings.path(),
      [](vramscope_ring_header* header) {
        const char args[] = "./convert\0out\xE9.txt";
        SetHeaderText(args, sizeof(args) - 1, header->command_line, sizeof(header->command_line));
        header->command_line_len = sizeof(args) - 1;
        SetHeaderText("node\xFF", 5, header->host, sizeof(header->host));
      },
      200, "load \xE9t\xE9");
  ASSERT_NE(hostile, 0);
  Subprocess collector;
  const int port = StartCollector(collector, "127.0.0.1:0");
  ASSERT_NE(port, 0);
  Subprocess agent;
  EXPECT_EQ(AgentOnce(agent, rings.path(), port), 0) << agent.output();

  const v1::ListProcessesResponse list = ListAll(port);
  ASSERT_EQ(list.processes_size(), 2) << agent.output();
  for (const v1::ProcessSummary& process : list.processes()) {
    v1::Report report = Report(port, process.process());
    ASSERT_EQ(report.devices_size(), 1);
    ASSERT_EQ(report.devices(0).nvtx_ranges_size(), 1);
    if (process.process().pid() == static_cast<uint32_t>(normal)) {
      EXPECT_EQ(report.events(), 304u);  // ProcessStart, push, 300 allocations, pop, exit
      EXPECT_EQ(report.devices(0).nvtx_ranges(0).name(), "step");
      continue;
    }
    ASSERT_EQ(process.process().pid(), static_cast<uint32_t>(hostile));
    EXPECT_EQ(report.events(), 204u);
    // The host is the agent's own (ring_reader.h), never the header's bytes.
    EXPECT_EQ(process.process().host(), list.processes(0).process().host());
    EXPECT_THAT(report.command_line(), ::testing::ElementsAre("./convert", "out\\xE9.txt"));
    EXPECT_EQ(report.devices(0).nvtx_ranges(0).name(), "load \\xE9t\\xE9");
    EXPECT_EQ(report.devices(0).nvtx_ranges(0).alloc_count(), 200u);
  }
  EXPECT_THAT(agent.output(), HasSubstr("rejected 0 (0 events, 0 processes)"));
  EXPECT_FALSE(std::filesystem::exists(spool_.path() + "/rejected"));
  collector.Kill(SIGTERM);
  collector.Wait();
}

TEST_F(FaultTest, ARingClaimingPid0IsSkippedAndStallsNoOne) {
  // The collector refuses pid 0 (no process has it); the agent knows as much from the header and
  // skips the ring (identity mismatch), so the other process is delivered whole and --once ends 0.
  if (agent_bin_.empty()) GTEST_SKIP() << "VRAMSCOPE_AGENT unset";
  TempDir rings;
  const pid_t bogus = WriteRingInChild(
      rings.path(), [](vramscope_ring_header* header) { header->pid = 0; }, 100, "bogus");
  ASSERT_NE(bogus, 0);
  const pid_t normal = WriteRingInChild(rings.path(), nullptr, 500, "step");
  ASSERT_NE(normal, 0);
  Subprocess collector;
  const int port = StartCollector(collector, "127.0.0.1:0");
  ASSERT_NE(port, 0);
  Subprocess agent;
  EXPECT_EQ(AgentOnce(agent, rings.path(), port), 0) << agent.output();
  const std::string log = agent.output();
  EXPECT_THAT(log, HasSubstr("the header claims pid 0"));
  EXPECT_THAT(log, HasSubstr("skipped 1 damaged 0 identity-mismatch 1"));

  const v1::ListProcessesResponse list = ListAll(port);
  ASSERT_EQ(list.processes_size(), 1);
  EXPECT_EQ(list.processes(0).process().pid(), static_cast<uint32_t>(normal));
  EXPECT_EQ(Report(port, list.processes(0).process()).events(), 504u);
  collector.Kill(SIGTERM);
  collector.Wait();
}

TEST_F(FaultTest, AgentOnceWithoutACollectorExits3) {
  if (agent_bin_.empty()) GTEST_SKIP() << "VRAMSCOPE_AGENT unset";
  TempDir rings;
  interposer::RingWriter writer;
  interposer::RingOpenOptions ring_options;
  ring_options.dir = rings.path().c_str();
  ASSERT_EQ(writer.Open(ring_options), interposer::RingError::kOk);
  ASSERT_TRUE(writer.RecordAlloc(0, 0x1000, 10, 512, VRAMSCOPE_RING_ALLOC_POOLED));
  writer.MarkExited(0);
  writer.Close();
  Subprocess agent;
  ASSERT_TRUE(agent.Start({agent_bin_, "--once", "--ring-dir=" + rings.path(),
                           "--collector=127.0.0.1:1", "--once-timeout=1"}));
  EXPECT_EQ(agent.Wait(), 3);
  EXPECT_THAT(agent.output(), HasSubstr("cannot reach the collector at 127.0.0.1:1"));
}

TEST_F(FaultTest, UsageErrorsExit2) {
  Subprocess collector;
  ASSERT_TRUE(collector.Start({collector_bin_, "--no-such-flag=1"}));
  EXPECT_EQ(collector.Wait(), 2);
  EXPECT_THAT(collector.output(), HasSubstr("unknown flag --no-such-flag"));
  if (agent_bin_.empty()) return;
  Subprocess agent;
  ASSERT_TRUE(agent.Start({agent_bin_, "--batch-events=0"}));
  EXPECT_EQ(agent.Wait(), 2);
  TempDir base;
  testing::WriteFile(base.path() + "/file", "not a directory");
  Subprocess spool;
  ASSERT_TRUE(spool.Start(
      {agent_bin_, "--ring-dir=" + base.path(), "--spool-dir=" + base.path() + "/file/spool"}));
  EXPECT_EQ(spool.Wait(), 2);
  EXPECT_THAT(spool.output(), HasSubstr("cannot create the spool directory"));
}

TEST_F(FaultTest, RefusedStringsDoNotFloodTheCollectorsLog) {
  // protobuf logs an ERROR line for every message with a string that is not UTF-8; the collector
  // logs each refusal itself (with the process and the field), so protobuf's lines are dropped.
  Subprocess collector;
  const int port = StartCollector(collector, "127.0.0.1:0");
  ASSERT_NE(port, 0);
  agent::OutboxOptions outbox_options;
  outbox_options.spool_dir = spool_.path();
  agent::Outbox outbox(outbox_options);
  agent::UplinkOptions uplink_options;
  uplink_options.collector = absl::StrCat("127.0.0.1:", port);
  agent::Uplink uplink(&outbox, uplink_options);
  uplink.Start();
  for (uint32_t pid = 801; pid <= 820; ++pid) {
    v1::EventBatch bad = Batch(Key(pid), 1, 3);
    bad.mutable_events(0)->mutable_process_start()->add_command_line("out\xE9.txt");
    ASSERT_TRUE(outbox.Add(std::move(bad)));
  }
  ASSERT_TRUE(outbox.Add(Batch(Key(821), 1, 7)));
  ASSERT_TRUE(outbox.WaitAllAcked(absl::Seconds(30)));
  uplink.Stop();
  EXPECT_EQ(outbox.counters().batches_rejected, 20u);
  // Each refused batch is kept aside with its reason (.batch and .reason files).
  size_t kept = 0;
  for (const auto& entry : std::filesystem::directory_iterator(spool_.path() + "/rejected")) {
    kept += entry.path().extension() == ".reason" &&
            absl::StrContains(testing::ReadFile(entry.path().string()), "is not valid UTF-8");
  }
  EXPECT_EQ(kept, 20u);
  EXPECT_EQ(Report(port, Key(821)).events(), 7u);
  collector.Kill(SIGTERM);
  EXPECT_EQ(collector.Wait(), 0);
  const std::string log = collector.output();
  EXPECT_THAT(log, HasSubstr("is not valid UTF-8"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("libprotobuf"))) << log;
}

}  // namespace
}  // namespace vramscope
