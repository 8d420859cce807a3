#include "history/history_writer.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/strip.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "vramscope/atomic_file.h"
#include "vramscope/log.h"

namespace vramscope::collector {
namespace {

constexpr absl::string_view kSuffix = ".run";

// Queue files: 0600 (reports name hosts and commands), no fsync (the queue protects against the
// collector dying; the database is the durable copy).
constexpr AtomicWriteOptions kQueueWrite{.new_file_mode = 0600, .sync = false};

}  // namespace

HistoryWriter::HistoryWriter(HistoryWriterOptions options, std::unique_ptr<HistoryStore> store)
    : options_(std::move(options)), store_(std::move(store)) {}

absl::StatusOr<std::unique_ptr<HistoryWriter>> HistoryWriter::Start(
    HistoryWriterOptions options, std::unique_ptr<HistoryStore> store) {
  if (::mkdir(options.queue_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat(options.queue_dir, ": ", strerror(errno)));
  }
  std::unique_ptr<HistoryWriter> writer(new HistoryWriter(std::move(options), std::move(store)));
  if (absl::Status s = writer->ScanQueue(); !s.ok()) return s;
  writer->thread_ = std::thread([w = writer.get()] { w->Run(); });
  return writer;
}

HistoryWriter::~HistoryWriter() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status HistoryWriter::ScanQueue() {
  DIR* dir = ::opendir(options_.queue_dir.c_str());
  if (dir == nullptr) {
    return absl::InternalError(absl::StrCat(options_.queue_dir, ": ", strerror(errno)));
  }
  std::vector<std::pair<uint64_t, std::string>> found;
  while (const dirent* entry = ::readdir(dir)) {
    absl::string_view name = entry->d_name;
    uint64_t number;
    if (!absl::ConsumeSuffix(&name, kSuffix) || !absl::SimpleAtoi(name, &number)) continue;
    found.emplace_back(number, absl::StrCat(options_.queue_dir, "/", entry->d_name));
  }
  ::closedir(dir);
  std::sort(found.begin(), found.end());
  absl::MutexLock lock(&mu_);
  for (const auto& [number, path] : found) {
    queue_.push_back(path);
    next_number_ = std::max(next_number_, number + 1);
  }
  if (!found.empty()) {
    Log(LogLevel::kInfo, absl::StrFormat("history: %d run(s) queued from before in %s",
                                         found.size(), options_.queue_dir));
  }
  return absl::OkStatus();
}

absl::Status HistoryWriter::Enqueue(const v1::Report& report) {
  uint64_t number;
  {
    absl::MutexLock lock(&mu_);
    number = next_number_++;
  }
  const std::string path = absl::StrFormat("%s/%020d%s", options_.queue_dir, number, kSuffix);
  if (absl::Status s = WriteFileAtomically(path, report.SerializeAsString(), kQueueWrite);
      !s.ok()) {
    return s;
  }
  absl::MutexLock lock(&mu_);
  // Numbers are taken in order but files may land out of order: keep the queue sorted.
  queue_.insert(std::upper_bound(queue_.begin(), queue_.end(), path), path);
  return absl::OkStatus();
}

bool HistoryWriter::SendOldest(const std::string& path, bool* failing) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  v1::Report report;
  if (!in || !report.ParseFromString(bytes.str())) {
    Log(LogLevel::kError, absl::StrFormat("history: %s is not a report; set aside as .bad", path));
    ::rename(path.c_str(), (path + ".bad").c_str());
    return true;
  }
  if (absl::Status s = store_->Insert(report); !s.ok()) {
    // Once per outage, not once per retry.
    if (!*failing) {
      Log(LogLevel::kWarning,
          absl::StrFormat("history: the database refused (%s); runs stay queued in %s and are "
                          "retried",
                          s.message(), options_.queue_dir));
    }
    *failing = true;
    return false;
  }
  if (*failing) Log(LogLevel::kInfo, "history: the database is back; sending the queued runs");
  *failing = false;
  ::unlink(path.c_str());
  return true;
}

bool HistoryWriter::WorkOrStop() const { return stop_ || !queue_.empty(); }
bool HistoryWriter::Idle() const { return queue_.empty(); }

void HistoryWriter::Run() {
  absl::Duration backoff = options_.retry_min;
  bool failing = false;
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (queue_.empty()) {
      mu_.Await(absl::Condition(this, &HistoryWriter::WorkOrStop));
      continue;
    }
    const std::string path = queue_.front();
    mu_.Unlock();
    const bool sent = SendOldest(path, &failing);
    mu_.Lock();
    if (sent) {
      queue_.pop_front();
      ++written_;
      backoff = options_.retry_min;
      continue;
    }
    // The database is down or refused: wait (a stop ends the wait), then try again.
    mu_.AwaitWithTimeout(absl::Condition(&stop_), backoff);
    backoff = std::min(backoff * 2, options_.retry_max);
  }
}

std::size_t HistoryWriter::pending() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

uint64_t HistoryWriter::written() const {
  absl::MutexLock lock(&mu_);
  return written_;
}

bool HistoryWriter::WaitIdle(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(this, &HistoryWriter::Idle), timeout);
}

}  // namespace vramscope::collector
