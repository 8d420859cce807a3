#include "vramscope/agent/agent.h"

#include <absl/strings/escaping.h>
#include <absl/strings/str_format.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <optional>
#include <utility>

#include "drain/event_encoder.h"
#include "drain/ring_directory.h"
#include "drain/ring_reader.h"
#include "vramscope/log.h"
#include "vramscope/ring.h"
#include "vramscope/ring/ring_dir.h"

namespace vramscope::agent {

std::string DefaultRingDir() {
  const interposer::RingDirChoice choice = interposer::ChooseRingDir();
  return choice.source == interposer::RingDirSource::kExplicit ? choice.dir
                                                               : interposer::DefaultRingDir();
}

bool UsesDefaultRingDir() {
  return interposer::ChooseRingDir().source != interposer::RingDirSource::kExplicit;
}

absl::Status PrepareDefaultRingDir(const std::string& dir) {
  const bool root = ::geteuid() == 0;
  const mode_t mode = root ? 01777 : 0700;
  if (::mkdir(dir.c_str(), mode) == 0) {
    // mkdir's mode passed through the umask; set it exactly, on the directory just made (opened
    // without following a symlink, so nothing swapped in can be chmod-ed).
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st {};
    const bool ok =
        fd >= 0 && ::fstat(fd, &st) == 0 && st.st_uid == ::geteuid() && ::fchmod(fd, mode) == 0;
    const int error = errno;
    if (fd >= 0) ::close(fd);
    if (!ok) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "cannot set the mode of the ring directory %s: %s", dir, ::strerror(error)));
    }
    Log(LogLevel::kInfo, absl::StrFormat("created the ring directory %s (mode %04o)", dir, mode));
  } else if (errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot create the ring directory %s: %s", dir, ::strerror(errno)));
  }
  const interposer::RingDirCheck check = interposer::CheckRingDir(dir.c_str());
  if (check.fd >= 0) ::close(check.fd);
  if (check.verdict != interposer::RingDirVerdict::kSafe) {
    char why[128];
    return absl::FailedPreconditionError(absl::StrFormat(
        "the ring directory %s %s, so traced processes would not write there; remove it, or "
        "pass --ring-dir and set VRAMSCOPE_RING_DIR to the same directory for the programs",
        dir, interposer::DescribeRingDirCheck(check, why, sizeof(why))));
  }
  return absl::OkStatus();
}

Agent::Agent(AgentOptions options)
    : options_(std::move(options)), outbox_(options_.outbox), uplink_(&outbox_, options_.uplink) {
  if (options_.ring_dir.empty()) options_.ring_dir = DefaultRingDir();
  if (options_.batch_events < 1) options_.batch_events = 1;
  directory_ = std::make_unique<RingDirectory>(options_.ring_dir);
  unprobed_ = outbox_.replayed_processes();
}

Agent::~Agent() { uplink_.Stop(); }

void Agent::OpenNewRings(const std::vector<std::string>& paths) {
  const uid_t self = ::geteuid();
  for (const std::string& path : paths) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) continue;  // gone again
    if (!options_.all_users && st.st_uid != self) {
      // Another user's process: its events are not ours to read (root reads every ring).
      Log(LogLevel::kInfo, absl::StrFormat("%s belongs to uid %d, not %d: skipped (run the agent "
                                           "as root to collect every user's rings)",
                                           path, st.st_uid, self));
      absl::MutexLock lock(&mu_);
      ++rings_skipped_;
      continue;
    }
    RingReader::Options reader_options;
    reader_options.commit_in_drain = false;  // Poll commits once the outbox stored the batch
    absl::StatusOr<std::unique_ptr<RingReader>> reader = RingReader::OpenFile(path, reader_options);
    if (!reader.ok()) {
      if (reader.status().code() == absl::StatusCode::kUnavailable ||
          reader.status().code() == absl::StatusCode::kFailedPrecondition) {
        // Not initialised yet, or another reader (vramscope run) holds it: try again later.
        directory_->Forget(path);
        if (complained_.insert(path).second) {
          Log(LogLevel::kInfo,
              absl::StrFormat("%s: %s; will retry", path, reader.status().message()));
        }
        continue;
      }
      Log(LogLevel::kError, absl::StrFormat("%s: %s; skipped", path, reader.status().ToString()));
      absl::MutexLock lock(&mu_);
      ++rings_skipped_;
      continue;
    }
    complained_.erase(path);
    const RingInfo& info = (*reader)->info();
    if (!options_.all_users && info.uid != self) {
      // The stat() above named another file than the one opened (renamed in between).
      Log(LogLevel::kInfo,
          absl::StrFormat("%s belongs to uid %d, not %d: skipped", path, info.uid, self));
      absl::MutexLock lock(&mu_);
      ++rings_skipped_;
      continue;
    }
    NoteIdentity(**reader);
    if (info.pid == 0) {
      // No process has pid 0, and the collector takes no batch that names it.
      absl::MutexLock lock(&mu_);
      ++rings_skipped_;
      continue;
    }
    Log(LogLevel::kInfo, absl::StrFormat("draining %s (pid %d)", path, info.pid));
    readers_.push_back(Ring{std::move(*reader)});
  }
}

