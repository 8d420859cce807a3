// Uplink: streams the Outbox's batches to the collector over one gRPC Ingest stream at a time,
// feeds the acknowledgements (and rejections of single batches, Outbox::Reject) back, and
// reconnects with exponential backoff when the stream breaks (collector down, restarted, or
// refusing with an error status), resending everything unacknowledged.
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

#include "vramscope/agent/outbox.h"
#include "vramscope/net_security.h"
#include "vramscope/v1/collector.grpc.pb.h"

namespace vramscope::agent {

struct UplinkOptions {
  std::string collector = "127.0.0.1:7411";
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(10);
  int max_message_bytes = 16 << 20;
  net::ClientCredentials credentials;  // TLS and token (net::LoadClientCredentials); default none
};

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

 private:
  void Run();
  // One stream from open to end; returns its final status.
  absl::Status RunStream(grpc::ClientContext* context, bool* acked_any);
  bool stopping() const;

  Outbox* const outbox_;
  const UplinkOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Collector::Stub> stub_;
  std::thread thread_;
  std::atomic<bool> ever_connected_{false};
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vramscope::agent

#endif  // VRAMSCOPE_AGENT_UPLINK_H_
