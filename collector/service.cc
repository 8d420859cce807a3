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

#include "history/history_store.h"
#include "history/history_writer.h"
#include "vramscope/collector/batch_check.h"
#include "vramscope/log.h"
#include "vramscope/process_key.h"
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
      {absl::StrCat(service, "ListRuns"), net::Role::kReader},
      {absl::StrCat(service, "GetRun"), net::Role::kReader},
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
  IngestReactor(Collector* collector, std::string peer, bool takeover, std::string writer)
      : collector_(collector),
        peer_(std::move(peer)),
        takeover_(takeover),
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
    // mallocs and frees per event (they dominated the ingest profile); allocations and frees
    // are not parsed into messages at all but decoded into scratch_ (a third of the parse's
    // instructions).
    arena_.Reset();
    IngestMessage message = CheckIngestMessage(wire_, &arena_, &scratch_);
    v1::IngestAck ack;
    switch (message.kind) {
      case IngestMessage::Kind::kMalformed:
        return absl::InvalidArgumentError(message.reason);
      case IngestMessage::Kind::kBatch: {
        absl::StatusOr<uint64_t> acked = collector_->Ingest(message, wire_, takeover_, writer_);
        if (!acked.ok()) return acked.status();
        *ack.mutable_process() = message.batch->process();
        ack.set_acked_sequence(*acked);
        break;
      }
      case IngestMessage::Kind::kRejected: {
        // One bad batch (one process's hostile strings, a bogus key) is answered on its own;
        // the stream, and every other process's batches on it, go on.
        absl::StatusOr<uint64_t> acked = collector_->Refuse(message, takeover_, writer_);
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
  const bool takeover_;
  const std::string writer_;  // the peer's identity: its quota of processes (--max-processes)
  // Touched only by the read path (one read outstanding at a time).
  grpc::ByteBuffer request_;
  std::string wire_;
  std::unique_ptr<char[]> arena_block_;
  google::protobuf::Arena arena_;
  IngestScratch scratch_;
  absl::Mutex mu_;
  grpc::ByteBuffer response_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::IngestAck> pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

class WatchReactor;
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

// A Watch call the guard refused: ends at once with its status.
class RefusedWriteReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RefusedWriteReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

// The watchers and the one thread that feeds them. Lock order: a reactor's mu_, then the hub's
// mu_ (the fan-out thread never holds its mu_ while calling into a reactor).
class WatchHub {
 public:
  explicit WatchHub(Collector* collector) : collector_(collector) {
    thread_ = std::thread([this] { Run(); });
  }
  ~WatchHub() {
    Stop();
    thread_.join();
  }

  // Holds `reactor` until its OnDone; it gets updates when `schedule`. False once stopping: the
  // caller finishes the call with UNAVAILABLE.
  bool Add(const std::shared_ptr<WatchReactor>& reactor, bool schedule);
  void Remove(WatchReactor* reactor);
  // The reactor's write completed: it is due again `interval` after it was sent.
  void Idle(WatchReactor* reactor, absl::Time due);
  void Stop();
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return watchers_.size();
  }

 private:
  struct Entry {
    std::shared_ptr<WatchReactor> reactor;
    absl::Time due;
    bool busy = false;  // a write in flight
  };
  void Run();

  static constexpr absl::Duration kSnapshotReuse = absl::Milliseconds(20);

  Collector* const collector_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::unordered_map<WatchReactor*, Entry> watchers_;
  std::thread thread_;
};

namespace {

class WatchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  WatchReactor(WatchHub* hub, v1::WatchRequest request)
      : hub_(hub),
        request_(std::move(request)),
        interval_(ClampWatchInterval(request_.interval_ms())),
        key_(request_.processes().empty() ? std::string() : request_.SerializeAsString()) {}

  const v1::WatchRequest& request() const { return request_; }
  // Watchers with the same key get the same snapshot (empty: every process).
  const std::string& key() const { return key_; }

  // From the fan-out thread: sends `update` unless the call is over.
  void Send(const grpc::ByteBuffer& update) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    response_ = update;  // shares the slices: serialised once for every watcher
    sent_at_ = absl::Now();
    writing_ = true;
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok || finish_pending_) {  // the client went away, or Stop() waited for this write
      FinishLocked(finish_status_);
      return;
    }
    hub_->Idle(this, sent_at_ + interval_);
  }

  void OnCancel() override { FinishSoon(grpc::Status::OK); }

  // Ends the call once no write is in flight.
  void FinishSoon(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (writing_) {
      finish_pending_ = true;
      finish_status_ = status;
      return;
    }
    FinishLocked(status);
  }

  void OnDone() override {
    // The hub's reference (and any the fan-out thread holds) keeps the object until released.
    hub_->Remove(this);
  }

 private:
  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  WatchHub* const hub_;
  const v1::WatchRequest request_;
  const absl::Duration interval_;
  const std::string key_;
  std::mutex mu_;
  grpc::ByteBuffer response_;
  absl::Time sent_at_;
  bool writing_ = false;
  bool finish_pending_ = false;
  grpc::Status finish_status_;
  bool finished_ = false;
};

