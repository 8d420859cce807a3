// Agent and collector in one process, the collector served on a loopback port: spooling while
// the collector is unreachable, counted and reported drops when the spool is full, renumbering
// after an earlier agent, rings found after start, other users' rings left alone, an agent
// that died between spooling a batch and moving the ring's tail, a ring truncated under the
// agent, and a ring header that claims another process.
#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "drain/ring_reader.h"
#include "tests/collector/test_util.h"
#include "vramscope/agent/agent.h"
#include "vramscope/agent/outbox.h"
#include "vramscope/agent/uplink.h"
#include "vramscope/collector/collector.h"
#include "vramscope/collector/record_log.h"
#include "vramscope/collector/service.h"
#include "vramscope/log.h"
#include "vramscope/ring/ring_writer.h"

namespace vramscope {
namespace {

using ::vramscope::testing::Batch;
using ::vramscope::testing::Key;
using ::vramscope::testing::TempDir;

size_t FilesIn(const std::string& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

class PipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    vramscope::SetMinLogLevel(vramscope::LogLevel::kError);
    collector::CollectorOptions options;
    options.data_dir = data_.path();
    options.fsync = false;
    core_ = *collector::Collector::Open(options);
  }

  // Serves the collector on `port` (0: any); returns the port.
  int Serve(int port = 0) {
    collector::ServerOptions options;
    options.listen = absl::StrCat("127.0.0.1:", port);
    absl::StatusOr<std::unique_ptr<collector::CollectorServer>> server =
        collector::CollectorServer::Start(core_.get(), options);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return 0;
    server_ = std::move(*server);
    return server_->port();
  }

  // A loopback port with nothing listening (yet).
  int ReservePort() {
    int port = Serve();
    server_->Shutdown();
    server_.reset();
    return port;
  }

  static agent::UplinkOptions Fast(int port) {
    agent::UplinkOptions options;
    options.collector = absl::StrCat("127.0.0.1:", port);
    options.initial_backoff = absl::Milliseconds(10);
    options.max_backoff = absl::Milliseconds(100);
    return options;
  }

  uint64_t DroppedRecordsStored() {
    uint64_t dropped = 0;
    for (const auto& entry : std::filesystem::directory_iterator(data_.path())) {
      collector::LogScan scan;
      EXPECT_TRUE(collector::ReadLog(
                      entry.path().string(),
                      [&](uint64_t, absl::string_view payload) {
                        v1::EventBatch batch;
                        batch.ParseFromArray(payload.data(), static_cast<int>(payload.size()));
                        for (const v1::Event& event : batch.events()) {
                          if (event.has_drop()) dropped += event.drop().dropped_records();
                        }
                        return absl::OkStatus();
                      },
                      &scan)
                      .ok());
    }
    return dropped;
  }

