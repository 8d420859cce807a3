#include "vramscope/collector/process_stats.h"

#include <algorithm>

namespace vramscope::collector {

ProcessStats::ProcessStats() = default;
ProcessStats::~ProcessStats() = default;

void ProcessStats::Consume(const v1::EventBatch& batch) {
  events_ += static_cast<uint64_t>(batch.events_size());
  for (const v1::Event& event : batch.events()) {
    if (event.time_ns() != 0) {
      if (first_time_ns_ == 0 || event.time_ns() < first_time_ns_) first_time_ns_ = event.time_ns();
      last_time_ns_ = std::max(last_time_ns_, event.time_ns());
    }
    switch (event.payload_case()) {
      case v1::Event::kProcessStart: {
        const v1::ProcessStartEvent& start = event.process_start();
        command_line_.assign(start.command_line().begin(), start.command_line().end());
        mode_ = start.mode();
        for (const v1::DeviceInfo& device : start.devices()) devices_[device.ordinal()] = device;
        break;
      }
      case v1::Event::kProcessExit:
        finished_ = true;
        exit_code_ = event.process_exit().exit_code();
        break;
      default:
        break;
    }
  }
  for (const v1::DeviceCounters& counters : batch.counters())
    counters_[counters.device()] = counters;
}

uint64_t ProcessStats::PeakReservedBytes() const {
  uint64_t total = 0;
  for (const auto& [device, counters] : counters_) total += counters.peak_reserved_bytes();
  return total;
}

v1::Report ProcessStats::Report() const {
  v1::Report report;
  for (const std::string& arg : command_line_) report.add_command_line(arg);
  report.set_mode(mode_);
  report.set_finished(finished_);
  report.set_exit_code(exit_code_);
  report.set_start_time_ns(first_time_ns_);
  report.set_end_time_ns(last_time_ns_);
  report.set_events(events_);
  for (const auto& [ordinal, counters] : counters_) {
    v1::DeviceReport* device = report.add_devices();
    auto info = devices_.find(ordinal);
    if (info != devices_.end()) {
      *device->mutable_device() = info->second;
    } else {
      device->mutable_device()->set_ordinal(ordinal);
    }
    device->set_current_requested_bytes(counters.current_requested_bytes());
    device->set_peak_requested_bytes(counters.peak_requested_bytes());
    device->set_current_allocated_bytes(counters.current_allocated_bytes());
    device->set_peak_allocated_bytes(counters.peak_allocated_bytes());
    device->set_current_reserved_bytes(counters.current_reserved_bytes());
    device->set_peak_reserved_bytes(counters.peak_reserved_bytes());
    device->set_dropped_records(counters.records_dropped());
  }
  return report;
}

}  // namespace vramscope::collector
