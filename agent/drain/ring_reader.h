// RingReader: the out-of-process side of one event ring (layout: vramscope/ring.h).
//
// What it is: opens and validates one process's ring (a file, or a memory region for tests and
// fuzzing), reads the records published since its cursor, converts them into vramscope.v1.Event
// messages, and reports the header's exact counters as DeviceCounters. It also notices drops
// (the writers' records_dropped counter, and slots a dead writer claimed but never published)
// and the writer's end (exited flag, or the process gone), after which it emits ProcessExit once.
//
// Event order per ring: ProcessStart (synthesised from the header, first Drain; repeated with the
// full device list when the shim describes another device later), then the records in ring
// order, a DropEvent wherever new drops were noticed, ProcessExit last. SITE and MODULE records
// are not events of their own: they become SiteDefinition events (site_assembler.h).
//
// Thread safety: one thread at a time per reader. A file ring is flock()ed exclusively while
// open: a second reader of the same file gets FailedPrecondition.
//
// Error convention: absl::Status. Anything a writer (or a corrupt or hostile file) can put in the
// ring yields an error status or a skipped, counted record, never a crash: bad magic, version or
// sizes -> InvalidArgument (or Unavailable for a file too short to hold a header yet); indices out
// of range -> DataLoss.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <google/protobuf/repeated_ptr_field.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "drain/site_assembler.h"
#include "vramscope/ring.h"
#include "vramscope/v1/events.pb.h"

namespace vramscope::agent {

// The header's identity fields, copied and validated at open. Strings are the header's bytes as
// they are; what goes into messages (process_key(), ProcessStart) is made valid UTF-8 with
// vramscope/utf8.h, so no string the application controls can make a batch unparseable.
struct RingInfo {
  std::uint32_t pid = 0;
  std::uint32_t parent_pid = 0;
  std::uint32_t uid = 0;
  std::uint32_t capacity = 0;
  std::uint64_t start_time_ns = 0;       // CLOCK_REALTIME
  std::uint64_t start_monotonic_ns = 0;  // CLOCK_MONOTONIC, the clock of Event.time_ns
  std::uint64_t proc_start_ticks = 0;
  std::string host;
  std::string mode;
  std::vector<std::string> command_line;
};

struct DrainStats {
  std::uint64_t records = 0;  // ring records consumed this call
  std::uint64_t events = 0;   // events appended this call
  std::uint64_t dropped = 0;  // drops newly noticed this call (also sent as a DropEvent)
  std::uint64_t invalid = 0;  // records that did not decode (skipped, counted in dropped too)
  bool finished = false;      // the writer is gone and everything was read: ProcessExit sent
};

// True when the ring's writer process still runs: /proc/<pid>/stat exists, is not a zombie, and
// (when known) has the same start time; without /proc, kill(pid, 0).
bool WriterProcessAlive(const RingInfo& info);

struct RingReaderOptions {
  // Replaces WriterProcessAlive (tests, fuzzing).
  std::function<bool(const RingInfo&)> writer_alive;
  // Drain() hands the slots it read back to the writers (stores tail) before it returns. Off:
  // the caller does it with CommitTail() once the events are safe elsewhere (vramscope-agent
  // with --spool-dir: after the batch is on disk), so a reader killed in between leaves them in
  // the ring for the next one.
  bool commit_in_drain = true;
};

class RingReader {
 public:
  using Options = RingReaderOptions;

  // Maps `path` read-write (the reader stores its cursor in `tail`) and takes flock(LOCK_EX).
  static absl::StatusOr<std::unique_ptr<RingReader>> OpenFile(const std::string& path,
                                                              Options options = {});
  // A ring in memory: `data` must be 8-byte aligned, writable and outlive the reader.
  static absl::StatusOr<std::unique_ptr<RingReader>> OpenMemory(void* data, std::size_t size,
                                                                Options options = {});
  ~RingReader();
  RingReader(const RingReader&) = delete;
  RingReader& operator=(const RingReader&) = delete;

  const RingInfo& info() const { return info_; }
  const std::string& path() const { return path_; }
  v1::ProcessKey process_key() const;
  // Next ring position to read.
  std::uint64_t cursor() const { return cursor_; }
  // Positions claimed by writers so far (the ring's head).
  std::uint64_t head() const { return __atomic_load_n(&header_->head, __ATOMIC_ACQUIRE); }
  bool finished() const { return finished_; }

  // Appends the events published since the cursor, reading at most `max_records` records, and
  // (unless Options::commit_in_drain is off) advances the ring's tail so writers can reuse the
  // slots.
  absl::StatusOr<DrainStats> Drain(google::protobuf::RepeatedPtrField<v1::Event>* out,
                                   std::size_t max_records = SIZE_MAX);
  // Hands every slot read so far back to the writers (tail = cursor).
  void CommitTail();

  // The header's exact counters, one entry per device that has any (or has device info).
  // records_written/records_dropped are process-wide and repeated on every entry.
  std::vector<v1::DeviceCounters> Counters() const;
  // The writer ran its exit path (exit_code valid).
  bool WriterExited() const;
  int ExitCode() const;

 private:
  RingReader(void* base, std::size_t size, int fd, std::string path, Options options);
  absl::Status Validate();
  bool WriterAlive();
  void AppendProcessStart(google::protobuf::RepeatedPtrField<v1::Event>* out);

  void* base_;
  std::size_t size_;
  int fd_;  // -1 for memory rings
  std::string path_;
  Options options_;
  vramscope_ring_header* header_;
  vramscope_ring_record* records_;
  RingInfo info_;
  std::uint64_t cursor_ = 0;
  std::uint64_t dropped_seen_ = 0;  // writer-side drops already reported
  std::uint64_t last_time_ns_ = 0;
  bool started_ = false;
  std::uint32_t devices_described_ = 0;  // device_info entries sent in a ProcessStart
  bool exit_seen_ = false;
  SiteAssembler sites_;  // SITE and MODULE records -> SiteDefinition events
  bool finished_ = false;
};

}  // namespace vramscope::agent