grpc::ByteBuffer Serialize(const v1::StatsUpdate& update) {
  std::string bytes = update.SerializeAsString();
  grpc::Slice slice(std::move(bytes));
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace

bool WatchHub::Add(const std::shared_ptr<WatchReactor>& reactor, bool schedule) {
  std::lock_guard<std::mutex> lock(mu_);
  watchers_[reactor.get()] = Entry{reactor, absl::InfinitePast(), stopping_ || !schedule};
  wake_.notify_one();
  return !stopping_;
}

void WatchHub::Remove(WatchReactor* reactor) {
  std::shared_ptr<WatchReactor> last;  // destroyed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  auto it = watchers_.find(reactor);
  if (it == watchers_.end()) return;
  last = std::move(it->second.reactor);
  watchers_.erase(it);
}

void WatchHub::Idle(WatchReactor* reactor, absl::Time due) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = watchers_.find(reactor);
  if (it == watchers_.end()) return;
  it->second.busy = false;
  it->second.due = due;
  wake_.notify_one();
}

void WatchHub::Stop() {
  std::vector<std::shared_ptr<WatchReactor>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& [ptr, entry] : watchers_) all.push_back(entry.reactor);
    wake_.notify_one();
  }
  for (const auto& reactor : all) {
    reactor->FinishSoon(grpc::Status(grpc::StatusCode::UNAVAILABLE, "collector shutting down"));
  }
}

void WatchHub::Run() {
  std::vector<std::shared_ptr<WatchReactor>> due;
  // Snapshots by request, reused for kSnapshotReuse: watchers fall due at scattered moments, and
  // a snapshot (a report per process) costs far more than a write.
  struct Snapshot {
    grpc::ByteBuffer bytes;
    absl::Time taken;
  };
  std::unordered_map<std::string, Snapshot> snapshots;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    const absl::Time now = absl::Now();
    absl::Time next = absl::InfiniteFuture();
    due.clear();
    for (auto& [ptr, entry] : watchers_) {
      if (entry.busy) continue;
      if (entry.due <= now) {
        entry.busy = true;
        due.push_back(entry.reactor);
      } else {
        next = std::min(next, entry.due);
      }
    }
    if (due.empty()) {
      if (next == absl::InfiniteFuture()) {
        wake_.wait(lock);
      } else {
        wake_.wait_for(lock, absl::ToChronoNanoseconds(next - now));
      }
      continue;
    }
    lock.unlock();
    // One snapshot per distinct request, unless one was taken less than kSnapshotReuse ago.
    for (auto it = snapshots.begin(); it != snapshots.end();) {
      it = now - it->second.taken >= kSnapshotReuse ? snapshots.erase(it) : std::next(it);
    }
    for (const std::shared_ptr<WatchReactor>& reactor : due) {
      auto [it, inserted] = snapshots.try_emplace(reactor->key());
      if (inserted) {
        it->second.bytes = Serialize(collector_->Snapshot(reactor->request()));
        it->second.taken = now;
      }
      reactor->Send(it->second.bytes);
    }
    due.clear();
    lock.lock();
  }
}

