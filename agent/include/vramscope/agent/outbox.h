// Outbox: every batch the agent has cut and the collector has not yet acknowledged.
//
// It numbers each process's batches (1, 2, 3, ... with no gaps) and hands them to the uplink in
// the order they were added. An acknowledgement forgets every batch of that process up to the
// acknowledged sequence. After a reconnect the uplink calls Rewind() and everything still
// unacknowledged is sent again; the collector drops duplicates.
//
// Without a spool directory batches are kept in memory up to a bound. With one, every batch is
// written to the spool (one file per batch: a temporary name, then a rename) the moment it gets
// its sequence number, before Add's `stored` callback runs, in which the agent lets the ring's
// tail move past the batch's events: whatever left the ring is on disk. A copy stays in memory up
// to the memory bound for sending; files are deleted on acknowledgement and kept when the outbox
// is destroyed. The next Outbox over the same directory replays them: each file is validated
// (header, length, CRC-32, sequence and process against its name); valid batches are queued first
// with their process keys and sequence numbers; a damaged one is renamed to *.corrupt, warned
// about and counted, and its sequence is sent as a DropEvent for its events (the name holds the
// process, sequence and event count), so the collector sees no gap. New batches of a replayed
// process are numbered after the highest replayed sequence (and after the collector's, SetStart).
//
// When there is no room (memory bound without a spool; the spool bound, or a spool write error,
// with one), a batch is dropped before it gets a sequence number (so the collector sees no gap):
// its events are counted, logged, and reported to the collector as a DropEvent at the head of
// that process's next batch. Nothing is dropped silently.
//
// A batch the collector rejects as invalid (IngestAck.rejected: it will never be stored, so
// resending it cannot help) is quarantined by Reject: with a spool its file moves to the spool's
// `rejected/` folder (beside it FILE.reason says why), without one it is dropped; it is counted,
// logged once per process, and forgotten like an acknowledged batch, so the process's later
// batches and every other process's go on. The collector records the refused sequence as
// consumed, so no gap follows.
//
// If an acknowledgement names a sequence this agent never assigned (the collector already holds
// batches of this process from an agent that ran before this one), the process's unacknowledged
// batches are renumbered after it (spooled files rewritten) and sent again, so nothing is taken
// for a duplicate.
//
// Batches are held, spooled and sent as the serialized EventBatch (wire bytes; the agent writes
// them straight from ring records, drain/event_encoder.h), with the process, sequence and event
// count kept beside them; a message is built only to renumber or replay a batch.
//
// Thread safety: all methods are thread-safe (one mutex). Error convention: Add returns false
// for a dropped batch; I/O errors of the spool are logged and turn into drops; a spool directory
// that cannot be created, listed or locked (flock: one Outbox per directory, also across
// processes) makes spool_error() non-empty.
#ifndef VRAMSCOPE_AGENT_OUTBOX_H_
#define VRAMSCOPE_AGENT_OUTBOX_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "vramscope/v1/events.pb.h"

namespace vramscope::agent {

struct OutboxOptions {
  // Serialized bytes of unacknowledged batches kept in memory.
  uint64_t max_memory_bytes = uint64_t{256} << 20;
  // Every batch is written here before the ring lets go of its events, and replayed by the next
  // Outbox over the directory; empty = no spool (memory only, lost when the agent dies).
  std::string spool_dir;
  uint64_t max_spool_bytes = uint64_t{1} << 30;
};

// The agent's own counters; a consistent snapshot.
struct AgentCounters {
  uint64_t batches_cut = 0;  // accepted by the outbox (sequence assigned)
  uint64_t events_cut = 0;
  uint64_t batches_sent = 0;          // written to a stream, first time
  uint64_t batches_resent = 0;        // written again after a reconnect
  uint64_t batches_acked = 0;         // forgotten after an acknowledgement
  uint64_t batches_spooled = 0;       // written to the spool
  uint64_t batches_replayed = 0;      // valid batches taken over from an earlier run's spool
  uint64_t spool_files_rejected = 0;  // unreadable/corrupt files of an earlier run, set aside
  uint64_t batches_dropped = 0;       // no room anywhere
  uint64_t events_dropped = 0;
  uint64_t batches_renumbered = 0;
  uint64_t batches_rejected = 0;  // refused by the collector as invalid, quarantined
  uint64_t events_rejected = 0;
  uint64_t processes_rejected = 0;  // processes with at least one rejected batch
  uint64_t pending_batches = 0;     // unacknowledged now
  uint64_t memory_bytes = 0;
  uint64_t spool_bytes = 0;
  uint64_t reconnects = 0;  // streams opened after the first
  uint64_t rings_open = 0;
  uint64_t rings_finished = 0;
  uint64_t rings_skipped = 0;            // other users' rings, or rings that failed to open
  uint64_t rings_damaged = 0;            // truncated while being read, closed (drain/ring_fault.h)
  uint64_t rings_identity_mismatch = 0;  // header pid not the file owner's (ring_reader.h)
  bool connected = false;
};

// A batch as the agent cuts it, its events already wire bytes (drain/event_encoder.h).
struct EncodedBatch {
  v1::ProcessKey process;
  std::string events;          // EventBatch.events entries (EncodedEvents::bytes)
  int event_count = 0;         // entries in `events`
  uint64_t first_time_ns = 0;  // the first event's time (a DropEvent put before it takes it)
  std::string counters;        // EventBatch.counters entries (AppendCountersField)
};

class Outbox {
 public:
  explicit Outbox(OutboxOptions options);
  ~Outbox();
  Outbox(const Outbox&) = delete;
  Outbox& operator=(const Outbox&) = delete;

