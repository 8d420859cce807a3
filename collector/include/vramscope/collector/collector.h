// The collector's core, without gRPC: stores each process's batches in its own append-only log in
// the data directory, de-duplicates them by sequence number, feeds them to one stats engine per
// process, and answers reports, listings and live snapshots. The gRPC service
// (vramscope/collector/service.h) is a thin edge over this class.
//
// Durability contract: Ingest returns a sequence number only after the batch is in the log (and,
// with `fsync`, on stable storage). A batch it could not store is not acknowledged: the agent
// keeps it and resends it.
//
// Live and finished: a process whose ProcessExit is stored leaves the live table (its stats engine
// and log descriptor are released; its summary and last live figures stay) and no longer counts
// against `max_processes`; GetReport rebuilds its report from its log. A later batch of it (a
// resend is only acknowledged) brings it back.
//
// Several collectors: on a stream whose agent spreads over several collectors (`takeover`), a
// process the collector has never seen may start past sequence 1 (another collector held the
// earlier batches until it went down), and a known process may continue past a gap (it was
// elsewhere meanwhile). Each process's held sequence ranges are reported (`held` in
// ProcessSummary, ProcessStats and Report) so that viewers merging collectors count each sequence
// once.
//
// Thread safety: all methods may be called concurrently. Batches of one process are serialised by
// a per-process lock; different processes proceed in parallel.
// Errors: absl::Status. INVALID_ARGUMENT (a batch ValidateBatch refuses), FAILED_PRECONDITION
// (sequence gap), RESOURCE_EXHAUSTED (disk full, --max-disk-bytes or --max-processes reached),
// NOT_FOUND (unknown process), INTERNAL (an I/O error other than a full disk).
#ifndef VRAMSCOPE_COLLECTOR_COLLECTOR_H_
#define VRAMSCOPE_COLLECTOR_COLLECTOR_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "stats/stats_engine.h"
#include "vramscope/collector/batch_check.h"
#include "vramscope/collector/record_log.h"
#include "vramscope/v1/collector.pb.h"
#include "vramscope/v1/events.pb.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::collector {

class HistoryWriter;
class ProcessStats;

struct CollectorOptions {
  std::string data_dir;
  // Bytes all process logs together may occupy; 0 = no limit but the disk's.
  uint64_t max_disk_bytes = 0;
  // Live processes each writer identity (token, client certificate, or "" for an
  // unauthenticated one) may have the collector track; finished ones leave the live table and
  // do not count, nor do ones recovered from the data directory.
  uint32_t max_processes = 4096;
  // fdatasync each record before acknowledging it. Off (the default), an acknowledged batch is in
  // the process's log file: it survives a collector crash, kill or restart (the page cache
  // outlives the process) but not a power loss. On, it survives that too, at about a third of
  // the ingest rate (BENCHMARKS.md).
  bool fsync = false;
  // Replaces write(2) for log appends (tests inject ENOSPC). Empty = write(2).
  WriteFn write_fn;
  // Recovery copies at most this many bytes to set a corrupt log's damaged part aside (holes are
  // never copied; see README "Storage format"). Tests lower it.
  uint64_t max_aside_copy_bytes = uint64_t{64} << 20;
  // The run history (collector/history/, README "Run history"): every process that finishes
  // becomes a row. "off" = none; "" = SQLite at <data_dir>/history.sqlite; "sqlite:PATH";
  // "postgresql://...". Rows queue in <data_dir>/history-queue until the database takes them.
  std::string database = "off";
  // The longest wait between retries while the database is down.
  absl::Duration history_retry_max = absl::Seconds(10);
  // History rows are built and written once no batch was stored for `history_quiet`, or when
  // the oldest waiting run is `history_max_defer` old or more than `history_max_waiting` runs wait
  // (each holds its stats engine). history_max_defer zero: never deferred.
  absl::Duration history_quiet = absl::Milliseconds(100);
  absl::Duration history_max_defer = absl::Seconds(30);
  std::size_t history_max_waiting = 64;
};

// What Open found in the data directory. Every entry of `warnings` and `errors` was also logged.
struct LoadReport {
  int files_loaded = 0;
  int files_skipped = 0;  // not a regular file, unreadable, not a log, or a duplicate process
  uint64_t batches = 0;
  uint64_t events = 0;
  uint64_t truncated_bytes = 0;
  std::vector<std::string> warnings;  // torn tails truncated, files that are not regular files
  std::vector<std::string> errors;    // corrupt files or records
};

