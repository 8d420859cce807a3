// Outbox: every batch the agent has cut and the collector has not yet acknowledged.
//
// It numbers each process's batches (1, 2, 3, ... with no gaps), keeps them in memory up to a
// bound and beyond it (or while the collector is unreachable) in a spool directory, one file per
// batch, and hands them to the uplink in the order they were added. An acknowledgement forgets
// every batch of that process up to the acknowledged sequence. After a reconnect the uplink calls
// Rewind() and everything still unacknowledged is sent again; the collector drops duplicates.
//
// When neither memory nor spool has room, a batch is dropped before it gets a sequence number
// (so the collector sees no gap): its events are counted, logged, and reported to the collector
// as a DropEvent at the head of that process's next batch. Nothing is dropped silently.
//
// If an acknowledgement names a sequence this agent never assigned (the collector already holds
// batches of this process from an agent that ran before this one), the process's unacknowledged
// batches are renumbered after it and sent again, so nothing is taken for a duplicate.
//
// Thread safety: all methods are thread-safe (one mutex). Error convention: Add returns false
// for a dropped batch; I/O errors of the spool are logged and turn into drops.
#ifndef VRAMSCOPE_AGENT_OUTBOX_H_
#define VRAMSCOPE_AGENT_OUTBOX_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "vramscope/v1/events.pb.h"

namespace vramscope::agent {

struct OutboxOptions {
  // Serialized bytes of unacknowledged batches kept in memory.
  uint64_t max_memory_bytes = uint64_t{256} << 20;
  // Where batches go beyond the memory bound or while the collector is unreachable; empty = no
  // spool (such batches stay in memory up to the bound, then are dropped).
  std::string spool_dir;
  uint64_t max_spool_bytes = uint64_t{1} << 30;
};

// The agent's own counters; a consistent snapshot.
struct AgentCounters {
  uint64_t batches_cut = 0;  // accepted by the outbox (sequence assigned)
  uint64_t events_cut = 0;
  uint64_t batches_sent = 0;     // written to a stream, first time
  uint64_t batches_resent = 0;   // written again after a reconnect
  uint64_t batches_acked = 0;    // forgotten after an acknowledgement
  uint64_t batches_spooled = 0;  // written to the spool
  uint64_t batches_dropped = 0;  // no room anywhere
  uint64_t events_dropped = 0;
  uint64_t batches_renumbered = 0;
  uint64_t pending_batches = 0;  // unacknowledged now
  uint64_t memory_bytes = 0;
  uint64_t spool_bytes = 0;
  uint64_t reconnects = 0;  // streams opened after the first
  uint64_t rings_open = 0;
  uint64_t rings_finished = 0;
  uint64_t rings_skipped = 0;  // other users' rings, or rings that failed to open
  bool connected = false;
};

class Outbox {
 public:
  explicit Outbox(OutboxOptions options);
  ~Outbox();
  Outbox(const Outbox&) = delete;
  Outbox& operator=(const Outbox&) = delete;

  // Takes `batch` (process and events set; its sequence is assigned here). False: dropped.
  bool Add(v1::EventBatch batch);
  // The collector already holds batches 1..`acked_sequence` of `process` (from an earlier agent):
  // number this agent's batches after them. Call before the first Add for the process.
  void SetStart(const v1::ProcessKey& process, uint64_t acked_sequence);
  // Forgets the batches of `process` up to `acked_sequence`.
  void Ack(const v1::ProcessKey& process, uint64_t acked_sequence);

  // The next batch not yet written on the current stream, waiting up to `timeout` for one.
  // nullptr on timeout or when Interrupt() was called since the last Rewind().
  std::shared_ptr<const v1::EventBatch> NextToSend(absl::Duration timeout);
  // A new stream starts: everything unacknowledged is to be sent again.
  void Rewind();
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
    std::shared_ptr<const v1::EventBatch> batch;  // in memory, or
    std::string spool_path;                       // in the spool
  };
  struct Process {
    v1::ProcessKey key;
    uint64_t next_sequence = 1;
    uint64_t acked = 0;
    uint64_t pending_drop_events = 0;  // to report in the next accepted batch
  };

  void PopAcked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Spool(Entry& entry, const v1::EventBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const OutboxOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Process> processes_ ABSL_GUARDED_BY(mu_);
  std::deque<Entry> pending_ ABSL_GUARDED_BY(mu_);
  size_t sent_count_ ABSL_GUARDED_BY(mu_) = 0;  // entries at the front written on this stream
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;
  AgentCounters counters_ ABSL_GUARDED_BY(mu_);
};

std::string ProcessKeyString(const v1::ProcessKey& key);

}  // namespace vramscope::agent

#endif  // VRAMSCOPE_AGENT_OUTBOX_H_
