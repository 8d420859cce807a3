// Statistics of one process as the collector keeps them: the stats engine's view plus what the
// collector itself tracks (event count, command line, whether the process finished).
// Thread safety: none; the collector guards each instance with its process lock.
#ifndef VRAMSCOPE_COLLECTOR_PROCESS_STATS_H_
#define VRAMSCOPE_COLLECTOR_PROCESS_STATS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "vramscope/v1/events.pb.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::collector {

class ProcessStats {
 public:
  ProcessStats();
  ~ProcessStats();
  ProcessStats(const ProcessStats&) = delete;
  ProcessStats& operator=(const ProcessStats&) = delete;

  void Consume(const v1::EventBatch& batch);
  v1::Report Report() const;

  bool finished() const { return finished_; }
  uint64_t events() const { return events_; }
  const std::vector<std::string>& command_line() const { return command_line_; }
  // Highest peak reserved bytes summed over devices, from the ring's exact counters.
  uint64_t PeakReservedBytes() const;

 private:
  uint64_t events_ = 0;
  bool finished_ = false;
  int32_t exit_code_ = 0;
  uint64_t first_time_ns_ = 0;
  uint64_t last_time_ns_ = 0;
  std::string mode_;
  std::vector<std::string> command_line_;
  std::map<uint32_t, v1::DeviceInfo> devices_;
  std::map<uint32_t, v1::DeviceCounters> counters_;  // latest counters per device
};

}  // namespace vramscope::collector

#endif  // VRAMSCOPE_COLLECTOR_PROCESS_STATS_H_