void Agent::NoteIdentity(const RingReader& reader) {
  const RingInfo& info = reader.info();
  if (info.header_host != info.host) {
    Log(LogLevel::kInfo,
        absl::StrFormat("%s: the header names host \"%s\"; reported as this host, \"%s\"",
                        reader.path(), absl::CHexEscape(info.header_host), info.host));
  }
  if (info.identity == v1::PROCESS_IDENTITY_MISMATCH) {
    Log(LogLevel::kWarning,
        absl::StrFormat("%s: the header claims pid %d (uid %d), but %s; the file belongs to uid "
                        "%d. %s",
                        reader.path(), info.pid, info.header_uid,
                        info.pid == 0 ? "no process has pid 0"
                                      : "the live process with that pid runs as another user",
                        info.uid,
                        info.pid == 0 ? "Skipped"
                                      : absl::StrFormat("Its events are marked "
                                                        "PROCESS_IDENTITY_MISMATCH, under uid %d",
                                                        info.uid)));
    absl::MutexLock lock(&mu_);
    ++rings_identity_mismatch_;
  } else if (info.identity == v1::PROCESS_IDENTITY_UNVERIFIABLE) {
    Log(LogLevel::kInfo, absl::StrFormat("%s: no live process has pid %d and the ring's start "
                                         "time: its identity cannot be checked (marked "
                                         "PROCESS_IDENTITY_UNVERIFIABLE)",
                                         reader.path(), info.pid));
  }
}

void Agent::CloseDamaged(const RingReader& reader, const absl::Status& status) {
  Log(LogLevel::kError, absl::StrFormat("%s: %s; closed", reader.path(), status.ToString()));
  if (!reader.damaged()) return;
  absl::MutexLock lock(&mu_);
  ++rings_damaged_;
}

bool Agent::Position(Ring& ring) {
  if (ring.positioned) return true;
  RingReader& reader = *ring.reader;
  const std::optional<Outbox::Replayed> replayed = outbox_.replayed(reader.process_key());
  absl::StatusOr<uint64_t> acked = uplink_.Probe(reader.process_key(), absl::Milliseconds(500));
  if (acked.ok()) {
    if (*acked > 0) {
      Log(LogLevel::kInfo, absl::StrFormat("%s: the collector holds batches 1..%d of process %d "
                                           "from an earlier agent; continuing after them",
                                           reader.path(), *acked, reader.info().pid));
    }
    outbox_.SetStart(reader.process_key(), *acked);
    ring.positioned = true;
  } else if (replayed) {
    // Every batch the earlier agent numbered went to the spool first: the highest one there is
    // the highest it numbered, whatever the collector holds.
    Log(LogLevel::kInfo,
        absl::StrFormat("%s: the collector cannot be asked (%s); continuing after batch %d of "
                        "process %d, the spool's last",
                        reader.path(), acked.status().ToString(), replayed->last_sequence,
                        reader.info().pid));
    ring.positioned = true;
  } else if (reader.cursor() == 0) {
    ring.positioned = true;  // no reader consumed anything before us
  } else if (!ring.waiting_logged) {
    ring.waiting_logged = true;
    Log(LogLevel::kWarning,
        absl::StrFormat("%s: an earlier reader stopped at record %d; waiting for the collector "
                        "(%s) to say where its batches end before draining",
                        reader.path(), reader.cursor(), acked.status().ToString()));
  }
  if (ring.positioned && replayed && replayed->ring_end > reader.cursor()) {
    if (replayed->ring_end > reader.head()) {
      Log(LogLevel::kWarning,
          absl::StrFormat("%s: the spool says batch %d ended at record %d, beyond the ring's "
                          "head %d; not skipping anything",
                          reader.path(), replayed->last_sequence, replayed->ring_end,
                          reader.head()));
    } else {
      // The earlier agent died between writing the batch to the spool and moving the tail.
      Log(LogLevel::kInfo,
          absl::StrFormat("%s: records %d..%d are in spooled batch %d already; skipping them",
                          reader.path(), reader.cursor(), replayed->ring_end - 1,
                          replayed->last_sequence));
      ring.skip_to = replayed->ring_end;
      ring.keep_exit = !replayed->has_exit;
    }
  }
  return ring.positioned;
}

