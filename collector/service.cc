#include "vramscope/collector/service.h"

#include <absl/strings/str_format.h>
#include <google/protobuf/arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "vramscope/collector/batch_check.h"
#include "vramscope/collector/log.h"
#include "vramscope/utf8.h"

namespace vramscope::collector {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numbering (both are google.rpc.Code).
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

net::MethodRoles CollectorMethodRoles() {
  const std::string service = absl::StrCat("/", v1::Collector::service_full_name(), "/");
  return {
      {absl::StrCat(service, "Ingest"), net::Role::kWriter},
      {absl::StrCat(service, "Watch"), net::Role::kReader},
      {absl::StrCat(service, "GetReport"), net::Role::kReader},
      {absl::StrCat(service, "ListProcesses"), net::Role::kReader},
  };
}

namespace {
std::string MethodName(absl::string_view method) {
  return absl::StrCat("/", v1::Collector::service_full_name(), "/", method);
}
}  // namespace

absl::Duration ClampWatchInterval(uint32_t interval_ms) {
  if (interval_ms == 0) return absl::Seconds(1);
  return std::clamp(absl::Milliseconds(interval_ms), absl::Milliseconds(50), absl::Seconds(60));
}

namespace {

// A process key for a log line: the host cut to 64 bytes. A refused key may carry a host of
// megabytes (the limit is the message size), which would otherwise go into the log whole.
std::string LoggedKey(const v1::ProcessKey& key) {
  if (key.host().size() <= 64) return ProcessKeyString(key);
  v1::ProcessKey shown = key;
  shown.set_host(absl::StrCat(ToValidUtf8(std::string_view(key.host()).substr(0, 64)), "...(",
                              key.host().size(), " bytes)"));
  return ProcessKeyString(shown);
}

// One Ingest stream. gRPC may run OnReadDone and OnWriteDone at the same time on different
// threads; mu_ orders them. A read is always outstanding while the stream is healthy, and at most
// one write: acknowledgements produced while a write is in flight wait in pending_, one per
// process (they are cumulative, so the latest says all).
class IngestReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  IngestReactor(Collector* collector, std::string peer, std::string writer)
      : collector_(collector),
        peer_(std::move(peer)),
        writer_(std::move(writer)),
        arena_block_(new char[kArenaBlockBytes]),
        arena_(ArenaOptionsFor(arena_block_.get())) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the agent half-closed (or the call ended)
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      MaybeFinish();
      return;
    }
    absl::Status status = Handle();
    absl::MutexLock lock(&mu_);
    if (!status.ok()) {
      Log(LogLevel::kWarning, absl::StrFormat("Ingest from %s: %s", peer_, status.ToString()));
      FinishOnce(ToGrpcStatus(status));
      return;
    }
    if (finished_) return;
    // An OnWriteDone between Handle() and here may already have sent this acknowledgement.
    if (!writing_ && !pending_.empty()) WriteNext();
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {  // the agent went away; it resends what it lacks
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "acknowledgement not delivered"));
      return;
    }
    if (!pending_.empty()) {
      WriteNext();
    } else {
      MaybeFinish();
    }
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Handle() {
    std::vector<grpc::Slice> slices;
    if (!request_.Dump(&slices).ok()) return absl::InternalError("cannot read the message");
    wire_.clear();
    for (const grpc::Slice& slice : slices) {
      wire_.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    request_.Clear();
    // Parsing into an arena: one block reused for every batch of the stream instead of two
    // mallocs and frees per event (they dominated the ingest profile).
    arena_.Reset();
    IngestMessage message = CheckIngestMessage(wire_, &arena_);
    v1::IngestAck ack;
    switch (message.kind) {
      case IngestMessage::Kind::kMalformed:
        return absl::InvalidArgumentError(message.reason);
      case IngestMessage::Kind::kBatch: {
        absl::StatusOr<uint64_t> acked = collector_->Ingest(*message.batch, wire_, writer_);
        if (!acked.ok()) return acked.status();
        *ack.mutable_process() = message.batch->process();
        ack.set_acked_sequence(*acked);
        break;
      }
      case IngestMessage::Kind::kRejected: {
        // One bad batch (one process's hostile strings, a bogus key) is answered on its own;
        // the stream, and every other process's batches on it, go on.
        absl::StatusOr<uint64_t> acked = collector_->Refuse(message, writer_);
        if (!acked.ok()) return acked.status();
        const uint64_t refused = collector_->batches_refused();
        if (refused <= 10 || refused % 1000 == 0) {
          Log(LogLevel::kWarning,
              absl::StrFormat("Ingest from %s: refused batch %d of process %s (%d events): %s%s",
                              peer_, message.sequence, LoggedKey(message.process), message.events,
                              message.reason,
                              refused == 10 ? " (further refusals are logged every 1000th)" : ""));
        }
        *ack.mutable_process() = message.process;
        ack.set_acked_sequence(*acked);
        ack.set_rejected(true);
        ack.set_rejected_sequence(message.sequence);
        ack.set_reject_reason(message.reason);
        break;
      }
    }
    absl::MutexLock lock(&mu_);
    if (!ack.rejected()) {
      // Plain acknowledgements are cumulative: the latest of a process says all, so it replaces
      // a waiting one, unless a rejection of that process waits after it (the agent must see
      // the rejection before an acknowledgement that covers the refused sequence).
      for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) {
        if (it->process().pid() != ack.process().pid() ||
            it->process().start_time_ns() != ack.process().start_time_ns() ||
            it->process().host() != ack.process().host()) {
          continue;
        }
        if (it->rejected()) break;
        it->set_acked_sequence(std::max(it->acked_sequence(), ack.acked_sequence()));
        return absl::OkStatus();
      }
    }
    pending_.push_back(std::move(ack));
    return absl::OkStatus();
  }

  void WriteNext() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::string bytes = pending_.front().SerializeAsString();
    pending_.erase(pending_.begin());
    grpc::Slice slice(bytes);
    response_ = grpc::ByteBuffer(&slice, 1);
    writing_ = true;
    StartWrite(&response_);
  }

  void MaybeFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reads_done_ && !writing_ && pending_.empty()) FinishOnce(grpc::Status::OK);
  }

  void FinishOnce(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  // A batch of 4096 events parses into about 600 KB.
  static constexpr size_t kArenaBlockBytes = size_t{1} << 20;
  static google::protobuf::ArenaOptions ArenaOptionsFor(char* block) {
    google::protobuf::ArenaOptions options;
    options.initial_block = block;
    options.initial_block_size = kArenaBlockBytes;
    options.max_block_size = kArenaBlockBytes;
    return options;
  }

  Collector* const collector_;
  const std::string peer_;
  const std::string writer_;  // the peer's identity: its quota of processes (--max-processes)
  // Touched only by the read path (one read outstanding at a time).
  grpc::ByteBuffer request_;
  std::string wire_;
  std::unique_ptr<char[]> arena_block_;
  google::protobuf::Arena arena_;
  absl::Mutex mu_;
  grpc::ByteBuffer response_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::IngestAck> pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// An Ingest call the guard refused: ends at once with its status.
class RefusedReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit RefusedReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// Logs a refused call (without the token: messages never hold it): the first 10, then every
// 1000th, so a client knocking without a token cannot fill the log.
grpc::Status Refused(const grpc::ServerContextBase& context, absl::string_view method,
                     const grpc::Status& status) {
  static std::atomic<uint64_t> refused{0};
  const uint64_t n = refused.fetch_add(1, std::memory_order_relaxed) + 1;
  if (n <= 10 || n % 1000 == 0) {
    Log(LogLevel::kWarning,
        absl::StrFormat("%s from %s refused: %s (%d calls refused so far%s)", method,
                        context.peer(), status.error_message(), n,
                        n == 10 ? "; further refusals are logged every 1000th" : ""));
  }
  return status;
}

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* CollectorService::Ingest(
    grpc::CallbackServerContext* context) {
  net::Peer peer;
  if (grpc::Status allowed = guard_->Authorize(*context, MethodName("Ingest"), &peer);
      !allowed.ok()) {
    return new RefusedReactor(Refused(*context, "Ingest", allowed));
  }
  return new IngestReactor(collector_, context->peer(), std::move(peer.identity));
}

grpc::Status CollectorService::Watch(grpc::ServerContext* context, const v1::WatchRequest* request,
                                     grpc::ServerWriter<v1::StatsUpdate>* writer) {
  net::Peer peer;
  if (grpc::Status allowed = guard_->Authorize(*context, MethodName("Watch"), &peer);
      !allowed.ok()) {
    return Refused(*context, "Watch", allowed);
  }
  const absl::Duration interval = ClampWatchInterval(request->interval_ms());
  while (!context->IsCancelled()) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "collector shutting down");
    }
    if (!writer->Write(collector_->Snapshot(*request))) return grpc::Status::OK;
    absl::MutexLock lock(&mu_);
    // Wakes early only for Stop(); a cancelled client is noticed at the next interval.
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval);
  }
  return grpc::Status::OK;
}