  TempDir data_;
  TempDir spool_;
  std::unique_ptr<collector::Collector> core_;
  std::unique_ptr<collector::CollectorServer> server_;
};

TEST_F(PipelineTest, SpoolsWhileTheCollectorIsUnreachableThenDeliversEverything) {
  const int port = ReservePort();
  agent::OutboxOptions options;
  options.spool_dir = spool_.path();
  agent::Outbox outbox(options);
  agent::Uplink uplink(&outbox, Fast(port));
  uplink.Start();
  for (uint64_t seq = 1; seq <= 30; ++seq) ASSERT_TRUE(outbox.Add(Batch(Key(801), seq, 100)));
  agent::AgentCounters counters = outbox.counters();
  EXPECT_EQ(counters.batches_spooled, 30u);
  EXPECT_GT(counters.memory_bytes, 0u);  // copies for sending, within the memory bound
  EXPECT_EQ(FilesIn(spool_.path()), 30u);
  EXPECT_FALSE(counters.connected);

  ASSERT_EQ(Serve(port), port);
  ASSERT_TRUE(outbox.WaitAllAcked(absl::Seconds(30))) << uplink.last_error();
  uplink.Stop();
  EXPECT_EQ(core_->GetReport(Key(801))->events(), 3000u);
  EXPECT_EQ(FilesIn(spool_.path()), 0u);
  EXPECT_EQ(outbox.counters().spool_bytes, 0u);
}

TEST_F(PipelineTest, DropsBeyondTheSpoolBoundAreCountedAndReported) {
  const int port = ReservePort();
  agent::OutboxOptions options;
  options.spool_dir = spool_.path();
  options.max_memory_bytes = 0;
  options.max_spool_bytes = 3 * Batch(Key(802), 2, 100).ByteSizeLong() + 100;
  agent::Outbox outbox(options);
  for (uint64_t seq = 1; seq <= 10; ++seq) outbox.Add(Batch(Key(802), seq, 100));
  agent::AgentCounters counters = outbox.counters();
  EXPECT_EQ(counters.batches_spooled, 3u);
  EXPECT_EQ(counters.batches_dropped, 7u);
  EXPECT_EQ(counters.events_dropped, 700u);

  agent::Uplink uplink(&outbox, Fast(port));
  uplink.Start();
  ASSERT_EQ(Serve(port), port);
  ASSERT_TRUE(outbox.WaitAllAcked(absl::Seconds(30)));
  // The next batch carries the loss to the collector.
  ASSERT_TRUE(outbox.Add(Batch(Key(802), 11, 100)));
  ASSERT_TRUE(outbox.WaitAllAcked(absl::Seconds(30)));
  uplink.Stop();
  EXPECT_EQ(core_->GetReport(Key(802))->events(), 3u * 100 + 101);
  EXPECT_EQ(DroppedRecordsStored(), 700u);
}

TEST_F(PipelineTest, RenumbersAfterBatchesOfAnEarlierAgent) {
  const int port = Serve();
  for (uint64_t seq = 1; seq <= 3; ++seq) ASSERT_TRUE(core_->Ingest(Batch(Key(803), seq, 10)).ok());
  agent::Outbox outbox(agent::OutboxOptions{});
  agent::Uplink uplink(&outbox, Fast(port));
  ASSERT_TRUE(outbox.Add(Batch(Key(803), 4, 10)));
  ASSERT_TRUE(outbox.Add(Batch(Key(803), 5, 10)));
  uplink.Start();
  ASSERT_TRUE(outbox.WaitAllAcked(absl::Seconds(30)));
  uplink.Stop();
  EXPECT_EQ(outbox.counters().batches_renumbered, 2u);
  EXPECT_EQ(core_->GetReport(Key(803))->events(), 50u);
}

TEST_F(PipelineTest, AgentFindsRingsThatAppearAfterItStarted) {
  const int port = Serve();
  TempDir rings;
  agent::AgentOptions options;
  options.ring_dir = rings.path();
  options.uplink = Fast(port);
  agent::Agent agent(options);
  agent.StartUplink();
  ASSERT_EQ(*agent.Poll(), 0u);

  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    interposer::RingWriter writer;
    interposer::RingOpenOptions ring_options;
    ring_options.dir = rings.path().c_str();
    if (writer.Open(ring_options) != interposer::RingError::kOk) ::_exit(1);
    for (uint64_t i = 0; i < 300; ++i) {
      writer.RecordAlloc(0, 0x1000 + i * 512, 500, 512, VRAMSCOPE_RING_ALLOC_POOLED);
    }
    writer.MarkExited(0);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_EQ(status, 0);

  EXPECT_EQ(*agent.Poll(), 302u);  // ProcessStart, 300 allocations, ProcessExit
  ASSERT_TRUE(agent.outbox().WaitAllAcked(absl::Seconds(30)));
  agent.StopUplink();
  const agent::AgentCounters counters = agent.counters();
  EXPECT_EQ(counters.rings_finished, 1u);
  EXPECT_EQ(counters.rings_open, 0u);
  v1::ListProcessesResponse list = core_->ListProcesses(true);
  ASSERT_EQ(list.processes_size(), 1);
  EXPECT_EQ(list.processes(0).events(), 302u);
  EXPECT_TRUE(list.processes(0).finished());
}

TEST_F(PipelineTest, RecordsInTheSpoolAndStillInTheRingAreNotSentTwice) {
  TempDir rings;
  interposer::RingWriter writer;
  interposer::RingOpenOptions ring_options;
  ring_options.dir = rings.path().c_str();
  ASSERT_EQ(writer.Open(ring_options), interposer::RingError::kOk);
  for (uint64_t i = 0; i < 100; ++i) {
    ASSERT_TRUE(writer.RecordAlloc(0, 0x1000 + i * 512, 500, 512, VRAMSCOPE_RING_ALLOC_POOLED));
  }
  agent::OutboxOptions outbox_options;
  outbox_options.spool_dir = spool_.path();
  v1::ProcessKey key;
  {
    // An agent that wrote its batch to the spool and died before the ring's tail moved:
    //   drain 100 records -> spool file (ring_end 100) -> X (tail still 0)
    agent::RingReader::Options reader_options;
    reader_options.commit_in_drain = false;
    auto reader = *agent::RingReader::OpenFile(writer.path(), reader_options);
    key = reader->process_key();
    v1::EventBatch batch;
    ASSERT_EQ(reader->Drain(batch.mutable_events())->records, 100u);
    *batch.mutable_process() = key;
    agent::Outbox outbox(outbox_options);
    ASSERT_TRUE(outbox.Add(std::move(batch), reader->cursor()));
  }
  ASSERT_EQ(writer.header()->tail, 0u);
  for (uint64_t i = 100; i < 150; ++i) {
    ASSERT_TRUE(writer.RecordAlloc(0, 0x1000 + i * 512, 500, 512, VRAMSCOPE_RING_ALLOC_POOLED));
  }

  agent::AgentOptions options;
  options.ring_dir = rings.path();
  options.outbox = outbox_options;
  options.uplink = Fast(Serve());
  agent::Agent agent(options);
  EXPECT_EQ(agent.counters().batches_replayed, 1u);
  agent.StartUplink();
  EXPECT_EQ(*agent.Poll(), 50u);  // only what the spool does not hold
  EXPECT_EQ(writer.header()->tail, 150u);
  ASSERT_TRUE(agent.outbox().WaitAllAcked(absl::Seconds(30)));
  agent.StopUplink();
  absl::StatusOr<v1::Report> report = core_->GetReport(key);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->events(), 151u);  // one ProcessStart, 150 allocations
  ASSERT_EQ(report->devices_size(), 1);
  EXPECT_EQ(report->devices(0).alloc_count(), 150u);
  EXPECT_EQ(report->devices(0).peak_allocated_bytes(), 150u * 512);
  EXPECT_EQ(FilesIn(spool_.path()), 0u);
  writer.Close();
}

