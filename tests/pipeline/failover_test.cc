// Several collectors with the real daemons as child processes: an agent given two collectors
// (`--collector a,b`) streams to the one its host prefers; that one is SIGKILLed mid-run, the agent
// fails over to the other and resends; the first comes back and the agent returns to it. Every
// event is stored, none is lost, a sequence stored twice (acknowledgement lost in the kill) is the
// same batch at both, and `vramscope report --collector a,b` (FetchCollectorReport) counts each
// event once.
#include <absl/strings/str_cat.h>
#include <absl/time/clock.h>
#include <absl/time/time.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "report/collector_source.h"
#include "tests/collector/test_util.h"
#include "tests/pipeline/subprocess.h"
#include "vramscope/agent/uplink.h"
#include "vramscope/collector/record_log.h"
#include "vramscope/ring/ring_writer.h"
#include "vramscope/v1/collector.grpc.pb.h"

namespace vramscope {
namespace {

using ::testing::HasSubstr;
using ::vramscope::testing::BinaryFromEnv;
using ::vramscope::testing::Subprocess;
using ::vramscope::testing::TempDir;

struct Stored {
  std::map<uint64_t, std::string> batches;  // sequence -> payload, of one data directory
  uint64_t duplicates = 0;                  // a sequence twice in one directory
};

// Every batch of `key` in the logs of `dir`.
Stored ReadStored(const std::string& dir, const v1::ProcessKey& key) {
  Stored stored;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".vslog") continue;
    collector::LogScan scan;
    absl::Status read = collector::ReadLog(
        entry.path().string(),
        [&](uint64_t, absl::string_view payload) {
          v1::EventBatch batch;
          batch.ParseFromArray(payload.data(), static_cast<int>(payload.size()));
          if (batch.process().pid() != key.pid() ||
              batch.process().start_time_ns() != key.start_time_ns()) {
            return absl::OkStatus();
          }
          if (!stored.batches.emplace(batch.sequence(), std::string(payload)).second) {
            ++stored.duplicates;
          }
          return absl::OkStatus();
        },
        &scan);
    EXPECT_TRUE(read.ok()) << read;
  }
  return stored;
}

uint64_t Allocs(const std::string& payload) {
  v1::EventBatch batch;
  batch.ParseFromString(payload);
  uint64_t n = 0;
  for (const v1::Event& event : batch.events()) n += event.has_alloc() ? 1 : 0;
  return n;
}

class FailoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    collector_bin_ = BinaryFromEnv("VRAMSCOPE_COLLECTOR");
    agent_bin_ = BinaryFromEnv("VRAMSCOPE_AGENT");
    ASSERT_FALSE(collector_bin_.empty() || agent_bin_.empty()) << "run through meson test";
  }

  int StartCollector(Subprocess& process, const std::string& listen, const std::string& dir) {
    EXPECT_TRUE(process.Start({collector_bin_, "--listen=" + listen, "--data-dir=" + dir}));
    int port = process.WaitForPort();
    EXPECT_NE(port, 0) << process.output();
    return port;
  }

  // Allocations `port`'s collector counts for `key` (0 when it cannot say).
  uint64_t AllocsAt(const std::string& address, const v1::ProcessKey& key) {
    auto stub =
        v1::Collector::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::GetReportRequest request;
    *request.mutable_process() = key;
    v1::Report report;
    if (!stub->GetReport(&context, request, &report).ok() || report.devices_size() != 1) return 0;
    return report.devices(0).alloc_count();
  }

  // The collector is another process: polling it is the only way to see what it holds.
  bool WaitForAllocs(const std::string& address, const v1::ProcessKey& key, uint64_t allocs) {
    for (int i = 0; i < 1500; ++i) {
      if (AllocsAt(address, key) >= allocs) return true;
      ::usleep(20000);
    }
    return false;
  }

  std::string collector_bin_;
  std::string agent_bin_;
};

