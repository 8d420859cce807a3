// Statistics of one process as the collector keeps them: the stats engine (lib/stats/)
// builds reports; a few cheap figures (event count, command line, run labels, how it ended, peak
// reserved) are kept alongside so that ListProcesses and a metrics scrape do not build a full
// report per process.
// Thread safety: none; the collector guards each instance with its process lock.
#ifndef VRAMSCOPE_COLLECTOR_PROCESS_STATS_H_
#define VRAMSCOPE_COLLECTOR_PROCESS_STATS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "stats/stats_engine.h"
#include "vramscope/v1/events.pb.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::collector {

class ProcessStats {
 public:
  ProcessStats();
  ~ProcessStats();
  ProcessStats(const ProcessStats&) = delete;
  ProcessStats& operator=(const ProcessStats&) = delete;

  // `decoded`: the batch's events (IngestMessage::decoded; batch.events() holds only the ones
  // that are not allocations or frees), or nullptr for batch.events().
  void Consume(const v1::EventBatch& batch, const std::vector<BatchEvent>* decoded = nullptr);
  v1::Report Report() const;
  // The figures only, for live updates (Watch): no allocation list, timeline, top sites, leaks or
  // allocation sites (ReportAllocations::kFiguresOnly).
  v1::Report LiveReport() const;

  bool finished() const { return finished_; }
  // How it ended (the ProcessExit event's exit code, killed, signal, vanished) once finished().
  const v1::ProcessExitEvent& exit() const { return exit_; }
  uint64_t events() const { return events_; }
  const std::vector<std::string>& command_line() const { return command_line_; }
  // The run's labels (ProcessStartEvent.labels), sorted by name.
  const std::map<std::string, std::string>& labels() const { return labels_; }
  // Per device figures for metrics (ProcessStatsEngine::Gauges).
  std::vector<DeviceGauges> Gauges() const;
  // Wall-clock time of the latest event (ProcessStatsEngine::LastEventWallNs).
  uint64_t LastEventWallNs() const;
  // Highest peak reserved bytes summed over devices, from the ring's exact counters.
  uint64_t PeakReservedBytes() const;

 private:
  std::unique_ptr<ProcessStatsEngine> engine_;
  uint64_t events_ = 0;
  bool finished_ = false;
  v1::ProcessExitEvent exit_;
  std::vector<std::string> command_line_;
  std::map<std::string, std::string> labels_;
  std::map<uint32_t, uint64_t> peak_reserved_;  // per device, from the ring counters
};

}  // namespace vramscope::collector

#endif  // VRAMSCOPE_COLLECTOR_PROCESS_STATS_H_
