#include "top/watch_source.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "top/top_model.h"
#include "vramscope/process_key.h"

namespace vramscope::cli::top {
namespace {

std::chrono::system_clock::time_point Deadline(absl::Duration from_now) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(from_now);
}

}  // namespace

static uint64_t HighestHeld(const v1::ProcessStats& stats) {
  uint64_t highest = 0;
  for (const v1::SequenceRange& range : stats.held()) highest = std::max(highest, range.last());
  return highest;
}

v1::StatsUpdate MergeStatsUpdates(const std::vector<v1::StatsUpdate>& updates) {
  if (updates.size() == 1) return updates[0];
  v1::StatsUpdate merged;
  std::map<std::string, std::vector<const v1::ProcessStats*>> by_key;
  for (const v1::StatsUpdate& update : updates) {
    merged.set_time_ns(std::max(merged.time_ns(), update.time_ns()));
    for (const v1::ProcessStats& stats : update.processes()) {
      by_key[ProcessKeyString(stats.process())].push_back(&stats);
    }
  }
  for (auto& [key, parts] : by_key) {
    std::stable_sort(parts.begin(), parts.end(), [](const auto* a, const auto* b) {
      return HighestHeld(*a) > HighestHeld(*b);
    });
    v1::ProcessStats* out = merged.add_processes();
    *out = *parts[0];  // the collector holding its latest batches: what is "now"
    for (size_t i = 1; i < parts.size(); ++i) {
      for (const v1::DeviceReport& device : parts[i]->devices()) {
        for (v1::DeviceReport& into : *out->mutable_devices()) {
          if (into.device().ordinal() != device.device().ordinal()) continue;
          into.set_alloc_count(into.alloc_count() + device.alloc_count());
          into.set_free_count(into.free_count() + device.free_count());
          into.set_dropped_records(into.dropped_records() + device.dropped_records());
          into.set_peak_allocated_bytes(
              std::max(into.peak_allocated_bytes(), device.peak_allocated_bytes()));
          into.set_peak_reserved_bytes(
              std::max(into.peak_reserved_bytes(), device.peak_reserved_bytes()));
          into.set_peak_requested_bytes(
              std::max(into.peak_requested_bytes(), device.peak_requested_bytes()));
        }
      }
      out->mutable_held()->MergeFrom(parts[i]->held());
    }
  }
  return merged;
}

WatchSource::WatchSource(WatchSourceOptions options) : options_(std::move(options)) {
  std::vector<std::string> addresses =
      absl::StrSplit(options_.address, ',', absl::SkipWhitespace());
  if (addresses.empty()) addresses.push_back(options_.address);
  targets_.resize(addresses.size());
  for (size_t i = 0; i < addresses.size(); ++i) {
    targets_[i].address = addresses[i];
    targets_[i].channel = net::MakeChannel(addresses[i], options_.credentials);
    targets_[i].stub = v1::Collector::NewStub(targets_[i].channel);
  }
}

WatchSource::~WatchSource() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (Target& target : targets_) {
      if (target.context != nullptr) target.context->TryCancel();
    }
  }
  for (std::thread& thread : threads_) thread.join();
}

absl::Status WatchSource::Connect() {
  // Every collector is tried at once; one answering is enough (the others may be down while
  // their agents failed over).
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  bool any = false;
  for (Target& target : targets_) target.channel->GetState(true);
  for (Target& target : targets_) {
    if (target.channel->WaitForConnected(
            Deadline(std::max(deadline - absl::Now(), absl::ZeroDuration())))) {
      any = true;
    }
  }
  if (!any) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach the collector at ", options_.address, " within ",
                     absl::FormatDuration(options_.connect_timeout),
                     "; start vramscope-collector there or check --collector HOST:PORT (",
                     net::ConnectHint(options_.credentials), ")"));
  }
  for (size_t i = 0; i < targets_.size(); ++i) threads_.emplace_back([this, i] { Loop(i); });
  return absl::OkStatus();
}

void WatchSource::Loop(size_t index) {
  Target& target = targets_[index];
  absl::Duration backoff = absl::Milliseconds(100);
  for (;;) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      target.context = &context;
    }
    v1::WatchRequest request;
    request.set_interval_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.interval)));
    std::unique_ptr<grpc::ClientReader<v1::StatsUpdate>> reader =
        target.stub->Watch(&context, request);
    v1::StatsUpdate update;
    while (reader->Read(&update)) {
      {
        absl::MutexLock lock(&mu_);
        target.latest = update;
        target.broken = false;
        fresh_ = true;
        broken_ = false;
        status_.clear();
      }
      backoff = absl::Milliseconds(100);
      MaybeFetchReport(*target.stub);
    }
    const grpc::Status status = reader->Finish();
    absl::MutexLock lock(&mu_);
    target.context = nullptr;
    if (stopping_) return;
    target.broken = true;
    broken_ = std::all_of(targets_.begin(), targets_.end(),
                          [](const Target& t) { return t.broken || !t.latest.has_value(); });
    // "reconnecting" first: on an 80-column status line gRPC's reason is what gets cut.
    error_ = status.error_message().empty() ? "stream ended" : status.error_message();
    status_ = absl::StrCat("reconnecting to the collector at ", target.address, ": ", error_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

void WatchSource::MaybeFetchReport(v1::Collector::Stub& stub) {
  v1::GetReportRequest request;
  std::string key;
  {
    absl::MutexLock lock(&mu_);
    if (!wanted_) return;
    key = ProcessKeyString(*wanted_);
    if (key == fetched_key_ && absl::Now() - fetched_at_ < options_.report_interval) return;
    *request.mutable_process() = *wanted_;
  }
  grpc::ClientContext context;
  context.set_deadline(Deadline(absl::Seconds(2)));
  v1::Report report;
  const grpc::Status status = stub.GetReport(&context, request, &report);
  absl::MutexLock lock(&mu_);
  fetched_key_ = key;
  fetched_at_ = absl::Now();
  if (status.ok()) report_ = std::move(report);
}

std::optional<v1::StatsUpdate> WatchSource::TakeUpdate(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return fresh_ || broken_; };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (!fresh_) return std::nullopt;
  fresh_ = false;
  std::vector<v1::StatsUpdate> updates;
  for (const Target& target : targets_) {
    // A collector whose stream broke keeps its last update: its processes stay on the screen
    // (the status line says it is reconnecting).
    if (target.latest.has_value()) updates.push_back(*target.latest);
  }
  if (updates.empty()) return std::nullopt;
  return MergeStatsUpdates(updates);
}

std::optional<v1::Report> WatchSource::TakeReport() {
  absl::MutexLock lock(&mu_);
  std::optional<v1::Report> out = std::move(report_);
  report_.reset();
  return out;
}

void WatchSource::SetWantedReport(const v1::ProcessKey& key) {
  absl::MutexLock lock(&mu_);
  wanted_ = key;
}

std::string WatchSource::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

std::string WatchSource::last_error() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

bool WatchSource::broken() const {
  absl::MutexLock lock(&mu_);
  return broken_;
}

}  // namespace vramscope::cli::top