TEST_F(FailoverTest, CollectorKilledMidRunLosesAndDoublesNothingAndTheAgentReturns) {
  TempDir rings;
  TempDir data_a;
  TempDir data_b;
  TempDir spool;
  interposer::RingWriter writer;  // this test process is the traced application
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

  Subprocess a;
  Subprocess b;
  const int port_a = StartCollector(a, "127.0.0.1:0", data_a.path());
  const int port_b = StartCollector(b, "127.0.0.1:0", data_b.path());
  ASSERT_TRUE(port_a != 0 && port_b != 0);
  const std::string address_a = absl::StrCat("127.0.0.1:", port_a);
  const std::string address_b = absl::StrCat("127.0.0.1:", port_b);
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  const std::vector<std::string> order = agent::CollectorOrder(host, {address_a, address_b});
  const bool a_first = order[0] == address_a;
  Subprocess& preferred = a_first ? a : b;
  const std::string& preferred_dir = a_first ? data_a.path() : data_b.path();
  const std::string& other_dir = a_first ? data_b.path() : data_a.path();
  const std::string both = absl::StrCat(address_a, ",", address_b);

  Subprocess agent;
  ASSERT_TRUE(agent.Start({agent_bin_, "--ring-dir=" + rings.path(), "--collector=" + both,
                           "--poll-interval-ms=5", "--batch-events=100", "--max-backoff-ms=200",
                           "--spool-dir=" + spool.path()}));
  // Batches of 100 events: the kill falls among many of them.
  write(0, 3000);
  ASSERT_TRUE(WaitForAllocs(order[0], key, 500)) << agent.output();
  preferred.Kill(SIGKILL);  // mid-run: the agent is still sending
  EXPECT_EQ(preferred.Wait(), 128 + SIGKILL);
  const absl::Time killed = absl::Now();
  write(3000, 1000);
  ASSERT_TRUE(agent.WaitForOutput("failing over to " + order[1])) << agent.output();
  // The other collector takes the process over where the first one stopped acknowledging.
  Stored first = ReadStored(preferred_dir, key);
  uint64_t first_allocs = 0;
  for (const auto& [seq, payload] : first.batches) first_allocs += Allocs(payload);
  ASSERT_TRUE(WaitForAllocs(order[1], key, 4000 - first_allocs)) << agent.output();
  const absl::Duration resend = absl::Now() - killed;
  EXPECT_LT(resend, absl::Seconds(10)) << "resend after failover took " << resend;
  std::printf("resend after failover: %s (%d batches were at the killed collector)\n",
              absl::FormatDuration(resend).c_str(), static_cast<int>(first.batches.size()));

  // The preferred collector comes back on its port: the agent returns to it at a batch boundary.
  Subprocess again;
  ASSERT_EQ(StartCollector(again, order[0], preferred_dir), a_first ? port_a : port_b);
  ASSERT_TRUE(agent.WaitForOutput("is back: switching to it")) << agent.output();
  write(4000, 1000);
  // Merged over both, each sequence once: FetchCollectorReport is `vramscope report`'s.
  cli::CollectorQuery query;
  query.address = both;
  uint64_t merged_allocs = 0;
  for (int i = 0; i < 1500 && merged_allocs < 5000; ++i) {
    absl::StatusOr<v1::Report> merged = cli::FetchCollectorReport(query, key.pid(), key.host());
    if (merged.ok() && merged->devices_size() == 1)
      merged_allocs = merged->devices(0).alloc_count();
    if (merged_allocs < 5000) ::usleep(20000);
  }
  EXPECT_EQ(merged_allocs, 5000u) << agent.output();
  agent.Kill(SIGTERM);
  EXPECT_EQ(agent.Wait(), 0);

  // Exact counts from the logs themselves: every sequence 1..N held by one collector at least,
  // none twice within one, one held by both only as the same batch; every event once.
  Stored p = ReadStored(preferred_dir, key);
  Stored o = ReadStored(other_dir, key);
  EXPECT_EQ(p.duplicates + o.duplicates, 0u);
  std::map<uint64_t, std::string> all = p.batches;
  uint64_t both_held = 0;
  for (const auto& [seq, payload] : o.batches) {
    auto [it, inserted] = all.emplace(seq, payload);
    if (!inserted) {
      ++both_held;
      EXPECT_EQ(it->second, payload) << "sequence " << seq << " differs between the collectors";
    }
  }
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.begin()->first, 1u);
  EXPECT_EQ(all.rbegin()->first, all.size()) << "a sequence is missing";
  uint64_t allocs = 0;
  for (const auto& [seq, payload] : all) allocs += Allocs(payload);
  EXPECT_EQ(allocs, 5000u);
  EXPECT_FALSE(o.batches.empty());                                  // the other took over
  EXPECT_GT(p.batches.rbegin()->first, o.batches.rbegin()->first);  // and the preferred got it back
  EXPECT_LE(both_held, 100u);
  std::printf("sequences %d, held by both %d, events %d\n", static_cast<int>(all.size()),
              static_cast<int>(both_held), static_cast<int>(allocs));

  // The listing merged over both names the process once.
  absl::StatusOr<v1::ListProcessesResponse> list = cli::ListCollectorProcesses(query);
  ASSERT_TRUE(list.ok()) << list.status();
  int found = 0;
  for (const v1::ProcessSummary& summary : list->processes()) {
    found += summary.process().pid() == key.pid() ? 1 : 0;
  }
  EXPECT_EQ(found, 1);
  writer.Close();
  again.Kill(SIGTERM);
  (a_first ? b : a).Kill(SIGTERM);
}

TEST(CollectorOrderTest, RendezvousSpreadsHostsAndMovesOnlyTheRemovedOnesHosts) {
  const std::vector<std::string> three = {"a:1", "b:1", "c:1"};
  const std::vector<std::string> two = {"a:1", "b:1"};
  std::map<std::string, int> first;
  int moved = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string host = absl::StrCat("node", i);
    std::vector<std::string> order = agent::CollectorOrder(host, three);
    ASSERT_EQ(order.size(), 3u);
    ++first[order[0]];
    EXPECT_EQ(agent::CollectorOrder(host, three), order);  // stable
    // Without c, a host that preferred a or b keeps it.
    const std::string without_c = agent::CollectorOrder(host, two)[0];
    if (order[0] != "c:1") {
      EXPECT_EQ(without_c, order[0]);
    } else {
      ++moved;
      EXPECT_EQ(without_c, order[1]);  // c's hosts go to their second choice
    }
  }
  for (const auto& [collector, hosts] : first) EXPECT_GT(hosts, 60) << collector;
  EXPECT_EQ(moved, first["c:1"]);
}

}  // namespace
}  // namespace vramscope
