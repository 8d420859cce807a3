// Uplink: streams the Outbox's batches to the collector over one gRPC Ingest stream at a time,
// feeds the acknowledgements (and rejections of single batches, Outbox::Reject) back, and
// reconnects with exponential backoff when the stream breaks (collector down, restarted, or
// refusing with an error status), resending everything unacknowledged.
//
// Several collectors: `collector` may list several addresses, comma-separated. Their order for
// this agent is a rendezvous (highest random weight) hash of the host name and each address, so
// the hosts of a fleet spread over the collectors and a host always prefers the same one. The
// agent talks to one collector at a time: the first in its order that answers. When the stream
// to it breaks the agent moves to the next at once (backing off only after a whole round failed)
// and resends everything unacknowledged there; processes continue there past their last
// acknowledged sequence (its streams carry the `vramscope-failover` metadata, so the collector
// accepts a process that starts past sequence 1). While on another collector it looks at the
// preferred one every `return_check`; once that answers, it stops taking new batches, waits until
// every batch in flight is acknowledged (a batch boundary: nothing sent is unanswered, so nothing
// is stored twice), and switches back.
//
// Threads: Start() runs a sender thread, plus one reader thread per stream for acknowledgements.
// Stop() (idempotent, any thread) cancels the stream and joins them. Errors are logged, and the
// last one is kept for `last_error()`.
#ifndef VRAMSCOPE_AGENT_UPLINK_H_
#define VRAMSCOPE_AGENT_UPLINK_H_

#include <absl/base/thread_annotations.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "vramscope/agent/outbox.h"
#include "vramscope/net_security.h"
#include "vramscope/v1/collector.grpc.pb.h"

namespace vramscope::agent {

struct UplinkOptions {
  std::string collector = "127.0.0.1:7411";  // HOST:PORT[,HOST:PORT...]
  // The host name the collectors are ordered by (empty: gethostname).
  std::string host;
  absl::Duration return_check = absl::Seconds(1);
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(10);
  int max_message_bytes = 16 << 20;
  net::ClientCredentials credentials;  // TLS and token (net::LoadClientCredentials); default none
};

// The order in which `host` tries `collectors` (rendezvous hashing: each address scored by a hash
// of host and address, highest first). Removing one collector moves only the hosts that preferred
// it.
std::vector<std::string> CollectorOrder(const std::string& host,
                                        const std::vector<std::string>& collectors);

// The one place the agent makes a channel to a collector (TLS and tokens plug in here).
std::shared_ptr<grpc::Channel> MakeCollectorChannel(const std::string& address,
                                                    const UplinkOptions& options);

class Uplink {
 public:
  Uplink(Outbox* outbox, UplinkOptions options);  // `outbox` is not owned and must outlive this
  ~Uplink();
  Uplink(const Uplink&) = delete;
  Uplink& operator=(const Uplink&) = delete;

  void Start();
  void Stop();
  // Asks the collector which sequence it holds for `process` (0: none), on a short stream of its
  // own. UNAVAILABLE/DEADLINE_EXCEEDED while it cannot be reached.
  absl::StatusOr<uint64_t> Probe(const v1::ProcessKey& process, absl::Duration timeout);
  // Status of the last stream that ended (OK while none has).
  absl::Status last_error() const;
  // True once any acknowledgement arrived on any stream.
  bool ever_connected() const { return ever_connected_.load(); }
  // More than one collector was given.
  bool several() const { return targets_.size() > 1; }
  // The collector batches go to now.
  std::string current() const;
  // Switches between collectors so far (failovers and returns).
  uint64_t switches() const { return switches_.load(); }

 private:
  void Run();
  // One stream from open to end; returns its final status.
  absl::Status RunStream(grpc::ClientContext* context, bool* acked_any, size_t position);
  bool stopping() const;
  void PrepareContext(grpc::ClientContext* context) const;

  struct Target {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Collector::Stub> stub;
  };

  Outbox* const outbox_;
  const UplinkOptions options_;
  // In this host's rendezvous order: targets_[0] is the preferred collector.
  std::vector<Target> targets_;
  std::atomic<size_t> active_{0};  // index into targets_
  std::atomic<uint64_t> switches_{0};
  std::thread thread_;
  std::atomic<bool> ever_connected_{false};
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vramscope::agent

#endif  // VRAMSCOPE_AGENT_UPLINK_H_
