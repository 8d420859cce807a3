// Puts finished runs into the history database without ever making ingest wait for it: Enqueue
// writes the report to a file in the queue directory (<data-dir>/history-queue/NNN.run, written
// as .tmp then renamed) and returns; one thread takes the files oldest first, inserts each
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
  HistoryStore* store() const { return store_.get(); }
  // Rows queued and not yet in the database.
  std::size_t pending() const;
  uint64_t written() const;
  // True once nothing is queued; false when `timeout` passed first.
  bool WaitIdle(absl::Duration timeout) const;

 private:
  HistoryWriter(HistoryWriterOptions options, std::unique_ptr<HistoryStore> store);
  absl::Status ScanQueue();
  void Run();
  bool WorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the oldest queued file; false when the database failed (retry later). *failing: in an
  // outage (logged once when it starts and once when it ends).
  bool SendOldest(const std::string& path, bool* failing);

  const HistoryWriterOptions options_;
  const std::unique_ptr<HistoryStore> store_;
  mutable absl::Mutex mu_;
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);  // file paths, oldest first
  uint64_t next_number_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace vramscope::collector