TEST_F(PipelineTest, ReplayedBatchesReachACollectorThatLostTheEarlierOnes) {
  agent::OutboxOptions outbox_options;
  outbox_options.spool_dir = spool_.path();
  {
    agent::Outbox outbox(outbox_options);
    outbox.SetStart(Key(901), 4);  // another collector held 1..4 of this finished process
    ASSERT_TRUE(outbox.Add(Batch(Key(901), 0, 10)));
    ASSERT_TRUE(outbox.Add(Batch(Key(901), 0, 10)));
  }
  TempDir rings;  // its ring is gone: nothing else would ask the collector about it
  agent::AgentOptions options;
  options.ring_dir = rings.path();
  options.outbox = outbox_options;
  options.uplink = Fast(Serve());
  agent::Agent agent(options);
  agent.StartUplink();
  ASSERT_EQ(*agent.Poll(), 0u);
  // Sequences 5 and 6 of a process this collector never saw: renumbered 1 and 2.
  ASSERT_TRUE(agent.outbox().WaitAllAcked(absl::Seconds(20))) << agent.uplink().last_error();
  agent.StopUplink();
  EXPECT_EQ(core_->GetReport(Key(901))->events(), 20u);
  EXPECT_EQ(agent.counters().batches_renumbered, 2u);
}

TEST_F(PipelineTest, OtherUsersRingsAreSkippedUnlessAllUsers) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a ring to another user";
  TempDir rings;
  interposer::RingWriter writer;
  interposer::RingOpenOptions ring_options;
  ring_options.dir = rings.path().c_str();
  ASSERT_EQ(writer.Open(ring_options), interposer::RingError::kOk);
  ASSERT_EQ(::chown(writer.path(), 12345, 12345), 0);

  agent::AgentOptions options;
  options.ring_dir = rings.path();
  options.uplink = Fast(ReservePort());
  {
    agent::Agent agent(options);
    ASSERT_EQ(*agent.Poll(), 0u);
    EXPECT_EQ(agent.counters().rings_skipped, 1u);
    EXPECT_EQ(agent.counters().rings_open, 0u);
  }
  options.all_users = true;
  agent::Agent agent(options);
  EXPECT_EQ(*agent.Poll(), 1u);  // ProcessStart
  EXPECT_EQ(agent.counters().rings_open, 1u);
  writer.Close();
}

