// RingSession: the daemon-free pipeline of `vramscope run`: every ring in one directory
// (the command's and its children's), drained into one stats engine per process.
//
// Poll() finds rings created since the last call and drains every open one; Finish() drains
// until every ring is finished (its writer gone) or nothing moves, waiting up to kDyingGrace for
// writers still running then to exit (processes killed together with the command). With an Outbox
// (`vramscope run
// --collector`), the same events are also cut into batches of at most `batch_events` with the
// ring's exact counters attached, as vramscope-agent does, and added to it; the agent library's
// Uplink streams them. A ring here is always fresh (nothing read it before), so its batches are
// numbered from 1 without asking the collector first. A ring that cannot be opened
// yet is retried on the next Poll; one that is invalid is reported in warnings() and skipped.
// Thread safety: none. Error convention: absl::Status for the directory itself only.
#pragma once

#include <absl/status/status.h>
#include <absl/time/time.h>
#include <google/protobuf/repeated_ptr_field.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/recorded_events.h"
#include "drain/ring_directory.h"
#include "drain/ring_reader.h"
#include "run/chrome_trace.h"
#include "stats/stats_engine.h"
#include "vramscope/agent/outbox.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {

class RingSession {
 public:
  // How long Finish() waits for processes still running when CMD ended (see there).
  static constexpr absl::Duration kDyingGrace = absl::Milliseconds(500);

  // `trace` and `outbox` may be null; neither is owned, both must outlive this.
  RingSession(std::string dir, collector::StatsOptions options, ChromeTrace* trace,
              agent::Outbox* outbox = nullptr, int batch_events = 4096);
  ~RingSession();

  // The command `vramscope run` started (its direct child): its rings are not taken for ended
  // until ChildExited(), whose wait status then says how it ended, so a child that vanished
  // without an exit record (SIGKILL, abort, a crash) is reported with its signal and with the
  // time run saw it end. Call before the first Poll.
  void WatchChild(std::uint32_t pid);
  // Every drained event also goes to `recorder` (not owned; outlives this). Call before Poll.
  void SetRecorder(RecordedEvents* recorder) { recorder_ = recorder; }
  // `wait_status` from waitpid (-1: unknown, the rings are only released); `observed_ns` on the
  // event clock (CLOCK_MONOTONIC), when the exit was seen.
  void ChildExited(int wait_status, std::uint64_t observed_ns);

  absl::Status Poll();
  absl::Status Finish();
  // One report per process, in the order their rings were found.
  std::vector<v1::Report> Reports() const;
  const std::vector<std::string>& warnings() const { return warnings_; }
  std::size_t rings() const { return rings_.size(); }

 private:
  struct Ring {
    std::unique_ptr<agent::RingReader> reader;
    std::unique_ptr<collector::ProcessStatsEngine> stats;
    bool failed = false;
  };
  // Drains one ring once; returns the records consumed.
  std::uint64_t DrainOnce(Ring& ring);
  // Waits up to `grace` for the writers of unfinished rings to exit (pidfds); false when there
  // was none to wait for.
  bool WaitForStragglers(absl::Duration grace);
  // Tells in the child's ProcessExit what its wait status says.
  void AmendChildExit(const agent::RingReader& reader, v1::Event& event) const;
  // Moves buffer_'s events into batches for outbox_.
  void CutBatches(const agent::RingReader& reader);

  agent::RingDirectory directory_;
  collector::StatsOptions options_;
  ChromeTrace* trace_;
  agent::Outbox* outbox_;
  RecordedEvents* recorder_ = nullptr;
  int batch_events_;
  std::uint32_t child_pid_ = 0;  // 0: none watched
  bool child_exited_ = false;
  int child_status_ = -1;
  std::uint64_t child_exit_ns_ = 0;
  std::vector<Ring> rings_;
  std::vector<std::string> warnings_;
  google::protobuf::RepeatedPtrField<v1::Event> buffer_;
};

}  // namespace vramscope::cli
