#include "top/watch_source.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <chrono>

#include "top/top_model.h"

namespace vramscope::cli::top {
namespace {

std::chrono::system_clock::time_point Deadline(absl::Duration from_now) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(from_now);
}

}  // namespace

WatchSource::WatchSource(WatchSourceOptions options)
    : options_(std::move(options)),
      channel_(net::MakeChannel(options_.address, options_.credentials)),
      stub_(v1::Collector::NewStub(channel_)) {}

WatchSource::~WatchSource() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status WatchSource::Connect() {
  if (!channel_->WaitForConnected(Deadline(options_.connect_timeout))) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach the collector at ", options_.address, " within ",
                     absl::FormatDuration(options_.connect_timeout),
                     "; start vramscope-collector there or check --collector HOST:PORT (",
                     net::ConnectHint(options_.credentials), ")"));
  }
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void WatchSource::Loop() {
  absl::Duration backoff = absl::Milliseconds(100);
  for (;;) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      context_ = &context;
    }
    v1::WatchRequest request;
    request.set_interval_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.interval)));
    std::unique_ptr<grpc::ClientReader<v1::StatsUpdate>> reader = stub_->Watch(&context, request);
    v1::StatsUpdate update;
    while (reader->Read(&update)) {
      {
        absl::MutexLock lock(&mu_);
        update_ = update;
        status_.clear();
        broken_ = false;
      }
      backoff = absl::Milliseconds(100);
      MaybeFetchReport(*stub_);
    }
    const grpc::Status status = reader->Finish();
    absl::MutexLock lock(&mu_);
    context_ = nullptr;
    if (stopping_) return;
    broken_ = true;
    // "reconnecting" first: on an 80-column status line gRPC's reason is what gets cut.
    error_ = status.error_message().empty() ? "stream ended" : status.error_message();
    status_ = absl::StrCat("reconnecting to the collector at ", options_.address, ": ", error_);
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
    key = ProcessKeyText(*wanted_);
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
  auto ready = [this]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return update_.has_value() || broken_; };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  std::optional<v1::StatsUpdate> out = std::move(update_);
  update_.reset();
  return out;
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
