// Puts finished runs into the history database without ever making ingest wait for it, and
// without competing with ingest for the CPU while ingest is busy.
//
// EnqueueBuild (the collector's path) does not even build the report: it appends a line naming
// the run's log to <queue_dir>/journal and returns. The writer's thread builds the report (the
// caller's function), summarizes and serializes it once, and hands the row straight to the store
// (HistoryStore::InsertRow, idempotent); only when the database is down or refuses is the report
// written to a queue file (<queue_dir>/NNN.run, written as .tmp then renamed), taken again oldest
// first and retried with a backoff from `retry_min` doubling to `retry_max`. The journal is
// emptied once every run handed over is in the database or in a queue file; a journal run with
// neither at start (a crash came first) is built by `rebuild` (the report read back from the
// log). Enqueue writes a ready report's queue file at once. Files left by an earlier collector
// are sent at start; one that does not parse is set aside as .bad (logged), never retried.
//
// Deferral: with `activity` set (ingest's count of stored batches), the thread builds and writes
// only once the count has not moved for `quiet`, or when a bound is passed: the oldest waiting
// run is `max_defer` old, or more than `max_waiting` runs wait to be built (each holds its engine
// in memory). Then it works until the bounds hold again. `max_defer` zero: never deferred.
//
// Thread safety: Enqueue and the accessors from any thread; `activity` and `now` are called on
// the writer's thread with its lock held (they must not call back). Error convention:
// absl::Status.
#pragma once

#include <absl/base/thread_annotations.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "history/history_store.h"
#include "vramscope/v1/collector.pb.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::collector {

struct HistoryWriterOptions {
  std::string queue_dir;
  absl::Duration retry_min = absl::Milliseconds(100);
  absl::Duration retry_max = absl::Seconds(10);
  // The report of the run logged at a path, for the journal's unbuilt runs at start; unset: they
  // are logged as lost.
  std::function<absl::StatusOr<v1::Report>(const std::string& log_path)> rebuild;
  // Ingest's count of stored batches (Collector::batches_stored); unset: never deferred.
  std::function<uint64_t()> activity = nullptr;
  absl::Duration quiet = absl::Milliseconds(100);
  absl::Duration max_defer = absl::Seconds(30);
  std::size_t max_waiting = 64;
  // How often `activity` is read while runs wait.
  absl::Duration poll = absl::Milliseconds(20);
  // The clock of the deferral and of the retries (tests inject one); unset: absl::Now.
  std::function<absl::Time()> now = nullptr;
};

struct HistoryWriterStats {
  uint64_t written = 0;   // rows the database took
  uint64_t deferred = 0;  // of those, held back at least once while ingest was busy
  uint64_t forced = 0;    // of those, written while ingest was busy: a bound was passed
  // The longest a deferred row waited from being queued to being built or sent.
  absl::Duration longest_deferral;
};

class HistoryWriter {
 public:
  static absl::StatusOr<std::unique_ptr<HistoryWriter>> Start(HistoryWriterOptions options,
                                                              std::unique_ptr<HistoryStore> store);
  // Stops the thread; rows not yet written stay queued on disk for the next start.
  ~HistoryWriter();
  HistoryWriter(const HistoryWriter&) = delete;
  HistoryWriter& operator=(const HistoryWriter&) = delete;

  // Queues a finished run: one file write, no database access.
  absl::Status Enqueue(const v1::Report& report);
  // Queues a finished run whose report `build` makes, on the writer's thread (it must own what it
  // reads); here only a line naming `log_path` is appended to the journal. An error: nothing
  // queued.
  absl::Status EnqueueBuild(const std::string& log_path, std::function<v1::Report()> build);
  HistoryStore* store() const { return store_.get(); }
  // Rows queued (built or not) and not yet in the database.
  std::size_t pending() const;
  uint64_t written() const;
  HistoryWriterStats stats() const;
  // True once nothing is queued; false when `timeout` passed first.
  bool WaitIdle(absl::Duration timeout) const;

 private:
  HistoryWriter(HistoryWriterOptions options, std::unique_ptr<HistoryStore> store);
  absl::Status ScanQueue();
  // Writes run `number`'s .run from its log (options_.rebuild); false (logged) when it cannot.
  bool RebuildRun(uint64_t number, const std::string& log_path);
  // Builds the oldest run handed to EnqueueBuild and inserts its row (or, the database failing,
  // writes its .run). `forced`: a deferral bound made it due.
  void BuildOldest(bool forced) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether queued work may run now (ingest quiet, or a bound passed); else *wait: until asking
  // again. *forced: a bound passed while ingest is busy.
  bool Due(absl::Time now, absl::Duration* wait, bool* forced) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time Now() const { return options_.now ? options_.now() : absl::Now(); }
  // Counts a row written (its number, when it was queued).
  void CountWritten(uint64_t number, absl::Time since, absl::Time now, bool forced)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Inserts one row; false when the database failed (logged once per outage).
  bool Store(const v1::RunSummary& run, absl::string_view report);
  void Run();
  bool WorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool StopOrBuild() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string PathOf(uint64_t number, absl::string_view suffix) const;
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the oldest queued file; false when the database failed (retry later).
  bool SendOldest(const std::string& path);

  const HistoryWriterOptions options_;
  const std::unique_ptr<HistoryStore> store_;
  mutable absl::Mutex mu_;
  struct Queued {
    uint64_t number;
    absl::Time since;  // when it was handed over (or found at start)
  };
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);  // .run files, oldest first
  struct ToBuild {
    uint64_t number;
    absl::Time since;
    std::function<v1::Report()> build;
  };
  std::deque<ToBuild> to_build_ ABSL_GUARDED_BY(mu_);  // built before anything is sent
  uint64_t next_number_ ABSL_GUARDED_BY(mu_) = 1;
  HistoryWriterStats stats_ ABSL_GUARDED_BY(mu_);
  // Deferral, the thread's: the activity count last read and when it last moved; runs numbered
  // up to held_through_ were held back at least once.
  uint64_t last_activity_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_moved_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t held_through_ ABSL_GUARDED_BY(mu_) = 0;
  bool failing_ = false;  // the thread's: in a database outage
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int journal_fd_ = -1;                             // appended to and emptied under mu_
  bool build_failed_ ABSL_GUARDED_BY(mu_) = false;  // a .run not written: keep the journal
  std::thread thread_;
};

}  // namespace vramscope::collector