// Upper bounds (seconds) of the ingest lag histogram's buckets; a last bucket takes the rest.
inline constexpr std::array<double, 12> kIngestLagBounds = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                            1,    2.5,   5,    10,  30,   60};

// One process as a metrics scrape sees it (Collector::Metrics).
struct ProcessGaugeSnapshot {
  v1::ProcessKey key;
  std::string comm;                           // basename of the command line's first word
  std::map<std::string, std::string> labels;  // ProcessStartEvent.labels
  bool finished = false;
  // Wall clock (ns) when this collector stored its exit; 0 when it finished before the
  // collector started (recovered from the data directory).
  uint64_t finished_wall_ns = 0;
  std::vector<DeviceGauges> devices;
};

// The collector's own figures and the processes a scrape shows (Collector::Metrics).
struct MetricsSnapshot {
  uint64_t events_stored = 0;  // in batches stored since start
  uint64_t batches_stored = 0, batches_duplicate = 0, batches_refused = 0;
  uint64_t disk_bytes = 0;
  uint64_t processes_live = 0, processes_finished = 0;  // all tracked, shown or not
  // Ingest lag (when a batch was stored minus the wall-clock time of its latest event), per
  // bucket of kIngestLagBounds (not cumulative; the last one is over the last bound).
  std::array<uint64_t, kIngestLagBounds.size() + 1> lag_buckets{};
  double lag_sum_seconds = 0;
  std::vector<ProcessGaugeSnapshot> processes;
};

class Collector {
 public:
  // Creates `options.data_dir` if needed and rebuilds every process from its log.
  static absl::StatusOr<std::unique_ptr<Collector>> Open(CollectorOptions options,
                                                         LoadReport* load_report = nullptr);
  ~Collector();
  Collector(const Collector&) = delete;
  Collector& operator=(const Collector&) = delete;

  // Stores `batch` unless it is a duplicate; returns the highest contiguous sequence stored for
  // its process (the value to acknowledge). `wire`, when given, is `batch` as received
  // (serialized); it is stored as is. A batch with sequence 0 and neither events nor counters is
  // a probe: nothing is stored and the answer is the process's stored sequence (0 if unknown).
  // A batch failing ValidateBatch (vramscope/collector/batch_check.h; with `wire`, only
  // ValidateBatchHeader, as parsing checked the rest) is INVALID_ARGUMENT and stores nothing.
  // With `takeover` (the agent sends to several collectors), an unknown process may start past
  // sequence 1 and a known one continue past a gap, instead of FAILED_PRECONDITION. `writer`
  // names who sent it (net::Peer::identity): a new process counts against its quota.
  absl::StatusOr<uint64_t> Ingest(const v1::EventBatch& batch, absl::string_view wire = {},
                                  bool takeover = false, absl::string_view writer = {});
  // The same for a batch CheckIngestMessage found to store (`message.kind` is kBatch), its
  // allocations and frees decoded (`message.decoded`) or not; `wire` the bytes it came from.
  absl::StatusOr<uint64_t> Ingest(const IngestMessage& message, absl::string_view wire,
                                  bool takeover, absl::string_view writer);
  // CheckIngestMessage refused a batch (`refused.kind` is kRejected): batch `refused.sequence` of
  // `refused.process`, holding `refused.events` events. If the key can be filed
  // (`refused.key_usable`: the key as sent, not only its escaped form in `refused.process`) and
  // the sequence is the next one, the sequence is recorded as consumed: a batch holding one
  // DropEvent for the events is stored in its place, so the process's later batches follow
  // without a gap. A duplicate or sequence 0 stores nothing; a gap is FAILED_PRECONDITION as for
  // Ingest. Returns the sequence to acknowledge (0 for a key that cannot be filed).
  absl::StatusOr<uint64_t> Refuse(const IngestMessage& refused, bool takeover = false,
                                  absl::string_view writer = {});
  // The highest contiguous sequence stored for `key` (0 if unknown).
  uint64_t StoredSequence(const v1::ProcessKey& key) const;

  // The report of `key`; sequences in `skip` are left out (rebuilt from the log then).
  absl::StatusOr<v1::Report> GetReport(const v1::ProcessKey& key,
                                       const std::vector<v1::SequenceRange>& skip = {}) const;
  v1::ListProcessesResponse ListProcesses(bool include_finished) const;
  // Live statistics of the processes named in `request` (all when empty).
  v1::StatsUpdate Snapshot(const v1::WatchRequest& request) const;
  // What a metrics scrape shows: the counters, every live process and the processes that
  // finished at or after `finished_since_ns` (wall clock). Each process lock is held only to copy
  // its O(devices) figures, so a scrape delays a process's ingest by at most that copy.
  MetricsSnapshot Metrics(uint64_t finished_since_ns) const;