CollectorService::CollectorService(Collector* collector, const net::ServerGuard* guard)
    : collector_(collector), hub_(std::make_unique<WatchHub>(collector)), guard_(guard) {}

CollectorService::~CollectorService() = default;

size_t CollectorService::watchers() const { return hub_->size(); }

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* CollectorService::Ingest(
    grpc::CallbackServerContext* context) {
  net::Peer peer;
  if (grpc::Status allowed = guard_->Authorize(*context, MethodName("Ingest"), &peer);
      !allowed.ok()) {
    return new RefusedReactor(Refused(*context, "Ingest", allowed));
  }
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kFailoverMetadata);
  const bool takeover = it != metadata.end() && it->second == "1";
  return new IngestReactor(collector_, context->peer(), takeover, std::move(peer.identity));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* CollectorService::Watch(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  net::Peer peer;
  if (grpc::Status allowed = guard_->Authorize(*context, MethodName("Watch"), &peer);
      !allowed.ok()) {
    return new RefusedWriteReactor(Refused(*context, "Watch", allowed));
  }
  v1::WatchRequest parsed;
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (request->Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
  }
  const bool valid = parsed.ParseFromString(bytes);
  auto reactor = std::make_shared<WatchReactor>(hub_.get(), std::move(parsed));
  // Added even when it is to be finished at once: the hub holds every reactor until OnDone.
  if (!hub_->Add(reactor, /*schedule=*/valid)) {
    reactor->FinishSoon(grpc::Status(grpc::StatusCode::UNAVAILABLE, "collector shutting down"));
  } else if (!valid) {
    reactor->FinishSoon(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the request is not a WatchRequest"));
  }
  return reactor.get();
}

grpc::Status CollectorService::GetReport(grpc::ServerContext* context,
                                         const v1::GetReportRequest* request,
                                         v1::Report* response) {
  net::Peer peer;
  if (grpc::Status allowed = guard_->Authorize(*context, MethodName("GetReport"), &peer);
      !allowed.ok()) {
    return Refused(*context, "GetReport", allowed);
  }
  absl::StatusOr<v1::Report> report =
      collector_->GetReport(request->process(), {request->skip().begin(), request->skip().end()});
  if (!report.ok()) return ToGrpcStatus(report.status());
  *response = std::move(*report);
  return grpc::Status::OK;
}

namespace {

absl::StatusOr<HistoryStore*> HistoryOf(const Collector& collector) {
  if (collector.history() == nullptr) {
    return absl::FailedPreconditionError(
        "this collector keeps no run history (started with --database=off)");
  }
  return collector.history()->store();
}

}  // namespace

grpc::Status CollectorService::ListRuns(grpc::ServerContext* context,
                                        const v1::ListRunsRequest* request,
                                        v1::ListRunsResponse* response) {
  net::Peer peer;
  if (grpc::Status allowed = guard_->Authorize(*context, MethodName("ListRuns"), &peer);
      !allowed.ok()) {
    return Refused(*context, "ListRuns", allowed);
  }
  absl::StatusOr<HistoryStore*> store = HistoryOf(*collector_);
  if (!store.ok()) return ToGrpcStatus(store.status());
  absl::StatusOr<v1::ListRunsResponse> runs = (*store)->List(*request);
  if (!runs.ok()) return ToGrpcStatus(runs.status());
  *response = *std::move(runs);
  return grpc::Status::OK;
}

grpc::Status CollectorService::GetRun(grpc::ServerContext* context,
                                      const v1::GetRunRequest* request, v1::Report* response) {
  net::Peer peer;
  if (grpc::Status allowed = guard_->Authorize(*context, MethodName("GetRun"), &peer);
      !allowed.ok()) {
    return Refused(*context, "GetRun", allowed);
  }
  absl::StatusOr<HistoryStore*> store = HistoryOf(*collector_);
  if (!store.ok()) return ToGrpcStatus(store.status());
  absl::StatusOr<v1::Report> report = (*store)->Get(request->run_id());
  if (!report.ok()) return ToGrpcStatus(report.status());
  *response = *std::move(report);
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

void CollectorService::Stop() { hub_->Stop(); }

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