grpc::Status CollectorService::GetReport(grpc::ServerContext* context,
                                         const v1::GetReportRequest* request,
                                         v1::Report* response) {
  net::Peer peer;
  if (grpc::Status allowed = guard_->Authorize(*context, MethodName("GetReport"), &peer);
      !allowed.ok()) {
    return Refused(*context, "GetReport", allowed);
  }
  absl::StatusOr<v1::Report> report = collector_->GetReport(request->process());
  if (!report.ok()) return ToGrpcStatus(report.status());
  *response = std::move(*report);
  return grpc::Status::OK;
}

grpc::Status CollectorService::ListProcesses(grpc::ServerContext* context,
                                             const v1::ListProcessesRequest* request,
                                             v1::ListProcessesResponse* response) {
  net::Peer peer;
  if (grpc::Status allowed = guard_->Authorize(*context, MethodName("ListProcesses"), &peer);
      !allowed.ok()) {
    return Refused(*context, "ListProcesses", allowed);
  }
  *response = collector_->ListProcesses(request->include_finished());
  return grpc::Status::OK;
}

void CollectorService::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

absl::StatusOr<std::unique_ptr<CollectorServer>> CollectorServer::Start(
    Collector* collector, const ServerOptions& options) {
  std::shared_ptr<const net::ServerGuard> guard = options.guard;
  if (guard == nullptr) guard = net::ServerGuard::Open(CollectorMethodRoles());
  if (absl::Status allowed = guard->CheckListen(options.listen); !allowed.ok()) return allowed;
  std::unique_ptr<CollectorServer> server(new CollectorServer(collector, guard));
  grpc::ServerBuilder builder;
  guard->AddTo(&builder, options.listen, &server->port_);
  builder.RegisterService(&server->service_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot listen on %s (address in use or not local?); pick another with --listen=HOST:PORT",
        options.listen));
  }
  return server;
}

CollectorServer::~CollectorServer() { Shutdown(); }

void CollectorServer::Shutdown() {
  if (shut_down_.exchange(true)) return;
  service_.Stop();
  // Open Ingest streams block in Read: give them a moment, then cancel them.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  server_->Wait();
}

void CollectorServer::Wait() { server_->Wait(); }

}  // namespace vramscope::collector
