#include "history/run_summary.h"

namespace vramscope::collector {

v1::RunSummary SummarizeRun(const v1::Report& report) {
  v1::RunSummary run;
  *run.mutable_process() = report.process();
  run.set_start_time_ns(report.start_time_ns());
  run.set_end_time_ns(report.end_time_ns());
  run.set_exit_code(report.exit_code());
  run.set_killed(report.killed());
  run.set_signal(report.signal());
  run.set_vanished(report.vanished());
  *run.mutable_command_line() = report.command_line();
  *run.mutable_labels() = report.labels();
  for (const v1::DeviceReport& device : report.devices()) {
    v1::RunDevicePeaks* peaks = run.add_devices();
    peaks->set_ordinal(device.device().ordinal());
    peaks->set_peak_requested_bytes(device.peak_requested_bytes());
    peaks->set_peak_allocated_bytes(device.peak_allocated_bytes());
    peaks->set_peak_reserved_bytes(device.peak_reserved_bytes());
    peaks->set_fragmentation_at_peak(device.fragmentation_at_peak().external_fragmentation());
    peaks->set_alloc_count(device.alloc_count());
    peaks->set_oom_count(static_cast<uint64_t>(device.ooms_size()));
    peaks->set_cupti_peak_bytes(device.cupti().peak_bytes());
  }
  return run;
}

bool RunPassed(const v1::RunSummary& run) { return run.exit_code() == 0 && !run.killed(); }

}  // namespace vramscope::collector