  // Takes `batch` (process and events set; its sequence is assigned here). False: dropped.
  // `ring_end` is the ring position after the batch's last record, kept in its spool file so a
  // later run can tell which records of the ring it already holds. `stored`, if set, runs under
  // the outbox's lock once the batch is stored (spooled, with a spool) or dropped, and before the
  // sender can see it: it must be quick and must not call the Outbox.
  bool Add(EncodedBatch batch, uint64_t ring_end = 0, const std::function<void()>& stored = {});
  // The same for a batch built as a message (tests, tools, the agent's rare paths).
  bool Add(const v1::EventBatch& batch, uint64_t ring_end = 0,
           const std::function<void()>& stored = {});
  // The collector already holds batches 1..`acked_sequence` of `process` (from an earlier agent):
  // number this agent's batches after them (and after any replayed from the spool). Call before
  // the first Add for the process; afterwards it changes nothing.
  void SetStart(const v1::ProcessKey& process, uint64_t acked_sequence);

  // What the spool of an earlier run held for `process`, if anything.
  struct Replayed {
    uint64_t last_sequence = 0;  // highest sequence replayed
    uint64_t ring_end = 0;       // ring position after its last record (0: unknown)
    bool has_exit = false;       // that batch holds the process's ProcessExit
  };
  std::optional<Replayed> replayed(const v1::ProcessKey& process) const;
  // The processes of which the spool of an earlier run held batches.
  std::vector<v1::ProcessKey> replayed_processes() const;
  // Why the spool directory cannot be used ("" when it can, or when there is none).
  std::string spool_error() const;
  // Forgets the batches of `process` up to `acked_sequence`.
  void Ack(const v1::ProcessKey& process, uint64_t acked_sequence);
  // The collector rejected batch `sequence` of `process` for `reason`: quarantined and forgotten
  // (see above). Nothing happens when no such batch is pending.
  void Reject(const v1::ProcessKey& process, uint64_t sequence, const std::string& reason);
  // The reason of the first rejection ("" when none).
  std::string first_reject_reason() const;

  // The next batch not yet written on the current stream, waiting up to `timeout` for one.
  // nullptr on timeout or when Interrupt() was called since the last Rewind().
  // Its serialized EventBatch (what the uplink writes).
  std::shared_ptr<const std::string> NextToSendBytes(absl::Duration timeout);
  // The same parsed into a message (tests, tools); nullptr as above; empty where a string in it
  // is not UTF-8 (a host from a spool file's name), which proto3 does not parse.
  std::shared_ptr<const v1::EventBatch> NextToSend(absl::Duration timeout);
  // A new stream starts: everything unacknowledged is to be sent again.
  void Rewind();
  // Waits until every batch sent since the last Rewind() was acknowledged (or rejected); false
  // on timeout.
  bool WaitNothingInFlight(absl::Duration timeout);
  // Wakes NextToSend now (the stream broke or the agent stops).
  void Interrupt();

  void SetConnected(bool connected);
  void CountReconnect();
  // Waits until nothing is unacknowledged; false on timeout.
  bool WaitAllAcked(absl::Duration timeout);
  // Waits until at least `batches` batches were acknowledged in all; false on timeout.
  bool WaitAcked(uint64_t batches, absl::Duration timeout);
  bool Empty() const;

