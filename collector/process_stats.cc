#include "vramscope/collector/process_stats.h"

#include <algorithm>

namespace vramscope::collector {

ProcessStats::ProcessStats() : engine_(std::make_unique<ProcessStatsEngine>()) {}
ProcessStats::~ProcessStats() = default;

void ProcessStats::Consume(const v1::EventBatch& batch, const std::vector<BatchEvent>* decoded) {
  if (decoded != nullptr) {
    engine_->AddBatch(batch, *decoded);
    events_ += decoded->size();
  } else {
    engine_->AddBatch(batch);
    events_ += static_cast<uint64_t>(batch.events_size());
  }
  // Starts and exits are never decoded: they are in batch.events() either way.
  for (const v1::Event& event : batch.events()) {
    if (event.has_process_start()) {
      const auto& args = event.process_start().command_line();
      command_line_.assign(args.begin(), args.end());
      const auto& labels = event.process_start().labels();
      labels_ = std::map<std::string, std::string>(labels.begin(), labels.end());
    } else if (event.has_process_exit()) {
      finished_ = true;
      exit_ = event.process_exit();
    }
  }
  for (const v1::DeviceCounters& counters : batch.counters()) {
    uint64_t& peak = peak_reserved_[counters.device()];
    peak = std::max(peak, counters.peak_reserved_bytes());
  }
}

uint64_t ProcessStats::PeakReservedBytes() const {
  uint64_t total = 0;
  for (const auto& [device, peak] : peak_reserved_) total += peak;
  return total;
}

std::vector<DeviceGauges> ProcessStats::Gauges() const { return engine_->Gauges(); }

uint64_t ProcessStats::LastEventWallNs() const { return engine_->LastEventWallNs(); }

v1::Report ProcessStats::Report() const { return engine_->Report(); }
v1::Report ProcessStats::LiveReport() const {
  return engine_->Report(ReportAllocations::kFiguresOnly);
}

}  // namespace vramscope::collector
