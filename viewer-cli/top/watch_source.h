// WatchSource: the collector end of `vramscope top`. A background thread holds a Watch stream
// and keeps the newest StatsUpdate; it also fetches the full report (top sites) of the process
// the dashboard names, at most every `report_interval`. When the stream breaks it reconnects
// with backoff (100 ms doubling to 2 s) and says so in status().
//
// `address` may list several collectors, comma-separated (an agent fleet's `--collector a,b,c`):
// one Watch stream (and thread) per collector, and each update taken is the newest of each merged
// (MergeStatsUpdates). Connect succeeds when any answers; broken() means all are.
//
// Thread safety: every public method may be called from any thread. Errors: Connect returns
// UNAVAILABLE (with gRPC's reason) when the collector cannot be reached within the timeout.
#pragma once

#include <absl/status/status.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "vramscope/net_security.h"
#include "vramscope/v1/collector.grpc.pb.h"
#include "vramscope/v1/collector.pb.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::cli::top {

struct WatchSourceOptions {
  std::string address;
  absl::Duration interval = absl::Seconds(1);
  absl::Duration connect_timeout = absl::Seconds(5);
  absl::Duration report_interval = absl::Seconds(2);
  net::ClientCredentials credentials;  // TLS and token; default plaintext, none
};

// Several collectors' updates into one: a process held by several (its agent failed over) appears
// once, with the figures of the collector holding its highest sequence, and the allocation, free
// and dropped-record counts of the others' devices added.
v1::StatsUpdate MergeStatsUpdates(const std::vector<v1::StatsUpdate>& updates);

class WatchSource {
 public:
  explicit WatchSource(WatchSourceOptions options);
  ~WatchSource();  // stops the thread
  WatchSource(const WatchSource&) = delete;
  WatchSource& operator=(const WatchSource&) = delete;

  // Waits until the collector answers (a first StatsUpdate), then keeps watching on a thread.
  absl::Status Connect();
  // Blocks until a newer update than the last one taken arrives, the stream is broken, or
  // `timeout` passes.
  std::optional<v1::StatsUpdate> TakeUpdate(absl::Duration timeout = absl::ZeroDuration());
  // The newest full report fetched for the wanted process, once.
  std::optional<v1::Report> TakeReport();
  // The process whose report to fetch ("host/pid/start" as ProcessKeyString; empty = none).
  void SetWantedReport(const v1::ProcessKey& key);
  // Empty while the stream is up; else what happened ("reconnecting to ...: reason").
  std::string status() const;
  // gRPC's reason for the last broken stream.
  std::string last_error() const;
  // A stream broke and has not come back (plain mode gives up on this).
  bool broken() const;

 private:
  struct Target {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Collector::Stub> stub;
    grpc::ClientContext* context = nullptr;  // guarded by mu_
    std::optional<v1::StatsUpdate> latest;   // guarded by mu_
    bool broken = false;                     // guarded by mu_
  };
  void Loop(size_t index);
  void MaybeFetchReport(v1::Collector::Stub& stub);

  const WatchSourceOptions options_;
  std::vector<Target> targets_;
  std::vector<std::thread> threads_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool fresh_ ABSL_GUARDED_BY(mu_) = false;  // an update arrived since the last TakeUpdate
  std::optional<v1::Report> report_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::ProcessKey> wanted_ ABSL_GUARDED_BY(mu_);
  std::string fetched_key_ ABSL_GUARDED_BY(mu_);
  absl::Time fetched_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::string status_ ABSL_GUARDED_BY(mu_);
  std::string error_ ABSL_GUARDED_BY(mu_);
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace vramscope::cli::top
