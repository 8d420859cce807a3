#include "history/history_format.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/time/time.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <map>

#include "common/labels_arg.h"
#include "common/process_end.h"
#include "common/size.h"

namespace vramscope::cli {
namespace {

struct Peaks {
  std::uint64_t requested = 0, allocated = 0, reserved = 0, ooms = 0;
  double fragmentation = 0;
};

// The largest device's peaks (fragmentation: the device with the largest peak reserved).
Peaks LargestDevice(const v1::RunSummary& run) {
  Peaks p;
  for (const v1::RunDevicePeaks& d : run.devices()) {
    p.requested = std::max(p.requested, d.peak_requested_bytes());
    p.allocated = std::max(p.allocated, d.peak_allocated_bytes());
    if (d.peak_reserved_bytes() >= p.reserved) p.fragmentation = d.fragmentation_at_peak();
    p.reserved = std::max(p.reserved, d.peak_reserved_bytes());
    p.ooms += d.oom_count();
  }
  return p;
}

std::string Time(std::uint64_t ns) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixNanos(static_cast<int64_t>(ns)),
                          absl::UTCTimeZone());
}

std::string LabelsOf(const v1::RunSummary& run) {
  return LabelsForDisplay(Labels(run.labels().begin(), run.labels().end()));
}

std::string Csv(const std::string& field) {
  if (field.find_first_of(",\"\n\r") == std::string::npos) return field;
  std::string out = "\"";
  for (char c : field) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::string Sparkline(const std::vector<std::uint64_t>& values) {
  static constexpr const char* kBars[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  if (values.empty()) return "";
  const auto [low, high] = std::minmax_element(values.begin(), values.end());
  std::string out;
  for (std::uint64_t v : values) {
    const double span = static_cast<double>(*high - *low);
    const int level =
        span == 0 ? 3 : static_cast<int>((static_cast<double>(v - *low) / span) * 7.0 + 0.5);
    out += kBars[std::clamp(level, 0, 7)];
  }
  return out;
}

std::string FormatRunsText(const v1::ListRunsResponse& runs) {
  if (runs.runs().empty()) return "no runs match\n";
  // Label set -> its runs, oldest first.
  std::map<std::string, std::vector<const v1::RunSummary*>> groups;
  for (int i = runs.runs_size() - 1; i >= 0; --i)
    groups[LabelsOf(runs.runs(i))].push_back(&runs.runs(i));
  std::string out;
  for (const auto& [labels, group] : groups) {
    std::vector<std::uint64_t> reserved;
    for (const v1::RunSummary* run : group) reserved.push_back(LargestDevice(*run).reserved);
    const auto [low, high] = std::minmax_element(reserved.begin(), reserved.end());
    absl::StrAppendFormat(&out, "%s: %d run%s, peak reserved %s  (%s .. %s)\n",
                          labels.empty() ? "(no labels)" : labels, group.size(),
                          group.size() == 1 ? "" : "s", Sparkline(reserved), FormatBytes(*low),
                          FormatBytes(*high));
    absl::StrAppendFormat(&out, "  %6s  %-19s  %-15s  %10s  %10s  %10s  %5s  %4s  %s\n", "RUN",
                          "STARTED (UTC)", "STATUS", "REQUESTED", "ALLOCATED", "RESERVED", "FRAG",
                          "OOMS", "COMMAND");
    for (const v1::RunSummary* run : group) {
      const Peaks p = LargestDevice(*run);
      absl::StrAppendFormat(&out, "  %6d  %-19s  %-15s  %10s  %10s  %10s  %5.2f  %4d  %s\n",
                            run->run_id(), Time(run->start_time_ns()),
                            run->killed() ? ProcessEndTag(true, true, run->signal())
                                          : absl::StrCat("exited ", run->exit_code()),
                            FormatBytes(p.requested), FormatBytes(p.allocated),
                            FormatBytes(p.reserved), p.fragmentation, p.ooms,
                            absl::StrJoin(run->command_line(), " "));
    }
  }
  return out;
}

std::string FormatRunsCsv(const v1::ListRunsResponse& runs) {
  std::string out =
      "run_id,host,pid,start_time,end_time,exit_code,killed,signal,vanished,device,"
      "peak_requested_bytes,peak_allocated_bytes,peak_reserved_bytes,fragmentation_at_peak,"
      "alloc_count,oom_count,cupti_peak_bytes,labels,command_line\n";
  for (const v1::RunSummary& run : runs.runs()) {
    const std::string head = absl::StrCat(
        run.run_id(), ",", Csv(run.process().host()), ",", run.process().pid(), ",",
        Time(run.start_time_ns()), ",", Time(run.end_time_ns()), ",", run.exit_code(), ",",
        run.killed() ? 1 : 0, ",", run.signal(), ",", run.vanished() ? 1 : 0, ",");
    const std::string tail = absl::StrCat(",", Csv(LabelsOf(run)), ",",
                                          Csv(absl::StrJoin(run.command_line(), " ")), "\n");
    if (run.devices().empty()) out += head + ",,,,,,," + tail;
    for (const v1::RunDevicePeaks& d : run.devices()) {
      absl::StrAppend(&out, head, d.ordinal(), ",", d.peak_requested_bytes(), ",",
                      d.peak_allocated_bytes(), ",", d.peak_reserved_bytes(), ",",
                      absl::StrFormat("%.6f", d.fragmentation_at_peak()), ",", d.alloc_count(), ",",
                      d.oom_count(), ",", d.cupti_peak_bytes(), tail);
    }
  }
  return out;
}

std::string FormatRunsJson(const v1::ListRunsResponse& runs) {
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  print.add_whitespace = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(runs, &json, print);
  return json;
}

}  // namespace vramscope::cli
