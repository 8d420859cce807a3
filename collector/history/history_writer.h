// Puts finished runs into the history database without ever making ingest wait for it: Enqueue
// writes the report to a file in the queue directory (<data-dir>/history-queue/NNN.run, written
// as .tmp then renamed) and returns. EnqueueBuild does not even build the report: it appends a
// line naming the run's log to <queue_dir>/journal and returns; the thread builds the report
// (the caller's function) and writes NNN.run, and empties the journal once every run handed over
// is built. Runs of the journal without a .run at start (a crash came first) are built by
// `rebuild` (the report read back from the log). One thread builds first, then takes the .run
// files oldest first, inserts each
// (HistoryStore::Insert, idempotent) and removes the file only once the database said yes. A
// database that is down or refuses keeps the rows queued on disk, retried with a backoff from
// `retry_min` doubling to `retry_max`; files left by an earlier collector are sent at start. A
// file that does not parse is set aside as .bad (logged), never retried.
//
// Thread safety: Enqueue and the accessors from any thread. Error convention: absl::Status.
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
#include "vramscope/v1/report.pb.h"

namespace vramscope::collector {

struct HistoryWriterOptions {
  std::string queue_dir;
  absl::Duration retry_min = absl::Milliseconds(100);
  absl::Duration retry_max = absl::Seconds(10);
  // The report of the run logged at a path, for the journal's unbuilt runs at start; unset: they
  // are logged as lost.
  std::function<absl::StatusOr<v1::Report>(const std::string& log_path)> rebuild;
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
  // True once nothing is queued; false when `timeout` passed first.
  bool WaitIdle(absl::Duration timeout) const;

 private:
  HistoryWriter(HistoryWriterOptions options, std::unique_ptr<HistoryStore> store);
  absl::Status ScanQueue();
  // Writes run `number`'s .run from its log (options_.rebuild); false (logged) when it cannot.
  bool RebuildRun(uint64_t number, const std::string& log_path);
  // Builds the oldest run handed to EnqueueBuild and writes its .run.
  void BuildOldest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run();
  bool WorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool StopOrBuild() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string PathOf(uint64_t number, absl::string_view suffix) const;
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the oldest queued file; false when the database failed (retry later). *failing: in an
  // outage (logged once when it starts and once when it ends).
  bool SendOldest(const std::string& path, bool* failing);

  const HistoryWriterOptions options_;
  const std::unique_ptr<HistoryStore> store_;
  mutable absl::Mutex mu_;
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);  // file paths, oldest first
  struct ToBuild {
    uint64_t number;
    std::function<v1::Report()> build;
  };
  std::deque<ToBuild> to_build_ ABSL_GUARDED_BY(mu_);  // built before anything is sent
  uint64_t next_number_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int journal_fd_ = -1;                             // appended to and emptied under mu_
  bool build_failed_ ABSL_GUARDED_BY(mu_) = false;  // a .run not written: keep the journal
  std::thread thread_;
};

}  // namespace vramscope::collector
