// RingReader: the out-of-process side of one event ring (layout: vramscope/ring.h).
//
// What it is: opens and validates one process's ring (a file, or a memory region for tests and
// fuzzing), reads the records published since its cursor, converts them into vramscope.v1.Event
// messages or straight into their wire bytes (event_encoder.h: the same events, no message per
// record; what vramscope-agent sends), and reports the header's exact counters as DeviceCounters.
// It also notices drops (the writers' records_dropped counter, and slots a dead writer claimed but
// never published) and the writer's end (exited flag, or the process gone), after which it emits
// ProcessExit once: the exit record's, else one it makes (ProcessExitEvent.vanished when the writer
// never ran its exit path; timed at the first Drain that found it gone if an earlier one saw it
// alive, else at its last event).
//
// Event order per ring: ProcessStart (synthesised from the header, first Drain; repeated with the
// full device list when the shim describes another device later), then the records in ring
// order, a DropEvent wherever new drops were noticed, ProcessExit last. SITE and MODULE records
// are not events of their own: they become SiteDefinition events (site_assembler.h). LABELS
// records (ring_labels.h) become a new ProcessStart carrying the labels, where they stand.
//
// A file another process can shrink: the ring file belongs to the traced process's user, who can
// truncate it while it is mapped here; touching a page past the new end raises SIGBUS. Every
// access to a file ring's mapping happens inside a RingFaultScope (ring_fault.h): a SIGBUS there
// replaces the mapping with zero pages, and the call that was reading returns DataLoss ("ring
// ... was truncated ... while being read"). From then on the reader is damaged(): every Drain
// returns that error, Counters() is empty, nothing else touches the file; the caller closes it.
// Other rings, and other readers' threads, are not affected. Cost: two thread-local stores per
// call; the handler itself runs only on a fault.
//
// Identity: the header is written by the traced process and can claim anything. For a file ring
// the reader trusts only what it can check: RingInfo::uid is the file's owner (fstat of the
// opened file, never the header's uid), RingInfo::host is the reader's own host name (a ring
// file is read on the machine it lives on; a differing header host, e.g. a container with its
// own UTS namespace, is kept in header_host for a log line and otherwise ignored), and the
// header's pid is checked against /proc (ProcessIdentity in events.proto): VERIFIED when the
// live process with that pid (and the header's start time, when it gives one) has the file's
// owner among its real/effective/saved/filesystem uids; MISMATCH for pid 0 or a live process of
// another user; UNVERIFIABLE when no live process has that pid and start time (a writer that
// ended before its ring was opened, the normal case for a late reader, cannot be told apart
// from a made-up pid). The pid stays the header's claim in the process key; ProcessStart
// carries uid and identity so consumers can tell. A memory ring has no file: its header is
// taken as is (identity UNSPECIFIED).
//
// Thread safety: one thread at a time per reader. A file ring is flock()ed exclusively while
// open: a second reader of the same file gets FailedPrecondition.
//
// Error convention: absl::Status. Anything a writer (or a corrupt or hostile file) can put in the
// ring yields an error status or a skipped, counted record, never a crash: bad magic, version or
// sizes -> InvalidArgument (or Unavailable for a file too short to hold a header yet); indices out
// of range, or the file truncated under the mapping -> DataLoss.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <google/protobuf/repeated_ptr_field.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "drain/event_encoder.h"
#include "drain/ring_fault.h"
#include "drain/site_assembler.h"
#include "vramscope/ring.h"
#include "vramscope/v1/events.pb.h"

namespace vramscope::agent {

// The header's identity fields, copied and validated at open (see "Identity" above). Strings are
// the header's bytes as they are; what goes into messages (process_key(), ProcessStart) is made
// valid UTF-8 with vramscope/utf8.h, so no string the application controls can make a batch
// unparseable.
struct RingInfo {
  std::uint32_t pid = 0;  // the header's claim, checked as `identity` says
  std::uint32_t parent_pid = 0;
  std::uint32_t uid = 0;         // file rings: the file's owner; memory rings: the header's uid
  std::uint32_t header_uid = 0;  // what the header claims
  v1::ProcessIdentity identity = v1::PROCESS_IDENTITY_UNSPECIFIED;
  std::uint32_t capacity = 0;
  std::uint64_t start_time_ns = 0;       // CLOCK_REALTIME
  std::uint64_t start_monotonic_ns = 0;  // CLOCK_MONOTONIC, the clock of Event.time_ns
  std::uint64_t proc_start_ticks = 0;
  std::string host;         // file rings: the reader's host name; memory rings: the header's
  std::string header_host;  // what the header claims
  std::string mode;
  std::vector<std::string> command_line;
};

// Where a Drain puts its events: messages or wire bytes (defined in ring_reader.cc).
class DrainSink;

// What taking the record group at a ring reader's cursor found.
enum class RecordRead {
  kTaken,       // decoded (or folded into the reader's state)
  kInvalid,     // corrupt: the group's slots are skipped and counted as lost
  kIncomplete,  // a continuation is claimed but not yet published: read again later
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

// A live process as /proc shows it.
struct ProcessOwner {
  std::uint64_t start_ticks = 0;    // /proc/PID/stat field 22
  std::vector<std::uint32_t> uids;  // /proc/PID/status "Uid:": real, effective, saved, fs
};
// The process `pid` now, or nullopt when there is none (no /proc/PID, or a zombie).
std::optional<ProcessOwner> LookupProcessOwner(std::uint32_t pid);

// The identity verdict for a ring whose file belongs to `file_uid` (see "Identity" above);
// `lookup` finds a live process by pid.
v1::ProcessIdentity CheckProcessIdentity(
    const RingInfo& info, std::uint32_t file_uid,
    const std::function<std::optional<ProcessOwner>(std::uint32_t)>& lookup);

// The host name file rings are reported under (gethostname, once).
const std::string& LocalHostName();

struct RingReaderOptions {
  // Replaces WriterProcessAlive (tests, fuzzing).
  std::function<bool(const RingInfo&)> writer_alive;
  // Drain() hands the slots it read back to the writers (stores tail) before it returns. Off:
  // the caller does it with CommitTail() once the events are safe elsewhere (vramscope-agent
  // with --spool-dir: after the batch is on disk), so a reader killed in between leaves them in
  // the ring for the next one.
  bool commit_in_drain = true;
  // Replaces LookupProcessOwner for the identity check (tests).
  std::function<std::optional<ProcessOwner>(std::uint32_t)> lookup_process;
  // The host name file rings are reported under; empty: LocalHostName().
  std::string host;
};

class RingReader {
 public:
  using Options = RingReaderOptions;

