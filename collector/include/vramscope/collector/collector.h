// The collector's core, without gRPC: stores each process's batches in its own append-only log in
// the data directory, de-duplicates them by sequence number, feeds them to one stats engine per
// process, and answers reports, listings and live snapshots. The gRPC service
// (vramscope/collector/service.h) is a thin edge over this class.
//
// Durability contract: Ingest returns a sequence number only after the batch is in the log (and,
// with `fsync`, on stable storage). A batch it could not store is not acknowledged: the agent
// keeps it and resends it.
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

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "vramscope/collector/batch_check.h"
#include "vramscope/collector/record_log.h"
#include "vramscope/v1/collector.pb.h"
#include "vramscope/v1/events.pb.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::collector {

struct CollectorOptions {
  std::string data_dir;
  // Bytes all process logs together may occupy; 0 = no limit but the disk's.
  uint64_t max_disk_bytes = 0;
  // Processes each writer identity (token, client certificate, or "" for an unauthenticated
  // one) may have the collector track, live and finished; ones recovered from the data
  // directory count against none.
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

std::string ProcessKeyString(const v1::ProcessKey& key);

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
  // `writer` names who sent it (net::Peer::identity): a new process counts against its quota.
  absl::StatusOr<uint64_t> Ingest(const v1::EventBatch& batch, absl::string_view wire = {},
                                  absl::string_view writer = {});
  // CheckIngestMessage refused a batch (`refused.kind` is kRejected): batch `refused.sequence` of
  // `refused.process`, holding `refused.events` events. If the key can be filed
  // (`refused.key_usable`: the key as sent, not only its escaped form in `refused.process`) and
  // the sequence is the next one, the sequence is recorded as consumed: a batch holding one
  // DropEvent for the events is stored in its place, so the process's later batches follow
  // without a gap. A duplicate or sequence 0 stores nothing; a gap is FAILED_PRECONDITION as for
  // Ingest. Returns the sequence to acknowledge (0 for a key that cannot be filed).
  absl::StatusOr<uint64_t> Refuse(const IngestMessage& refused, absl::string_view writer = {});
  // The highest contiguous sequence stored for `key` (0 if unknown).
  uint64_t StoredSequence(const v1::ProcessKey& key) const;

  absl::StatusOr<v1::Report> GetReport(const v1::ProcessKey& key) const;
  v1::ListProcessesResponse ListProcesses(bool include_finished) const;
  // Live statistics of the processes named in `request` (all when empty).
  v1::StatsUpdate Snapshot(const v1::WatchRequest& request) const;

  uint64_t disk_bytes() const { return disk_bytes_.load(std::memory_order_relaxed); }
  uint64_t batches_stored() const { return batches_stored_.load(std::memory_order_relaxed); }
  uint64_t batches_duplicate() const { return batches_duplicate_.load(std::memory_order_relaxed); }
  uint64_t batches_refused() const { return batches_refused_.load(std::memory_order_relaxed); }
  const CollectorOptions& options() const { return options_; }

 private:
  struct Process;
  explicit Collector(CollectorOptions options);
  absl::Status Load(LoadReport* report);
  void LoadFile(const std::string& path, LoadReport* report);
  // The process of `key`, created when `sequence` is 1 (else a gap) and `writer` is under its
  // quota.
  absl::StatusOr<Process*> FindOrCreate(const v1::ProcessKey& key, uint64_t sequence,
                                        absl::string_view writer);
  // Stores `batch` (the next sequence of `process`, whose lock the caller holds) or answers a
  // duplicate; a gap is FAILED_PRECONDITION.
  absl::StatusOr<uint64_t> Append(Process* process, const v1::EventBatch& batch,
                                  absl::string_view wire);
  absl::Status CreateLog(Process* process);
  std::vector<Process*> Matching(const std::vector<v1::ProcessKey>& keys) const;

  const CollectorOptions options_;
  std::atomic<uint64_t> disk_bytes_{0};
  std::atomic<uint64_t> batches_stored_{0};
  std::atomic<uint64_t> batches_duplicate_{0};
  std::atomic<uint64_t> batches_refused_{0};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Process>> processes_ ABSL_GUARDED_BY(mu_);
  // Processes held per writer identity (Process::writer), for --max-processes.
  absl::flat_hash_map<std::string, uint32_t> processes_by_writer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vramscope::collector

#endif  // VRAMSCOPE_COLLECTOR_COLLECTOR_H_