absl::StatusOr<bool> Agent::Skip(Ring& ring) {
  RingReader& reader = *ring.reader;
  google::protobuf::RepeatedPtrField<v1::Event> skipped;
  while (reader.cursor() < ring.skip_to) {
    absl::StatusOr<DrainStats> stats =
        reader.Drain(&skipped, static_cast<size_t>(ring.skip_to - reader.cursor()));
    if (!stats.ok()) return stats.status();
    if (stats->records == 0) break;  // a writer is still publishing one of them
  }
  reader.CommitTail();
  if (reader.cursor() < ring.skip_to) return false;
  ring.skip_to = 0;
  if (ring.keep_exit && reader.finished()) {
    // The writer died after the spooled batch: the drain synthesised its ProcessExit, which no
    // batch holds yet.
    for (v1::Event& event : skipped) {
      if (!event.has_process_exit()) continue;
      v1::EventBatch batch;
      *batch.mutable_process() = reader.process_key();
      *batch.add_events() = std::move(event);
      for (v1::DeviceCounters& counters : reader.Counters()) {
        *batch.add_counters() = std::move(counters);
      }
      outbox_.Add(std::move(batch), reader.cursor());
      break;
    }
  }
  return true;
}

absl::Status Agent::CutBatches(RingReader& reader, uint64_t* events) {
  while (true) {
    // The records go straight into wire bytes (drain/event_encoder.h): no message per event.
    EncodedEvents drained;
    // An allocation or free takes 30 to 60 bytes: room for most batches without regrowing.
    drained.Reserve(static_cast<size_t>(options_.batch_events) * 48);
    absl::StatusOr<DrainStats> stats =
        reader.Drain(&drained, static_cast<size_t>(options_.batch_events));
    if (!stats.ok()) return stats.status();
    if (drained.size() > 0) {
      EncodedBatch batch;
      batch.process = reader.process_key();
      batch.event_count = drained.size();
      batch.first_time_ns = drained.first_time_ns();
      batch.events = drained.TakeBytes();
      for (const v1::DeviceCounters& counters : reader.Counters()) {
        AppendCountersField(counters, &batch.counters);
      }
      *events += static_cast<uint64_t>(batch.event_count);
      // The tail moves past these records only once the outbox holds the batch (on disk, with
      // a spool), and before the uplink can send it: once acknowledged, its file is deleted.
      outbox_.Add(std::move(batch), reader.cursor(), [&reader] { reader.CommitTail(); });
    } else {
      reader.CommitTail();
    }
    if (stats->records < static_cast<uint64_t>(options_.batch_events)) return absl::OkStatus();
  }
}

absl::StatusOr<uint64_t> Agent::Poll() {
  // Replayed batches go out under their spooled sequences; if the collector holds less than they
  // follow on (it lost data), SetStart renumbers them after what it holds.
  while (!unprobed_.empty()) {
    absl::StatusOr<uint64_t> acked = uplink_.Probe(unprobed_.back(), absl::Milliseconds(500));
    if (!acked.ok()) break;  // not reachable now: next poll
    // With several collectors, one that holds nothing of the process has not lost data: another
    // holds the earlier batches, and this one takes the process over where the spool goes on.
    if (!(uplink_.several() && *acked == 0)) outbox_.SetStart(unprobed_.back(), *acked);
    unprobed_.pop_back();
  }
  absl::StatusOr<std::vector<std::string>> found = directory_->Scan();
  if (!found.ok()) return found.status();
  OpenNewRings(*found);

  uint64_t events = 0;
  uint64_t finished = 0;
  for (auto it = readers_.begin(); it != readers_.end();) {
    if (!Position(*it)) {
      ++it;
      continue;
    }
    RingReader& reader = *it->reader;
    bool drop_reader = false;
    if (it->skip_to > 0) {
      absl::StatusOr<bool> skipped = Skip(*it);
      if (skipped.ok() && !*skipped) {
        ++it;
        continue;
      }
      if (!skipped.ok()) {
        CloseDamaged(reader, skipped.status());
        it = readers_.erase(it);
        continue;
      }
    }
    if (absl::Status cut = CutBatches(reader, &events); !cut.ok()) {
      CloseDamaged(reader, cut);
      drop_reader = true;
    }
    if (!drop_reader && reader.damaged()) {
      // Truncated while its tail was being stored (CommitTail): the batches cut are kept.
      CloseDamaged(reader, reader.DamageStatus());
      drop_reader = true;
    }
    if (!drop_reader && reader.finished()) {
      // Everything the writer published is in the outbox and the writer is gone: the ring has
      // served its purpose (vramscope/ring.h: the reader removes it).
      Log(LogLevel::kInfo, absl::StrFormat("%s: process %d finished; ring removed", reader.path(),
                                           reader.info().pid));
      ::unlink(reader.path().c_str());
      drop_reader = true;
      ++finished;
    }
    it = drop_reader ? readers_.erase(it) : it + 1;
  }
  absl::MutexLock lock(&mu_);
  rings_finished_ += finished;
  rings_open_ = readers_.size();
  return events;
}

AgentCounters Agent::counters() const {
  AgentCounters counters = outbox_.counters();
  absl::MutexLock lock(&mu_);
  counters.rings_open = rings_open_;
  counters.rings_finished = rings_finished_;
  counters.rings_skipped = rings_skipped_;
  counters.rings_damaged = rings_damaged_;
  counters.rings_identity_mismatch = rings_identity_mismatch_;
  return counters;
}

}  // namespace vramscope::agent