  // Maps `path` read-write (the reader stores its cursor in `tail`), takes flock(LOCK_EX) and
  // installs the SIGBUS handler of ring_fault.h (once per process).
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
  // Positions claimed by writers so far (the ring's head); the cursor once damaged().
  std::uint64_t head() const;
  bool finished() const { return finished_; }
  // The file was truncated under the mapping (see above): the reader only returns errors now.
  bool damaged() const { return damaged_; }
  // DataLoss naming the ring and the fault once damaged(), else OK.
  absl::Status DamageStatus() const;

  // Appends the events published since the cursor, reading at most `max_records` records, and
  // (unless Options::commit_in_drain is off) advances the ring's tail so writers can reuse the
  // slots.
  absl::StatusOr<DrainStats> Drain(google::protobuf::RepeatedPtrField<v1::Event>* out,
                                   std::size_t max_records = SIZE_MAX);
  // The same events as wire bytes (event_encoder.h): what vramscope-agent sends. No message is
  // built for the ring's records; ProcessStart, SiteDefinition, DropEvent and a synthesised
  // ProcessExit are built as messages and serialized.
  absl::StatusOr<DrainStats> Drain(EncodedEvents* out, std::size_t max_records = SIZE_MAX);
  // Hands every slot read so far back to the writers (tail = cursor).
  void CommitTail();

  // The header's exact counters, one entry per device that has any (or has device info).
  // records_written/records_dropped are process-wide and repeated on every entry. Empty once
  // damaged().
  std::vector<v1::DeviceCounters> Counters() const;
  // The latest record's time (event clock), 0 before the first.
  std::uint64_t last_time_ns() const { return last_time_ns_; }
  // The writer ran its exit path (exit_code valid).
  bool WriterExited() const;
  int ExitCode() const;

 private:
  RingReader(void* base, std::size_t size, int fd, std::string path, Options options);
  absl::Status Validate();
  bool WriterAlive();
  absl::StatusOr<DrainStats> DrainInto(DrainSink& out, std::size_t max_records);
  void AppendProcessStart(DrainSink& out);
  absl::StatusOr<DrainStats> DrainMapped(DrainSink& out, std::size_t max_records,
                                         const RingFaultScope& scope);
  // ProcessStart first, and again whenever the shim has described another device since (it
  // fills device_info as contexts appear); consumers keep the latest.
  void DescribeNewDevices(DrainSink& out);
  // Takes the record group starting at the cursor (`record`, a copy of its first slot; `head`
  // as last read): NVTX text into *text, LABELS into labels_, MODULE and SITE into sites_, the
  // rest decoded into `out`. *consumed: the slots the group takes.
  RecordRead TakeRecord(const vramscope_ring_record& record, std::uint64_t head, std::string* text,
                        DrainSink& out, std::uint64_t* consumed);
  // DrainMapped's end: a DropEvent for the writer's drops since `dropped_now` was read plus the
  // `lost` slots; once the ring is drained and its writer gone, late drops and the ProcessExit
  // (a vanished one when the writer's record is missing). *alive: WriterAlive() once asked
  // (-1: not yet).
  void AppendDropsAndEnd(DrainSink& out, std::uint64_t dropped_now, std::uint64_t lost, int* alive,
                         DrainStats* stats);
  // The mapping this reader guards (nullptr for memory rings, which cannot shrink).
  void* guarded_base() const { return fd_ >= 0 ? base_ : nullptr; }
  // Notes a fault `scope` saw: the reader is damaged from now on.
  void NoteFault(const RingFaultScope& scope) const;

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
  bool seen_alive_ = false;  // a Drain found the writer alive (bounds when a vanished one ended)
  SiteAssembler sites_;      // SITE and MODULE records -> SiteDefinition events
  std::map<std::string, std::string> labels_;  // from LABELS records, sent in ProcessStart
  bool finished_ = false;
  mutable bool damaged_ = false;
  mutable std::size_t fault_offset_ = 0;
};

}  // namespace vramscope::agent