  // Counters (ring counters are filled in by the agent).
  AgentCounters counters() const;

 private:
  struct Entry {
    std::string process;  // ProcessKeyString
    uint64_t sequence = 0;
    uint64_t bytes = 0;
    int events = 0;
    bool sent = false;
    std::shared_ptr<const std::string> batch;  // serialized, in memory, or
    std::string spool_path;                    // in the spool (also)
    uint64_t ring_end = 0;
  };
  struct Process {
    v1::ProcessKey key;
    uint64_t next_sequence = 1;
    uint64_t acked = 0;
    uint64_t pending_drop_events = 0;  // to report in the next accepted batch
    bool numbered_here = false;        // this run numbered batches of it (SetStart is too late)
    bool rejected = false;             // a batch of it was rejected (and that was logged)
    std::optional<Replayed> replayed;
    uint64_t replay_base = 0;  // the replayed batches follow this sequence
  };

  struct SpoolFound;  // a batch file of an earlier run (outbox.cc)
  // By process (ProcessKeyString), then sequence.
  using SpoolFiles = std::map<std::pair<std::string, uint64_t>, SpoolFound>;

  // Reads an earlier run's spool into pending_ (constructor).
  void Replay() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replay's parts. ScanSpool reads the spool's files into *found, unusable ones set aside and
  // unfinished temporaries removed (counted in *temps); false when the spool cannot be listed.
  // QueueSpooled queues one found file's batch (a lost-batch report for an unusable one), after
  // QueueMissing's empty batches for sequences missing before it.
  bool ScanSpool(SpoolFiles* found, int* temps) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QueueSpooled(const std::string& name, SpoolFound& f, uint64_t* replayed, uint64_t* lost)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QueueMissing(const std::string& name, const v1::ProcessKey& key, uint64_t sequence,
                    Process& process, uint64_t* lost) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PopAcked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `entry`'s file: `batch` is its serialized EventBatch, `key` its process.
  bool Spool(Entry& entry, const v1::ProcessKey& key, std::string_view batch, uint64_t ring_end)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The serialized batch of an entry (read back from the spool when not in memory); a DropEvent
  // in its place when it cannot be read.
  std::shared_ptr<const std::string> Load(const Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Numbers the unacknowledged batches of process `name` from `first` on (spool files rewritten);
  // returns the next free sequence.
  uint64_t Renumber(const std::string& name, uint64_t first) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const OutboxOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Process> processes_ ABSL_GUARDED_BY(mu_);
  std::deque<Entry> pending_ ABSL_GUARDED_BY(mu_);
  size_t sent_count_ ABSL_GUARDED_BY(mu_) = 0;  // entries at the front written on this stream
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;
  std::string spool_error_ ABSL_GUARDED_BY(mu_);
  int spool_lock_fd_ = -1;  // the spool directory, flock()ed while this Outbox lives
  uint64_t spool_errors_ ABSL_GUARDED_BY(mu_) = 0;
  std::string first_reject_reason_ ABSL_GUARDED_BY(mu_);
  AgentCounters counters_ ABSL_GUARDED_BY(mu_);
};

// --- The spool file format (what Outbox writes and replays), for tests and fuzzing ------------
// A file is a 40-byte header (magic "VSSPOOL1", sequence, ring_end, payload length, CRC-32 of the
// payload; host byte order) and the serialized EventBatch, named
// PID_STARTTIMENS_SEQUENCE_EVENTS_HEXHOST.batch.
struct SpoolFile {
  v1::EventBatch batch;
  uint64_t ring_end = 0;
  uint64_t payload_bytes = 0;
};
std::string SpoolFileName(const v1::ProcessKey& key, uint64_t sequence, uint64_t events);
// Header and payload of the file for `batch` (its sequence as set). Error: not serializable.
absl::StatusOr<std::string> EncodeSpoolFile(const v1::EventBatch& batch, uint64_t ring_end);
// Validates a file's contents against its name (without the directory): what a replay accepts.
// InvalidArgument for a name that is not a spool file's; DataLoss for damaged contents.
absl::StatusOr<SpoolFile> ParseSpoolFile(absl::string_view file_name, absl::string_view bytes);

}  // namespace vramscope::agent

#endif  // VRAMSCOPE_AGENT_OUTBOX_H_
