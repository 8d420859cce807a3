// Agent: the drain loop of vramscope-agent, also usable as a library. It finds the event rings of
// a directory (new ones on every poll), drains each into batches of at most `batch_events`
// events with the ring header's exact counters attached, written as wire bytes straight from the
// ring records (drain/event_encoder.h), and hands them to an Outbox; an Uplink streams the
// Outbox's serialized batches to the collector. Rings of other users are skipped unless the agent
// runs as root. A ring whose writer is gone and that is fully drained is closed and its file
// removed.
//
// Before it cuts the first batch of a ring, the agent asks the collector (Uplink::Probe) which
// sequence it already holds for that process: an agent that ran before this one may have sent
// batches 1..N, and this one must continue at N + 1 or its batches would be taken for duplicates.
// While the collector cannot be asked, a ring an earlier reader had started on is left alone (it
// keeps buffering; the application never waits) unless the spool holds batches of that process
// (the numbering continues after them); a ring nobody read yet is drained anyway.
//
// The ring's tail moves past a batch's records only once the Outbox has stored it (with a spool:
// on disk), so an agent killed at any point leaves every record either in the ring or in the
// spool. If it died after the spool file was written but before the tail moved, the next agent
// finds the ring position after that batch in the spool and skips the records up to it.
//
// A ring file truncated by its owner while it is read (drain/ring_fault.h) is logged, counted in
// rings_damaged and closed; the other rings go on. A ring whose header claims a pid that is not
// its file owner's process (drain/ring_reader.h, "Identity") is logged once and counted in
// rings_identity_mismatch; its events are still sent, marked in ProcessStart.identity and under
// the file owner's uid.
//
// Thread safety: Poll() from one thread at a time; counters() and outbox() from any thread.
// Error convention: absl::Status (Poll fails only when the ring directory cannot be read); one
// ring failing is logged and counted in rings_skipped, the others go on.
#ifndef VRAMSCOPE_AGENT_AGENT_H_
#define VRAMSCOPE_AGENT_AGENT_H_

#include <absl/container/flat_hash_set.h>
#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "vramscope/agent/outbox.h"
#include "vramscope/agent/uplink.h"

namespace vramscope::agent {

class RingDirectory;
class RingReader;

struct AgentOptions {
  std::string ring_dir;  // empty: DefaultRingDir()
  int batch_events = 4096;
  bool all_users = false;  // read every user's rings (the agent forces this off unless root)
  OutboxOptions outbox;
  UplinkOptions uplink;
};

// Where the shim writes its ring (interposer/ring/ring_dir.h): $VRAMSCOPE_RING_DIR when it names a
// directory, else the default directory (/dev/shm/vramscope, VRAMSCOPE_RING_DEFAULT_DIR).
std::string DefaultRingDir();
// True when DefaultRingDir() is the default directory (VRAMSCOPE_RING_DIR unset, off or empty).
bool UsesDefaultRingDir();

// Makes the default ring directory usable by the shims that write there: creates `dir` when it is
// missing, mode 1777 (sticky: every user's processes write, none can touch another's ring) when the
// agent runs as root, else 0700 (only this user's processes), and checks an existing one by the
// shim's rule (CheckRingDir: a directory, not a symlink, owned by root or this user, sticky if
// others may write). kFailedPrecondition, naming the directory and the reason, when it cannot be
// created or is not safe (the shim would refuse it too).
absl::Status PrepareDefaultRingDir(const std::string& dir);

class Agent {
 public:
  explicit Agent(AgentOptions options);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Asks the collector where each process replayed from the spool stands (once it answers), then
  // opens rings that appeared since the last call and drains every open ring completely.
  // Returns the number of events handed to the outbox.
  absl::StatusOr<uint64_t> Poll();

  void StartUplink() { uplink_.Start(); }
  void StopUplink() { uplink_.Stop(); }
  Outbox& outbox() { return outbox_; }
  Uplink& uplink() { return uplink_; }
  AgentCounters counters() const;
  const AgentOptions& options() const { return options_; }

 private:
  void OpenNewRings(const std::vector<std::string>& paths);
  // Logs (and counts) what the reader found about the header's identity claims.
  void NoteIdentity(const RingReader& reader);
  // Logs a ring closed after `status`; counts it in rings_damaged if it was truncated.
  void CloseDamaged(const RingReader& reader, const absl::Status& status);

  AgentOptions options_;
  Outbox outbox_;
  Uplink uplink_;
  std::unique_ptr<RingDirectory> directory_;
  struct Ring {
    std::unique_ptr<RingReader> reader;
    // The collector told us where this process stands (or nothing can precede us): we may cut
    // batches. See Poll() for why this matters after an agent restart.
    bool positioned = false;
    bool waiting_logged = false;
    // Records before this position are in a batch replayed from the spool already.
    uint64_t skip_to = 0;
    bool keep_exit = false;  // that batch lacks the ProcessExit a skipped drain may synthesise
  };
  bool Position(Ring& ring);
  // Reads and discards the records below ring.skip_to; false while some are not there yet.
  absl::StatusOr<bool> Skip(Ring& ring);
  // Drains `reader` into batches of wire bytes handed to the outbox until it has no more
  // records, adding their events to *events. An error: the reader failed (damaged).
  absl::Status CutBatches(RingReader& reader, uint64_t* events);

  std::vector<Ring> readers_;
  // Processes replayed from the spool whose position at the collector is not known yet: their
  // rings may be gone, and a collector that lost their earlier batches would refuse them.
  std::vector<v1::ProcessKey> unprobed_;
  absl::flat_hash_set<std::string> complained_;  // paths already logged as unreadable
  mutable absl::Mutex mu_;
  uint64_t rings_finished_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rings_skipped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rings_damaged_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rings_identity_mismatch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rings_open_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace vramscope::agent

#endif  // VRAMSCOPE_AGENT_AGENT_H_
