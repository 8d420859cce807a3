#include "vramscope/agent/uplink.h"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "vramscope/agent/log.h"

namespace vramscope::agent {
namespace {

absl::Status FromGrpc(const grpc::Status& status) {
  // grpc::StatusCode and absl::StatusCode share their numbering (google.rpc.Code).
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

std::chrono::system_clock::time_point After(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

}  // namespace

Uplink::Uplink(Outbox* outbox, UplinkOptions options)
    : outbox_(outbox), options_(std::move(options)) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(options_.max_message_bytes);
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  // gRPC's own reconnect backoff grows to two minutes; a restarted collector should be found
  // within our own backoff.
  const int max_ms = static_cast<int>(absl::ToInt64Milliseconds(options_.max_backoff));
  const int initial_ms = static_cast<int>(absl::ToInt64Milliseconds(options_.initial_backoff));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::max(initial_ms, 1));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::max(initial_ms, 1));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, std::max(max_ms, 1));
  channel_ = net::MakeChannel(options_.collector, options_.credentials, args);
  stub_ = v1::Collector::NewStub(channel_);
}

Uplink::~Uplink() { Stop(); }

void Uplink::Start() {
  thread_ = std::thread([this] { Run(); });
}

void Uplink::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  outbox_->Interrupt();
  if (thread_.joinable()) thread_.join();
}

bool Uplink::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

absl::Status Uplink::last_error() const {
  absl::MutexLock lock(&mu_);
  return last_error_;
}

absl::StatusOr<uint64_t> Uplink::Probe(const v1::ProcessKey& process, absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(After(timeout));
  std::unique_ptr<grpc::ClientReaderWriter<v1::EventBatch, v1::IngestAck>> stream =
      stub_->Ingest(&context);
  v1::EventBatch probe;  // sequence 0, no events: the collector answers without storing
  *probe.mutable_process() = process;
  v1::IngestAck ack;
  const bool answered = stream->Write(probe) && stream->Read(&ack);
  stream->WritesDone();
  v1::IngestAck extra;
  while (stream->Read(&extra)) {
  }
  grpc::Status status = stream->Finish();
  if (!answered) {
    return status.ok() ? absl::UnavailableError("the collector closed the stream unanswered")
                       : FromGrpc(status);
  }
  // A rejected probe (a key the collector cannot file) is an answer too: it holds nothing of
  // that process; the batches will be rejected and quarantined one by one.
  return ack.acked_sequence();
}

void Uplink::Run() {
  absl::Duration backoff = options_.initial_backoff;
  bool first = true;
  while (!stopping()) {
    absl::Status status;
    bool acked_any = false;
    // Our backoff decides when to try again, not the channel's own (which may have grown
    // further), so a restarted collector is found at the next attempt. Waiting in short steps
    // keeps Stop() prompt while the collector is down.
    grpc::experimental::ChannelResetConnectionBackoff(channel_.get());
    if (!channel_->WaitForConnected(After(absl::Milliseconds(200)))) {
      status = absl::UnavailableError(
          absl::StrFormat("cannot reach the collector at %s (is vramscope-collector running "
                          "there? see --collector)",
                          options_.collector));
    } else {
      grpc::ClientContext context;
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) break;
        context_ = &context;
      }
      if (!first) outbox_->CountReconnect();
      first = false;
      outbox_->SetConnected(true);
      status = RunStream(&context, &acked_any);
      absl::MutexLock lock(&mu_);
      context_ = nullptr;
    }
    outbox_->SetConnected(false);
    {
      absl::MutexLock lock(&mu_);
      last_error_ = status;
      if (stopping_) break;
    }
    if (acked_any) backoff = options_.initial_backoff;
    AgentCounters counters = outbox_->counters();
    Log(LogLevel::kWarning,
        absl::StrFormat("collector %s: %s; retrying in %s (%d batches unacknowledged, %d "
                        "spooled so far)",
                        options_.collector, status.ok() ? "stream closed" : status.ToString(),
                        absl::FormatDuration(backoff), counters.pending_batches,
                        counters.batches_spooled));
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), backoff);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

absl::Status Uplink::RunStream(grpc::ClientContext* context, bool* acked_any) {
  std::unique_ptr<grpc::ClientReaderWriter<v1::EventBatch, v1::IngestAck>> stream =
      stub_->Ingest(context);
  outbox_->Rewind();  // everything unacknowledged goes out again on this stream
  std::atomic<bool> broken{false};
  std::thread reader([&] {
    v1::IngestAck ack;
    while (stream->Read(&ack)) {
      // A rejected batch is quarantined before the acknowledgement that may cover its sequence
      // (the collector records it as consumed) would forget it.
      if (ack.rejected()) {
        outbox_->Reject(ack.process(), ack.rejected_sequence(), ack.reject_reason());
      }
      outbox_->Ack(ack.process(), ack.acked_sequence());
      *acked_any = true;
      ever_connected_.store(true);
    }
    broken.store(true);
    outbox_->Interrupt();
  });
  while (!broken.load() && !stopping()) {
    std::shared_ptr<const v1::EventBatch> batch = outbox_->NextToSend(absl::Milliseconds(100));
    if (batch == nullptr) continue;
    if (!stream->Write(*batch)) break;
  }
  stream->WritesDone();
  reader.join();
  return FromGrpc(stream->Finish());
}

}  // namespace vramscope::agent
