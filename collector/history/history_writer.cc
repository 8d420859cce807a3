#include "history/history_writer.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/strip.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "history/run_summary.h"
#include "vramscope/atomic_file.h"
#include "vramscope/log.h"

namespace vramscope::collector {
namespace {

constexpr absl::string_view kSuffix = ".run";
constexpr absl::string_view kJournal = "journal";

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
  if (journal_fd_ >= 0) ::close(journal_fd_);
}

std::string HistoryWriter::PathOf(uint64_t number, absl::string_view suffix) const {
  return absl::StrFormat("%s/%020d%s", options_.queue_dir, number, suffix);
}

absl::Status HistoryWriter::ScanQueue() {
  DIR* dir = ::opendir(options_.queue_dir.c_str());
  if (dir == nullptr) {
    return absl::InternalError(absl::StrCat(options_.queue_dir, ": ", strerror(errno)));
  }
  std::vector<uint64_t> found;
  while (const dirent* entry = ::readdir(dir)) {
    absl::string_view name = entry->d_name;
    uint64_t number;
    if (absl::ConsumeSuffix(&name, kSuffix) && absl::SimpleAtoi(name, &number)) {
      found.push_back(number);
    }
  }
  ::closedir(dir);
  // The journal names the runs handed to EnqueueBuild since the thread last had built them all:
  // those without a .run were not built when the collector stopped, and are built now from their
  // logs. One built and already sent is sent again, which changes nothing (HistoryStore::Insert).
  const std::string journal = absl::StrCat(options_.queue_dir, "/", kJournal);
  std::ifstream in(journal);
  std::vector<uint64_t> numbers;
  for (std::string line; std::getline(in, line);) {
    const size_t space = line.find(' ');
    uint64_t number;
    if (space == std::string::npos || !absl::SimpleAtoi(line.substr(0, space), &number)) continue;
    numbers.push_back(number);
    if (std::find(found.begin(), found.end(), number) != found.end()) continue;
    if (RebuildRun(number, line.substr(space + 1))) found.push_back(number);
  }
  in.close();
  journal_fd_ = ::open(journal.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
  if (journal_fd_ < 0) return absl::InternalError(absl::StrCat(journal, ": ", strerror(errno)));
  std::sort(found.begin(), found.end());
  const absl::Time now = Now();
  absl::MutexLock lock(&mu_);
  for (uint64_t number : found) {
    queue_.push_back({number, now});
    next_number_ = std::max(next_number_, number + 1);
  }
  for (uint64_t number : numbers) next_number_ = std::max(next_number_, number + 1);
  if (!found.empty()) {
    Log(LogLevel::kInfo, absl::StrFormat("history: %d run(s) queued from before in %s",
                                         found.size(), options_.queue_dir));
  }
  return absl::OkStatus();
}

bool HistoryWriter::RebuildRun(uint64_t number, const std::string& log_path) {
  absl::StatusOr<v1::Report> report =
      options_.rebuild ? options_.rebuild(log_path)
                       : absl::StatusOr<v1::Report>(absl::UnimplementedError("no rebuild"));
  absl::Status status = report.status();
  if (status.ok()) {
    status = WriteFileAtomically(PathOf(number, kSuffix), report->SerializeAsString(), kQueueWrite);
  }
  if (!status.ok()) {
    Log(LogLevel::kError, absl::StrFormat("history: the run of %s is not in the history: its "
                                          "report cannot be rebuilt (%s)",
                                          log_path, status.message()));
  }
  return status.ok();
}

absl::Status HistoryWriter::Enqueue(const v1::Report& report) {
  uint64_t number;
  {
    absl::MutexLock lock(&mu_);
    number = next_number_++;
  }
  if (absl::Status s =
          WriteFileAtomically(PathOf(number, kSuffix), report.SerializeAsString(), kQueueWrite);
      !s.ok()) {
    return s;
  }
  const absl::Time now = Now();
  absl::MutexLock lock(&mu_);
  // Numbers are taken in order but files may land out of order: keep the queue sorted.
  const Queued queued{number, now};
  queue_.insert(
      std::upper_bound(queue_.begin(), queue_.end(), queued,
                       [](const Queued& a, const Queued& b) { return a.number < b.number; }),
      queued);
  return absl::OkStatus();
}

absl::Status HistoryWriter::EnqueueBuild(const std::string& log_path,
                                         std::function<v1::Report()> build) {
  // One line appended to the open journal (no file created: that costs the ingest thread as much
  // as a large batch on ext4), so the run survives a crash before the thread has built it.
  const absl::Time now = Now();
  absl::MutexLock lock(&mu_);
  const uint64_t number = next_number_++;
  const std::string line = absl::StrCat(number, " ", log_path, "\n");
  const ssize_t n = ::write(journal_fd_, line.data(), line.size());
  if (n != static_cast<ssize_t>(line.size())) {
    return absl::InternalError(absl::StrCat(options_.queue_dir, "/", kJournal, ": ",
                                            n < 0 ? strerror(errno) : "short write"));
  }
  to_build_.push_back({number, now, std::move(build)});
  return absl::OkStatus();
}

void HistoryWriter::CountWritten(uint64_t number, absl::Time since, absl::Time now, bool forced) {
  ++stats_.written;
  if (number > held_through_) return;
  ++stats_.deferred;
  if (forced) ++stats_.forced;
  stats_.longest_deferral = std::max(stats_.longest_deferral, now - since);
}

bool HistoryWriter::Store(const v1::RunSummary& run, absl::string_view report) {
  if (absl::Status s = store_->InsertRow(run, report); !s.ok()) {
    // Once per outage, not once per retry.
    if (!failing_) {
      Log(LogLevel::kWarning,
          absl::StrFormat("history: the database refused (%s); runs stay queued in %s and are "
                          "retried",
                          s.message(), options_.queue_dir));
    }
    failing_ = true;
    return false;
  }
  if (failing_) Log(LogLevel::kInfo, "history: the database is back; sending the queued runs");
  failing_ = false;
  return true;
}

void HistoryWriter::BuildOldest(bool forced) {
  // Called with mu_ held and to_build_ not empty; only this thread pops it.
  const ToBuild& oldest = to_build_.front();
  const uint64_t number = oldest.number;
  const absl::Time since = oldest.since;
  std::function<v1::Report()> build = std::move(to_build_.front().build);
  const bool try_database = !failing_;
  mu_.Unlock();
  // Built, summarized and serialized once; the bytes go straight to the database. A queue file
  // is written only when the database does not take them (a crash before that is covered by the
  // journal line: the run is rebuilt from its log).
  std::string bytes;
  v1::RunSummary run;
  {
    const v1::Report report = build();
    build = nullptr;  // what it held (a finished process's engine) goes now, not with the queue
    run = SummarizeRun(report);
    bytes = report.SerializeAsString();
  }
  const bool stored = try_database && Store(run, bytes);
  const std::string path = PathOf(number, kSuffix);
  absl::Status written = absl::OkStatus();
  if (!stored) {
    written = WriteFileAtomically(path, bytes, kQueueWrite);
    if (!written.ok()) {
      Log(LogLevel::kError, absl::StrFormat("history: %s; the run is rebuilt from its log at the "
                                            "next start",
                                            written.message()));
    }
  }
  mu_.Lock();
  to_build_.pop_front();
  if (stored) {
    CountWritten(number, since, Now(), forced);
  } else if (written.ok()) {
    const Queued queued{number, since};
    queue_.insert(
        std::upper_bound(queue_.begin(), queue_.end(), queued,
                         [](const Queued& a, const Queued& b) { return a.number < b.number; }),
        queued);
  }
  // Every run handed over is in the database or has its .run now: the journal's lines are done
  // with. A failed one keeps them all, for the next start.
  if (to_build_.empty() && written.ok() && !build_failed_) {
    if (::ftruncate(journal_fd_, 0) != 0) build_failed_ = true;
  }
  if (!written.ok()) build_failed_ = true;
}

bool HistoryWriter::SendOldest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  const std::string bytes = contents.str();
  v1::Report report;
  if (!in || !report.ParseFromString(bytes)) {
    Log(LogLevel::kError, absl::StrFormat("history: %s is not a report; set aside as .bad", path));
    ::rename(path.c_str(), (path + ".bad").c_str());
    return true;
  }
  // The file's bytes are the row's report: parsed for its summary only, not serialized again.
  if (!Store(SummarizeRun(report), bytes)) return false;
  ::unlink(path.c_str());
  return true;
}

bool HistoryWriter::Due(absl::Time now, absl::Duration* wait, bool* forced) {
  *forced = false;
  if (!options_.activity || options_.max_defer <= absl::ZeroDuration()) return true;
  const uint64_t activity = options_.activity();
  if (activity != last_activity_ || last_moved_ == absl::InfinitePast()) {
    last_activity_ = activity;
    last_moved_ = now;
  }
  if (now - last_moved_ >= options_.quiet) return true;
  absl::Time oldest = absl::InfiniteFuture();
  if (!to_build_.empty()) oldest = to_build_.front().since;
  if (!queue_.empty()) oldest = std::min(oldest, queue_.front().since);
  if (to_build_.size() > options_.max_waiting || now - oldest >= options_.max_defer) {
    *forced = true;
    return true;
  }
  // Ingest is busy: everything waiting now has been held back.
  if (!to_build_.empty()) held_through_ = std::max(held_through_, to_build_.back().number);
  if (!queue_.empty()) held_through_ = std::max(held_through_, queue_.back().number);
  *wait = std::min(
      {options_.poll, options_.quiet - (now - last_moved_), options_.max_defer - (now - oldest)});
  return false;
}

bool HistoryWriter::WorkOrStop() const { return stop_ || !queue_.empty() || !to_build_.empty(); }
bool HistoryWriter::StopOrBuild() const { return stop_ || !to_build_.empty(); }
bool HistoryWriter::Idle() const { return queue_.empty() && to_build_.empty(); }

void HistoryWriter::Run() {
  // History is never urgent, ingest always is: this thread (reports of finished runs, database
  // writes) waits for ingest to be quiet (Due), and runs at the lowest priority (nice 19, this
  // thread only); its work waits on disk (journal, queue files) meanwhile. BENCHMARKS.md
  // section 7 measures what is left.
  if (::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19) != 0) {
    Log(LogLevel::kWarning,
        absl::StrFormat("history: cannot lower the history thread's priority: %s",
                        strerror(errno)));
  }
  absl::Duration backoff = options_.retry_min;
  absl::Time retry_at = absl::InfinitePast();
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (Idle()) {
      mu_.Await(absl::Condition(this, &HistoryWriter::WorkOrStop));
      continue;
    }
    absl::Time now = Now();
    absl::Duration wait;
    bool forced;
    if (!Due(now, &wait, &forced)) {
      // Ingest is busy: ask again after `wait` (only a stop ends it early).
      mu_.AwaitWithTimeout(absl::Condition(&stop_), wait);
      continue;
    }
    // Built first while the database fails (an outage must not hold engines in memory), else the
    // older queued files first.
    if (!to_build_.empty() && (failing_ || queue_.empty())) {
      const bool was_failing = failing_;
      BuildOldest(forced);
      if (!failing_) {
        backoff = options_.retry_min;
      } else if (!was_failing) {  // the outage starts: the queue is retried after a backoff
        retry_at = now + backoff;
        backoff = std::min(backoff * 2, options_.retry_max);
      }
      continue;
    }
    if (failing_ && now < retry_at) {
      // The database is down or refused: wait (a stop or a run to build ends the wait), then try
      // again.
      mu_.AwaitWithTimeout(absl::Condition(this, &HistoryWriter::StopOrBuild), retry_at - now);
      continue;
    }
    const Queued oldest = queue_.front();
    mu_.Unlock();
    const bool sent = SendOldest(PathOf(oldest.number, kSuffix));
    mu_.Lock();
    now = Now();
    if (sent) {
      queue_.pop_front();
      CountWritten(oldest.number, oldest.since, now, forced);
      backoff = options_.retry_min;
      continue;
    }
    retry_at = now + backoff;
    backoff = std::min(backoff * 2, options_.retry_max);
  }
}

std::size_t HistoryWriter::pending() const {
  absl::MutexLock lock(&mu_);
  return queue_.size() + to_build_.size();
}

uint64_t HistoryWriter::written() const {
  absl::MutexLock lock(&mu_);
  return stats_.written;
}

HistoryWriterStats HistoryWriter::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

bool HistoryWriter::WaitIdle(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(this, &HistoryWriter::Idle), timeout);
}

}  // namespace vramscope::collector