  uint64_t disk_bytes() const { return disk_bytes_.load(std::memory_order_relaxed); }
  uint64_t batches_stored() const { return batches_stored_.load(std::memory_order_relaxed); }
  uint64_t batches_duplicate() const { return batches_duplicate_.load(std::memory_order_relaxed); }
  uint64_t batches_refused() const { return batches_refused_.load(std::memory_order_relaxed); }
  // Processes in the live table (what --max-processes bounds) and finished ones.
  size_t live_processes() const;
  size_t finished_processes() const;
  const CollectorOptions& options() const { return options_; }
  // The run history's writer (its store answers ListRuns/GetRun); nullptr when database="off".
  HistoryWriter* history() const { return history_.get(); }

 private:
  struct Process;
  explicit Collector(CollectorOptions options);
  absl::Status Load(LoadReport* report);
  void LoadFile(const std::string& path, LoadReport* report);
  // LoadFile's parts, called with process->mu held: ReadLog feeds the log's batches to the
  // process's engine, counting events; CutDamage takes the damage the scan found out of the log
  // (false: the file is skipped, noted in `report`); Adopt puts the loaded process in a table.
  absl::Status ReadLog(Process* process, const std::string& path, LogScan* scan, uint64_t* events);
  bool CutDamage(Process* process, const std::string& path, const LogScan& scan,
                 LoadReport* report);
  void Adopt(std::shared_ptr<Process> process, const std::string& path, const LogScan& scan,
             uint64_t events, LoadReport* report);
  // The process of `key`, created when `sequence` is 1 (else a gap) and `writer` is under its
  // quota. A finished process found is returned as it is (Append revives it when needed).
  absl::StatusOr<std::shared_ptr<Process>> FindOrCreate(const v1::ProcessKey& key,
                                                        uint64_t sequence, bool takeover,
                                                        absl::string_view writer);
  std::shared_ptr<Process> Find(const v1::ProcessKey& key) const;
  std::shared_ptr<Process> FindLocked(const std::string& name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores `batch` (the next sequence of `process`, whose lock the caller holds) or answers a
  // duplicate; a gap is FAILED_PRECONDITION unless `takeover`.
  // `decoded`: the batch's events (IngestMessage::decoded), or nullptr for batch.events().
  absl::StatusOr<uint64_t> Append(Process* process, const v1::EventBatch& batch,
                                  const std::vector<BatchEvent>* decoded, absl::string_view wire,
                                  bool takeover);
  // Moves a finished process (lock held) out of the live table; Revive brings it back.
  // Returns the released stats engine (the history thread may still build a report from it).
  std::unique_ptr<ProcessStats> Retire(Process* process);
  absl::Status Revive(Process* process);
  absl::Status CreateLog(Process* process);
  std::vector<std::shared_ptr<Process>> Matching(const std::vector<v1::ProcessKey>& keys) const;
  // After a batch of `events` events was stored for `process` (lock held): event count, end
  // time, ingest lag.
  void CountStored(Process* process, uint64_t events, bool was_finished);
  // Retires a finished process and queues its history row (with process->mu held).
  void QueueFinishedRun(Process* process, bool newly_finished);

  const CollectorOptions options_;
  std::unique_ptr<HistoryWriter> history_;
  std::atomic<uint64_t> disk_bytes_{0};
  std::atomic<uint64_t> batches_stored_{0};
  std::atomic<uint64_t> batches_duplicate_{0};
  std::atomic<uint64_t> batches_refused_{0};
  std::atomic<uint64_t> events_stored_{0};
  std::array<std::atomic<uint64_t>, kIngestLagBounds.size() + 1> lag_buckets_{};
  std::atomic<uint64_t> lag_sum_ns_{0};
  mutable absl::Mutex mu_;
  // Live processes, and finished ones (retired: no stats engine, no descriptor). A key is in one
  // of the two at most. Shared: callers keep a process after dropping mu_ while it moves.
  absl::flat_hash_map<std::string, std::shared_ptr<Process>> processes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Process>> finished_ ABSL_GUARDED_BY(mu_);
  // Live processes held per writer identity (Process::writer), for --max-processes.
  absl::flat_hash_map<std::string, uint32_t> processes_by_writer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vramscope::collector

#endif  // VRAMSCOPE_COLLECTOR_COLLECTOR_H_