// A ring file truncated by its owner while the agent has it mapped: the agent logs it, counts it
// in rings_damaged, closes that ring and goes on draining the others (it used to die of SIGBUS).
TEST_F(PipelineTest, ATruncatedRingIsClosedAndTheOtherRingsKeepDraining) {
  const int port = Serve();
  TempDir rings;
  interposer::RingOpenOptions ring_options;
  ring_options.dir = rings.path().c_str();
  interposer::RingWriter victim;
  interposer::RingWriter other;
  ASSERT_EQ(victim.Open(ring_options), interposer::RingError::kOk);
  ASSERT_EQ(other.Open(ring_options), interposer::RingError::kOk);
  ASSERT_STRNE(victim.path(), other.path());
  auto write = [](interposer::RingWriter& writer, uint64_t first, uint64_t n) {
    for (uint64_t i = first; i < first + n; ++i) {
      ASSERT_TRUE(writer.RecordAlloc(0, 0x1000 + i * 512, 500, 512, VRAMSCOPE_RING_ALLOC_POOLED));
    }
  };
  write(victim, 0, 100);
  write(other, 0, 100);

  agent::AgentOptions options;
  options.ring_dir = rings.path();
  options.uplink = Fast(port);
  agent::Agent agent(options);
  agent.StartUplink();
  ASSERT_EQ(*agent.Poll(), 202u);  // two ProcessStarts, 200 allocations

  ASSERT_EQ(::truncate(victim.path(), 0), 0);  // the victim's writer must not write any more
  write(other, 100, 50);
  absl::StatusOr<uint64_t> polled = agent.Poll();
  ASSERT_TRUE(polled.ok()) << polled.status();
  EXPECT_EQ(*polled, 50u);
  EXPECT_EQ(agent.counters().rings_damaged, 1u);
  EXPECT_EQ(agent.counters().rings_open, 1u);
  write(other, 150, 50);
  EXPECT_EQ(*agent.Poll(), 50u);
  ASSERT_TRUE(agent.outbox().WaitAllAcked(absl::Seconds(30)));
  agent.StopUplink();

  v1::ProcessKey key;
  key.set_host(agent::LocalHostName());
  key.set_pid(other.header()->pid);
  key.set_start_time_ns(other.header()->start_time_ns);
  absl::StatusOr<v1::Report> report = core_->GetReport(key);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->events(), 201u);
}

// A header that names a process its file owner does not run is counted once and its events are
// marked, under the file owner's uid and this host. One that claims pid 0 is skipped (the
// collector takes no batch of pid 0).
TEST_F(PipelineTest, AForgedRingHeaderIsCountedAndMarked) {
  const int port = Serve();
  TempDir rings;
  interposer::RingOpenOptions ring_options;
  ring_options.dir = rings.path().c_str();
  interposer::RingWriter writer;
  ASSERT_EQ(writer.Open(ring_options), interposer::RingError::kOk);
  auto* header = const_cast<vramscope_ring_header*>(writer.header());
  header->pid = 1;  // init, root's: as root, the file goes to another user so it is not the owner's
  header->proc_start_ticks = 0;
  header->uid = 0;
  strncpy(header->host, "elsewhere", sizeof(header->host));
  ASSERT_TRUE(writer.RecordAlloc(0, 0x1000, 500, 512, VRAMSCOPE_RING_ALLOC_POOLED));
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(writer.path(), 65534, 65534), 0);
  }
  struct stat st {};
  ASSERT_EQ(::stat(writer.path(), &st), 0);
  ASSERT_NE(st.st_uid, 0u);
  interposer::RingWriter pid_zero;
  ASSERT_EQ(pid_zero.Open(ring_options), interposer::RingError::kOk);
  const_cast<vramscope_ring_header*>(pid_zero.header())->pid = 0;

  agent::AgentOptions options;
  options.ring_dir = rings.path();
  options.uplink = Fast(port);
  options.all_users = ::geteuid() == 0;
  agent::Agent agent(options);
  agent.StartUplink();
  EXPECT_EQ(*agent.Poll(), 2u);  // ProcessStart, the allocation
  ASSERT_TRUE(agent.outbox().WaitAllAcked(absl::Seconds(30)));
  agent.StopUplink();
  EXPECT_EQ(agent.counters().rings_identity_mismatch, 2u);
  EXPECT_EQ(agent.counters().rings_skipped, 1u);
  EXPECT_EQ(agent.counters().rings_open, 1u);

  v1::ProcessKey key;
  key.set_host(agent::LocalHostName());
  key.set_pid(1);
  key.set_start_time_ns(writer.header()->start_time_ns);
  absl::StatusOr<v1::Report> report = core_->GetReport(key);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->identity(), v1::PROCESS_IDENTITY_MISMATCH);
  EXPECT_EQ(report->uid(), st.st_uid);
  EXPECT_EQ(report->process().host(), agent::LocalHostName());
}

}  // namespace
}  // namespace vramscope
