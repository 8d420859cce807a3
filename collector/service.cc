#include "vramscope/collector/service.h"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "vramscope/collector/log.h"

namespace vramscope::collector {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numbering (both are google.rpc.Code).
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Duration ClampWatchInterval(uint32_t interval_ms) {
  if (interval_ms == 0) return absl::Seconds(1);
  return std::clamp(absl::Milliseconds(interval_ms), absl::Milliseconds(50), absl::Seconds(60));
}

grpc::Status CollectorService::Ingest(
    grpc::ServerContext* context, grpc::ServerReaderWriter<v1::IngestAck, v1::EventBatch>* stream) {
  v1::EventBatch batch;
  v1::IngestAck ack;
  while (stream->Read(&batch)) {
    absl::StatusOr<uint64_t> acked = collector_->Ingest(batch);
    if (!acked.ok()) {
      Log(LogLevel::kWarning,
          absl::StrFormat("Ingest from %s: %s", context->peer(), acked.status().ToString()));
      return ToGrpcStatus(acked.status());
    }
    *ack.mutable_process() = batch.process();
    ack.set_acked_sequence(*acked);
    if (!stream->Write(ack)) break;  // the agent went away; it resends what it lacks
  }
  return grpc::Status::OK;
}

grpc::Status CollectorService::Watch(grpc::ServerContext* context, const v1::WatchRequest* request,
                                     grpc::ServerWriter<v1::StatsUpdate>* writer) {
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

grpc::Status CollectorService::GetReport(grpc::ServerContext*, const v1::GetReportRequest* request,
                                         v1::Report* response) {
  absl::StatusOr<v1::Report> report = collector_->GetReport(request->process());
  if (!report.ok()) return ToGrpcStatus(report.status());
  *response = std::move(*report);
  return grpc::Status::OK;
}

grpc::Status CollectorService::ListProcesses(grpc::ServerContext*,
                                             const v1::ListProcessesRequest* request,
                                             v1::ListProcessesResponse* response) {
  *response = collector_->ListProcesses(request->include_finished());
  return grpc::Status::OK;
}

void CollectorService::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

absl::StatusOr<std::unique_ptr<CollectorServer>> CollectorServer::Start(
    Collector* collector, const ServerOptions& options) {
  std::unique_ptr<CollectorServer> server(new CollectorServer(collector));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &server->port_);
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
