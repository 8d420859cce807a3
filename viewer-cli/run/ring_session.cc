#include "run/ring_session.h"

#include <absl/strings/str_cat.h>
#include <absl/time/clock.h>
#include <errno.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

namespace vramscope::cli {

RingSession::RingSession(std::string dir, collector::StatsOptions options, ChromeTrace* trace,
                         agent::Outbox* outbox, int batch_events)
    : directory_(std::move(dir)),
      options_(options),
      trace_(trace),
      outbox_(outbox),
      batch_events_(batch_events < 1 ? 1 : batch_events) {}

RingSession::~RingSession() = default;

void RingSession::WatchChild(std::uint32_t pid) { child_pid_ = pid; }

void RingSession::ChildExited(int wait_status, std::uint64_t observed_ns) {
  child_exited_ = true;
  child_status_ = wait_status;
  child_exit_ns_ = observed_ns;
}

absl::Status RingSession::Poll() {
  absl::StatusOr<std::vector<std::string>> found = directory_.Scan();
  if (!found.ok()) return found.status();
  for (const std::string& path : *found) {
    agent::RingReader::Options reader_options;
    // The child is a zombie until run reaps it, and reaped only once run knows how it ended:
    // until then its rings stay open, so their ProcessExit can carry the wait status.
    reader_options.writer_alive = [this](const agent::RingInfo& info) {
      if (child_pid_ != 0 && info.pid == child_pid_ && !child_exited_) return true;
      return agent::WriterProcessAlive(info);
    };
    absl::StatusOr<std::unique_ptr<agent::RingReader>> reader =
        agent::RingReader::OpenFile(path, std::move(reader_options));
    if (!reader.ok()) {
      if (absl::IsUnavailable(reader.status())) {
        directory_.Forget(path);  // not initialised yet: next time
      } else {
        warnings_.push_back(absl::StrCat("skipping ring: ", reader.status().message()));
      }
      continue;
    }
    Ring ring;
    ring.stats = std::make_unique<collector::ProcessStatsEngine>(options_);
    ring.stats->SetProcessKey((*reader)->process_key());
    ring.reader = std::move(*reader);
    rings_.push_back(std::move(ring));
  }
  for (Ring& ring : rings_) DrainOnce(ring);
  return absl::OkStatus();
}

std::uint64_t RingSession::DrainOnce(Ring& ring) {
  if (ring.failed || ring.reader->finished()) return 0;
  // Bounded batches keep the buffer's memory flat however far behind we are.
  constexpr std::size_t kBatch = 65536;
  std::uint64_t total = 0;
  for (;;) {
    buffer_.Clear();
    absl::StatusOr<agent::DrainStats> stats = ring.reader->Drain(&buffer_, kBatch);
    if (!stats.ok()) {
      ring.failed = true;
      warnings_.push_back(absl::StrCat("ring of pid ", ring.reader->info().pid,
                                       " became unreadable: ", stats.status().message()));
      return total;
    }
    const std::uint32_t pid = ring.reader->info().pid;
    if (child_exited_ && pid == child_pid_) {
      for (v1::Event& event : buffer_) {
        if (event.has_process_exit()) AmendChildExit(*ring.reader, event);
      }
    }
    for (const v1::Event& event : buffer_) {
      ring.stats->Add(event);
      if (trace_ != nullptr) trace_->Add(pid, event);
    }
    if (recorder_ != nullptr && !buffer_.empty()) {
      const v1::ProcessKey key = ring.reader->process_key();
      for (const v1::Event& event : buffer_) recorder_->Add(key, event);
    }
    if (outbox_ != nullptr) CutBatches(*ring.reader);
    total += stats->records;
    if (stats->finished || stats->records < kBatch) break;
  }
  for (const v1::DeviceCounters& counters : ring.reader->Counters()) {
    ring.stats->AddCounters(counters);
  }
  return total;
}

void RingSession::AmendChildExit(const agent::RingReader& reader, v1::Event& event) const {
  if (child_status_ < 0) return;
  v1::ProcessExitEvent* exit = event.mutable_process_exit();
  if (WIFSIGNALED(child_status_)) {
    // Also over an exit record: a signal after the shim's exit path (a crash in a later
    // destructor) still ended the process.
    exit->set_killed(true);
    exit->set_signal(WTERMSIG(child_status_));
    exit->set_exit_code(0);
  } else if (WIFEXITED(child_status_)) {
    exit->set_killed(false);
    exit->set_signal(0);
    exit->set_exit_code(WEXITSTATUS(child_status_));
  }
  // Without an exit record the end is when run saw it (never before the last event).
  if (exit->vanished()) event.set_time_ns(std::max(reader.last_time_ns(), child_exit_ns_));
}

void RingSession::CutBatches(const agent::RingReader& reader) {
  if (buffer_.empty()) return;
  // The counters are the ring header's exact totals at this point; every batch carries them, as
  // the agent's do, so the collector's peaks stay exact even when records were dropped.
  const std::vector<v1::DeviceCounters> counters = reader.Counters();
  v1::EventBatch batch;
  auto flush = [&] {
    if (batch.events_size() == 0) return;
    *batch.mutable_process() = reader.process_key();
    for (const v1::DeviceCounters& c : counters) *batch.add_counters() = c;
    // A batch the outbox has no room for is counted there and reported to the collector as a
    // DropEvent; the local report is unaffected.
    outbox_->Add(std::move(batch));
    batch = v1::EventBatch();
  };
  for (v1::Event& event : buffer_) {
    *batch.add_events() = std::move(event);
    if (batch.events_size() >= batch_events_) flush();
  }
  flush();
}

absl::Status RingSession::Finish() {
  // Rings created by processes that ended just now, then drain until nothing moves.
  if (absl::Status status = Poll(); !status.ok()) return status;
  auto drain_all = [this] {
    for (;;) {
      std::uint64_t moved = 0;
      for (Ring& ring : rings_) moved += DrainOnce(ring);
      if (moved == 0) break;
    }
  };
  drain_all();
  // A process still running now is often one killed together with CMD (a process group's
  // SIGKILL: `timeout -s KILL`) and still dying: wait for those to exit, a bounded time, so
  // they are reported as ended (vanished) rather than as running.
  if (WaitForStragglers(kDyingGrace)) drain_all();
  for (const Ring& ring : rings_) {
    if (!ring.failed && !ring.reader->finished()) {
      warnings_.push_back(absl::StrCat("pid ", ring.reader->info().pid,
                                       " is still running: its report is partial"));
    }
  }
  return absl::OkStatus();
}

bool RingSession::WaitForStragglers(absl::Duration grace) {
  std::vector<pollfd> fds;
  for (const Ring& ring : rings_) {
    if (ring.failed || ring.reader->finished()) continue;
    const int fd = static_cast<int>(syscall(SYS_pidfd_open, ring.reader->info().pid, 0));
    if (fd >= 0) fds.push_back({fd, POLLIN, 0});
  }
  if (fds.empty()) return false;
  // A pidfd is readable once its process has exited; wait until all have, or the grace is over.
  const absl::Time deadline = absl::Now() + grace;
  std::size_t done = 0;
  while (done < fds.size()) {
    const std::int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) break;
    const int n = poll(fds.data(), fds.size(), static_cast<int>(left));
    if (n < 0 && errno != EINTR) break;
    done = 0;
    for (pollfd& fd : fds) {
      if (fd.revents != 0) fd.events = 0;  // exited: stop watching it
      if (fd.events == 0) ++done;
    }
  }
  for (const pollfd& fd : fds) close(fd.fd);
  return true;
}

std::vector<v1::Report> RingSession::Reports() const {
  std::vector<v1::Report> reports;
  reports.reserve(rings_.size());
  for (const Ring& ring : rings_) reports.push_back(ring.stats->Report());
  return reports;
}

}  // namespace vramscope::cli
