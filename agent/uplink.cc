#include "vramscope/agent/uplink.h"

#include <absl/strings/str_format.h>
#include <absl/strings/str_split.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "vramscope/log.h"

namespace vramscope::agent {
namespace {

absl::Status FromGrpc(const grpc::Status& status) {
  // grpc::StatusCode and absl::StatusCode share their numbering (google.rpc.Code).
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// Collector.Ingest with the batches written as the Outbox holds them, serialized: the generated
// stub would take a v1::EventBatch and serialize it again. The collector sees the same bytes.
// This is the stub's own construction (collector.grpc.pb.cc) with grpc::ByteBuffer, for which
// gRPC has its SerializationTraits, as the message type written.
using RawIngestStream = grpc::ClientReaderWriter<grpc::ByteBuffer, v1::IngestAck>;
constexpr char kIngestMethod[] = "/vramscope.v1.Collector/Ingest";

std::unique_ptr<RawIngestStream> OpenRawIngest(grpc::Channel* channel,
                                               grpc::ClientContext* context) {
  const grpc::internal::RpcMethod method(kIngestMethod, grpc::internal::RpcMethod::BIDI_STREAMING);
  return std::unique_ptr<RawIngestStream>(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, v1::IngestAck>::Create(
          channel, method, context));
}

// A ByteBuffer over `bytes` without copying them: the slice holds a reference until gRPC is done.
grpc::ByteBuffer WrapBytes(std::shared_ptr<const std::string> bytes) {
  auto* held = new std::shared_ptr<const std::string>(std::move(bytes));
  grpc::Slice slice(
      const_cast<char*>((*held)->data()), (*held)->size(),
      [](void* user_data) { delete static_cast<std::shared_ptr<const std::string>*>(user_data); },
      held);
  return grpc::ByteBuffer(&slice, 1);
}

std::chrono::system_clock::time_point After(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

uint64_t Fnv1a(absl::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  // A final mix (splitmix64): FNV's low bits alone spread similar strings poorly.
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

// The metadata key the collector's service looks for (collector/service.h kFailoverMetadata).
constexpr char kFailoverMetadata[] = "vramscope-failover";

}  // namespace

std::vector<std::string> CollectorOrder(const std::string& host,
                                        const std::vector<std::string>& collectors) {
  std::vector<std::pair<uint64_t, std::string>> scored;
  for (const std::string& address : collectors) {
    scored.emplace_back(Fnv1a(absl::StrCat(host, "\n", address)), address);
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> order;
  for (auto& [score, address] : scored) order.push_back(std::move(address));
  return order;
}

std::shared_ptr<grpc::Channel> MakeCollectorChannel(const std::string& address,
                                                    const UplinkOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  // gRPC's own reconnect backoff grows to two minutes; a restarted collector should be found
  // within our own backoff.
  const int max_ms = static_cast<int>(absl::ToInt64Milliseconds(options.max_backoff));
  const int initial_ms = static_cast<int>(absl::ToInt64Milliseconds(options.initial_backoff));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::max(initial_ms, 1));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::max(initial_ms, 1));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, std::max(max_ms, 1));
  return net::MakeChannel(address, options.credentials, args);
}

Uplink::Uplink(Outbox* outbox, UplinkOptions options)
    : outbox_(outbox), options_(std::move(options)) {
  std::vector<std::string> addresses =
      absl::StrSplit(options_.collector, ',', absl::SkipWhitespace());
  if (addresses.empty()) addresses.push_back(options_.collector);
  if (addresses.size() > 1) {
    addresses = CollectorOrder(options_.host.empty() ? HostName() : options_.host, addresses);
  }
  for (std::string& address : addresses) {
    Target target;
    target.address = std::move(address);
    target.channel = MakeCollectorChannel(target.address, options_);
    target.stub = v1::Collector::NewStub(target.channel);
    targets_.push_back(std::move(target));
  }
}

std::string Uplink::current() const { return targets_[active_.load()].address; }

void Uplink::PrepareContext(grpc::ClientContext* context) const {
  if (several()) context->AddMetadata(kFailoverMetadata, "1");
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
  PrepareContext(&context);
  std::unique_ptr<grpc::ClientReaderWriter<v1::EventBatch, v1::IngestAck>> stream =
      targets_[active_.load()].stub->Ingest(&context);
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
  size_t failed_in_row = 0;  // collectors tried in a row without an acknowledgement
  while (!stopping()) {
    absl::Status status;
    bool acked_any = false;
    const size_t position = active_.load();
    Target& target = targets_[position];
    // Our backoff decides when to try again, not the channel's own (which may have grown
    // further), so a restarted collector is found at the next attempt. Waiting in short steps
    // keeps Stop() prompt while the collector is down.
    grpc::experimental::ChannelResetConnectionBackoff(target.channel.get());
    if (!target.channel->WaitForConnected(After(absl::Milliseconds(200)))) {
      status = absl::UnavailableError(
          absl::StrFormat("cannot reach the collector at %s (is vramscope-collector running "
                          "there? see --collector)",
                          target.address));
    } else {
      grpc::ClientContext context;
      PrepareContext(&context);
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) break;
        context_ = &context;
      }
      if (!first) outbox_->CountReconnect();
      first = false;
      outbox_->SetConnected(true);
      status = RunStream(&context, &acked_any, position);
      absl::MutexLock lock(&mu_);
      context_ = nullptr;
    }
    outbox_->SetConnected(false);
    if (absl::IsAborted(status) && position != 0) {
      // The preferred collector answers again and nothing is in flight: go back to it.
      Log(LogLevel::kInfo, absl::StrFormat("collector %s is back: switching to it from %s",
                                           targets_[0].address, target.address));
      active_.store(0);
      switches_.fetch_add(1);
      failed_in_row = 0;
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      last_error_ = status;
      if (stopping_) break;
    }
    if (acked_any) {
      backoff = options_.initial_backoff;
      failed_in_row = 0;
    }
    AgentCounters counters = outbox_->counters();
    if (several()) {
      // Fail over to the next collector in this host's order at once; back off only after every
      // collector failed in a row.
      const size_t next = (position + 1) % targets_.size();
      Log(LogLevel::kWarning,
          absl::StrFormat("collector %s: %s; failing over to %s (%d batches unacknowledged)",
                          target.address, status.ok() ? "stream closed" : status.ToString(),
                          targets_[next].address, counters.pending_batches));
      active_.store(next);
      switches_.fetch_add(1);
      if (++failed_in_row < targets_.size()) continue;
      failed_in_row = 0;
    } else {
      Log(LogLevel::kWarning,
          absl::StrFormat("collector %s: %s; retrying in %s (%d batches unacknowledged, %d "
                          "spooled so far)",
                          target.address, status.ok() ? "stream closed" : status.ToString(),
                          absl::FormatDuration(backoff), counters.pending_batches,
                          counters.batches_spooled));
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), backoff);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

absl::Status Uplink::RunStream(grpc::ClientContext* context, bool* acked_any, size_t position) {
  std::unique_ptr<RawIngestStream> stream =
      OpenRawIngest(targets_[position].channel.get(), context);
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
  absl::Time next_check = absl::Now() + options_.return_check;
  bool returning = false;
  bool returned = false;
  while (!broken.load() && !stopping()) {
    if (position != 0 && absl::Now() >= next_check) {
      next_check = absl::Now() + options_.return_check;
      // GetState(true) makes the channel try to connect if idle.
      if (targets_[0].channel->GetState(true) == GRPC_CHANNEL_READY) returning = true;
    }
    if (returning) {
      // A batch boundary: nothing sent is left unanswered here, so what goes to the preferred
      // collector from now on is stored once.
      if (outbox_->WaitNothingInFlight(absl::Milliseconds(100))) {
        returned = true;
        break;
      }
      continue;
    }
    std::shared_ptr<const std::string> batch = outbox_->NextToSendBytes(absl::Milliseconds(100));
    if (batch == nullptr) continue;
    if (!stream->Write(WrapBytes(std::move(batch)))) break;
  }
  stream->WritesDone();
  reader.join();
  absl::Status status = FromGrpc(stream->Finish());
  if (returned) {
    return absl::AbortedError("returning to the preferred collector");
  }
  return status;
}

}  // namespace vramscope::agent
