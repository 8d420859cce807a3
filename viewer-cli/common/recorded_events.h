// RecordedEvents: the per-allocation events of a run, per process, in order: what the Perfetto
// trace, the Chrome trace's allocation slices and `vramscope export` are made from.
//
// `vramscope run` feeds it every drained event (Add); only the kinds those views use are kept
// (alloc, free, pool reserve/release, NVTX push/pop, OOM, site definitions, process start), up to
// a cap, past which events are counted, not kept. It is saved and read back as an event log: the
// collector's file format (collector/include/vramscope/collector/record_log.h: "VSLOG001", then
// CRC-framed EventBatch records of at most 4,096 events), so `vramscope export` reads both a
// `vramscope run --events FILE` and a log from the collector's data directory.
//
// Thread safety: none. Errors: absl::Status naming the file.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "vramscope/v1/events.pb.h"

namespace vramscope::cli {

struct ProcessEvents {
  v1::ProcessKey key;
  std::vector<v1::Event> events;  // in the order the process wrote them
};

class RecordedEvents {
 public:
  // 8 Mi events: about 1 GiB in memory.
  static constexpr std::size_t kDefaultMaxEvents = std::size_t{8} << 20;
  explicit RecordedEvents(std::size_t max_events = kDefaultMaxEvents) : max_events_(max_events) {}

  // True for the event kinds kept.
  static bool Keeps(const v1::Event& event);
  void Add(const v1::ProcessKey& key, const v1::Event& event);

  const std::vector<ProcessEvents>& processes() const { return processes_; }
  std::vector<ProcessEvents>& mutable_processes() { return processes_; }
  std::uint64_t dropped() const { return dropped_; }
  std::size_t events() const { return events_; }

 private:
  std::size_t max_events_;
  std::size_t events_ = 0;
  std::uint64_t dropped_ = 0;
  std::vector<ProcessEvents> processes_;
};

// Writes `events` as an event log (see above), replacing `path`.
absl::Status WriteEventLog(const std::string& path, const RecordedEvents& events);
// Reads an event log: its processes in the order they first appear. A damaged tail (a torn last
// record) ends the log with what was good before it; other damage is an error.
absl::StatusOr<RecordedEvents> ReadEventLog(const std::string& path);

}  // namespace vramscope::cli
