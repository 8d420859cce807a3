// The collector's gRPC edge: vramscope.v1.Collector served over a Collector core. absl::Status
// from the core becomes grpc::Status here and nowhere else (ToGrpcStatus).
//
// CollectorService: thread-safe, as gRPC calls it from many threads; it does not own the core.
// CollectorServer: owns the grpc::Server and the service; Start binds and starts serving,
// Shutdown (idempotent, any thread) ends Watch streams and cancels calls still open after a
// short grace period.
#ifndef VRAMSCOPE_COLLECTOR_SERVICE_H_
#define VRAMSCOPE_COLLECTOR_SERVICE_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "vramscope/collector/collector.h"
#include "vramscope/net_security.h"
#include "vramscope/v1/collector.grpc.pb.h"

namespace vramscope::collector {

grpc::Status ToGrpcStatus(const absl::Status& status);

// Who may call what: Ingest needs a writer token, every read RPC a reader token. A method missing
// here is refused to everyone (net::ServerGuard's default deny): a new RPC must be added.
net::MethodRoles CollectorMethodRoles();

// The Watch interval the collector uses for a requested one (0 = 1 s), clamped to [50 ms, 60 s].
absl::Duration ClampWatchInterval(uint32_t interval_ms);

// Ingest is served raw (callback API on grpc::ByteBuffer): the collector parses each message
// itself (CheckIngestMessage, vramscope/collector/batch_check.h), so a batch it refuses is
// answered on its own (IngestAck.rejected) while the stream goes on, bytes that are not an
// EventBatch end the stream with INVALID_ARGUMENT instead of looking like a half-close, and the
// received bytes are stored as they are, without serialising them again. An Ingest stream whose
// client metadata carries `kFailoverMetadata` (an agent given several collectors) may start a
// process past sequence 1 or continue one past a gap (Collector::Ingest's `takeover`).
//
// Watch is served raw on the callback API too, without a thread per stream: one fan-out thread
// (WatchHub) wakes when the next watcher is due, takes one snapshot per distinct request among the
// watchers due together (every watcher of all processes shares one, serialised once), and starts
// the writes; gRPC's own threads complete them. A watcher whose previous update is still being
// written when it is due again gets the next one after that write completes (a slow client is
// not queued up).
class WatchHub;

inline constexpr char kFailoverMetadata[] = "vramscope-failover";

class CollectorService final
    : public v1::Collector::WithRawCallbackMethod_Watch<
          v1::Collector::WithRawCallbackMethod_Ingest<v1::Collector::Service>> {
 public:
  // `guard` (not owned, must outlive this) authorizes every call.
  CollectorService(Collector* collector, const net::ServerGuard* guard);
  ~CollectorService() override;

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Ingest(
      grpc::CallbackServerContext* context) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Watch(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request) override;
  grpc::Status GetReport(grpc::ServerContext* context, const v1::GetReportRequest* request,
                         v1::Report* response) override;
  grpc::Status ListProcesses(grpc::ServerContext* context, const v1::ListProcessesRequest* request,
                             v1::ListProcessesResponse* response) override;
  // The run history (Collector::history()); FAILED_PRECONDITION when the collector keeps none.
  grpc::Status ListRuns(grpc::ServerContext* context, const v1::ListRunsRequest* request,
                        v1::ListRunsResponse* response) override;
  grpc::Status GetRun(grpc::ServerContext* context, const v1::GetRunRequest* request,
                      v1::Report* response) override;

  // Ends every Watch stream (UNAVAILABLE); later Watch calls return UNAVAILABLE.
  void Stop();
  // Watch streams open now.
  size_t watchers() const;

 private:
  Collector* const collector_;
  std::unique_ptr<WatchHub> hub_;
  const net::ServerGuard* const guard_;
};

struct ServerOptions {
  std::string listen = "127.0.0.1:7411";  // "127.0.0.1:0" picks a free port
  int max_message_bytes = 16 << 20;       // gRPC's receive limit for one message
  // TLS, tokens and the listen check (net::ServerGuard::Load); null: plaintext, no tokens,
  // loopback only.
  std::shared_ptr<const net::ServerGuard> guard;
};

class CollectorServer {
 public:
  static absl::StatusOr<std::unique_ptr<CollectorServer>> Start(Collector* collector,
                                                                const ServerOptions& options);
  ~CollectorServer();

  int port() const { return port_; }
  CollectorService& service() { return service_; }
  void Shutdown();
  void Wait();

 private:
  explicit CollectorServer(Collector* collector, std::shared_ptr<const net::ServerGuard> guard)
      : guard_(std::move(guard)), service_(collector, guard_.get()) {}
  std::shared_ptr<const net::ServerGuard> guard_;
  CollectorService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::atomic<bool> shut_down_{false};
};

}  // namespace vramscope::collector

#endif  // VRAMSCOPE_COLLECTOR_SERVICE_H_
