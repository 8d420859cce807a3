#include "common/report_text.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/labels_arg.h"
#include "common/process_end.h"
#include "common/size.h"
#include "common/symbolize.h"

namespace vramscope::cli {
namespace {

constexpr int kShown = 5;           // ranges, sites, leaks listed per device
constexpr int kLibrariesShown = 8;  // calling libraries listed per device before "others"

std::string Percent(double fraction) { return absl::StrFormat("%.1f%%", 100.0 * fraction); }

// The line under a list cut at `shown` of `total` entries: no list ends silently short.
void AppendMore(std::string* out, int total, int shown, std::string_view singular,
                std::string_view plural, std::string_view full_form) {
  if (total <= shown) return;
  const int more = total - shown;
  absl::StrAppendFormat(out, "      ... and %d more %s (%s for all)\n", more,
                        more == 1 ? singular : plural, full_form);
}

// The device line, its peaks, fragmentation, kinds and counts.
void AppendDeviceMemory(std::string* out, const v1::Report& report, const v1::DeviceReport& d) {
  const v1::DeviceInfo& info = d.device();
  absl::StrAppendFormat(out, "  cuda:%d%s%s\n", info.ordinal(),
                        info.name().empty() ? "" : absl::StrCat(" ", info.name()),
                        info.total_memory_bytes() == 0
                            ? ""
                            : absl::StrCat(" (", FormatBytes(info.total_memory_bytes()), ")"));
  absl::StrAppendFormat(out, "    peak      requested %-10s allocated %-10s reserved %-10s",
                        FormatBytes(d.peak_requested_bytes()),
                        FormatBytes(d.peak_allocated_bytes()),
                        FormatBytes(d.peak_reserved_bytes()));
  if (d.peak_allocated_bytes() > 0) {
    absl::StrAppendFormat(out, " reserved/allocated %.2f", d.reserved_over_allocated());
  }
  *out += "\n";
  absl::StrAppendFormat(
      out, "    %-9s requested %-10s allocated %-10s reserved %s\n",
      report.finished() ? "at exit" : "now", FormatBytes(d.current_requested_bytes()),
      FormatBytes(d.current_allocated_bytes()), FormatBytes(d.current_reserved_bytes()));
  const v1::FragmentationStats& f = d.fragmentation_at_peak();
  // Freed memory waiting for its fence explains reserved far above allocated (the program ran
  // ahead of the GPU); it is shown only when there is some.
  const std::string pending =
      f.pending_fence_bytes() > 0
          ? absl::StrCat(" (", FormatBytes(f.pending_fence_bytes()), " waiting for the fence)")
          : "";
  absl::StrAppendFormat(
      out,
      "    fragmentation at peak: external %s, free %s%s, largest free %s, unreleasable %s, "
      "rounding waste %s\n",
      Percent(f.external_fragmentation()), FormatBytes(f.free_bytes()), pending,
      FormatBytes(f.largest_free_block_bytes()), FormatBytes(f.unreleasable_free_bytes()),
      FormatBytes(f.rounding_waste_bytes()));
  // Peak bytes by how they were obtained, when anything but the pool served the program
  // (graph: the device's graph memory pool; array: CUDA arrays).
  if (d.peak_bytes_by_kind_size() > 1 ||
      (d.peak_bytes_by_kind_size() == 1 && d.peak_bytes_by_kind().count("pooled") == 0)) {
    const std::map<std::string, std::uint64_t> kinds(d.peak_bytes_by_kind().begin(),
                                                     d.peak_bytes_by_kind().end());
    std::vector<std::string> parts;
    for (const auto& [kind, bytes] : kinds) {
      parts.push_back(absl::StrCat(kind, " ", FormatBytes(bytes)));
    }
    absl::StrAppend(out, "    peak by kind: ", absl::StrJoin(parts, ", "), "\n");
  }
  absl::StrAppendFormat(out,
                        "    allocations %d (%.0f/s), frees %d, pool reserves %d, releases %d\n",
                        d.alloc_count(), d.allocs_per_second(), d.free_count(),
                        d.pool_reserve_count(), d.pool_release_count());
}

// CUPTI's view and out-of-memory events, when there are any.
void AppendCuptiAndOoms(std::string* out, const v1::Report& report, const v1::DeviceReport& d,
                        std::string_view full_form) {
  if (d.has_cupti()) {
    // The driver's own view (CUPTI), beside the shim's reserved figure it should match.
    const v1::CuptiStats& c = d.cupti();
    absl::StrAppendFormat(out,
                          "    CUPTI (driver view) device memory peak %-10s %s %-10s "
                          "allocations %d, frees %d%s\n",
                          FormatBytes(c.peak_bytes()), report.finished() ? "at exit" : "now",
                          FormatBytes(c.current_bytes()), c.alloc_count(), c.free_count(),
                          c.dropped_records() > 0
                              ? absl::StrCat(", ", c.dropped_records(), " records dropped by CUPTI")
                              : "");
  }
  if (!d.ooms().empty()) {
    int fragmentation = 0;
    for (const v1::OomRecord& oom : d.ooms()) {
      fragmentation += oom.verdict() == v1::OOM_VERDICT_FRAGMENTATION;
    }
    absl::StrAppendFormat(out,
                          "    out of memory: %d (fragmentation %d, capacity %d); first asked "
                          "%s with %s free, largest free block %s\n",
                          d.ooms_size(), fragmentation, d.ooms_size() - fragmentation,
                          FormatBytes(d.ooms(0).requested_bytes()),
                          FormatBytes(d.ooms(0).free_bytes()),
                          FormatBytes(d.ooms(0).largest_free_block_bytes()));
    if (d.ooms_size() > 1) {
      absl::StrAppendFormat(out, "      ... and %d more (%s for all)\n", d.ooms_size() - 1,
                            full_form);
    }
  }
}

// The NVTX ranges and top allocation sites, the first kShown of each.
void AppendRangesAndSites(std::string* out, const v1::DeviceReport& d, std::string_view full_form) {
  if (!d.nvtx_ranges().empty()) {
    *out += "    NVTX ranges (peak allocated while open, net growth, allocations, count):\n";
    for (int i = 0; i < std::min(kShown, d.nvtx_ranges_size()); ++i) {
      const v1::NvtxRangeStats& r = d.nvtx_ranges(i);
      const std::int64_t growth = r.net_growth_bytes();
      absl::StrAppendFormat(out, "      %-24s %-10s %s%-10s %6d allocs %6d times\n",
                            r.domain().empty() ? r.name() : absl::StrCat(r.domain(), ":", r.name()),
                            FormatBytes(r.peak_allocated_bytes()), growth < 0 ? "-" : "+",
                            FormatBytes(static_cast<std::uint64_t>(growth < 0 ? -growth : growth)),
                            r.alloc_count(), r.count());
    }
    AppendMore(out, d.nvtx_ranges_size(), kShown, "NVTX range", "NVTX ranges", full_form);
  }
  if (!d.top_sites().empty()) {
    *out += "    top allocation sites (peak live):\n";
    for (int i = 0; i < std::min(kShown, d.top_sites_size()); ++i) {
      const v1::SiteStats& s = d.top_sites(i);
      absl::StrAppendFormat(out, "      %-10s %6d allocs  %s\n", FormatBytes(s.peak_live_bytes()),
                            s.alloc_count(), SiteLabel(s));
    }
    AppendMore(out, d.top_sites_size(), kShown, "allocation site", "allocation sites", full_form);
  }
}

// Peak requested bytes by calling library, and the blocks not freed at exit.
void AppendLibrariesAndLeaks(std::string* out, const v1::DeviceReport& d,
                             std::string_view full_form) {
  if (!d.peak_requested_bytes_by_library().empty()) {
    // Each library's own peak (not at one instant), largest first; past kLibrariesShown the
    // rest as a count and their largest peak (peaks do not add up).
    std::vector<std::pair<std::string, std::uint64_t>> libraries(
        d.peak_requested_bytes_by_library().begin(), d.peak_requested_bytes_by_library().end());
    std::sort(libraries.begin(), libraries.end(), [](const auto& a, const auto& b) {
      return a.second != b.second ? a.second > b.second : a.first < b.first;
    });
    *out += "    peak requested by calling library (each its own peak):\n";
    const int shown = static_cast<int>(libraries.size()) <= kLibrariesShown + 1
                          ? static_cast<int>(libraries.size())
                          : kLibrariesShown;
    for (int i = 0; i < shown; ++i) {
      absl::StrAppendFormat(out, "      %-10s %s\n", FormatBytes(libraries[i].second),
                            libraries[i].first);
    }
    if (shown < static_cast<int>(libraries.size())) {
      absl::StrAppendFormat(out, "      ... and %d more libraries, each at most %s (%s for all)\n",
                            static_cast<int>(libraries.size()) - shown,
                            FormatBytes(libraries[shown].second), full_form);
    }
    if (d.unattributed_peak_requested_bytes() > 0) {
      absl::StrAppendFormat(out, "      %-10s without a recorded site\n",
                            FormatBytes(d.unattributed_peak_requested_bytes()));
    }
  }
  if (!d.leaks().empty()) {
    std::uint64_t bytes = 0;
    for (const v1::Leak& leak : d.leaks()) bytes += leak.requested_bytes();
    absl::StrAppendFormat(out,
                          "    not freed at exit: %d%s blocks, %s (largest first):", d.leaks_size(),
                          d.leaks_size() >= 100 ? "+" : "", FormatBytes(bytes));
    for (int i = 0; i < std::min(kShown, d.leaks_size()); ++i) {
      absl::StrAppendFormat(out, " %#x %s", d.leaks(i).address(),
                            FormatBytes(d.leaks(i).requested_bytes()));
    }
    if (d.leaks_size() > kShown) {
      absl::StrAppendFormat(out, " ... and %d more (%s for all)", d.leaks_size() - kShown,
                            full_form);
    }
    *out += "\n";
  }
}

}  // namespace

std::string FormatRunReport(const v1::Report& report, std::string_view full_form) {
  std::string out;
  const std::string command =
      report.command_line().empty() ? "?" : absl::StrJoin(report.command_line(), " ");
  std::string status =
      ProcessEndText(report.finished(), report.exit_code(), report.killed(), report.signal());
  std::uint64_t dropped = 0;
  for (const v1::DeviceReport& d : report.devices())
    dropped = std::max(dropped, d.dropped_records());
  absl::StrAppendFormat(&out, "vramscope: pid %d: %s\n", report.process().pid(), command);
  absl::StrAppendFormat(&out, "  %s, mode %s, %d events, %.3f s, %d records dropped%s\n", status,
                        report.mode().empty() ? "?" : report.mode(), report.events(),
                        static_cast<double>(report.end_time_ns() - report.start_time_ns()) / 1e9,
                        dropped, dropped > 0 ? " (peaks stay exact: ring counters)" : "");
  if (!report.labels().empty()) {
    absl::StrAppendFormat(&out, "  labels: %s\n",
                          LabelsForDisplay(Labels(report.labels().begin(), report.labels().end())));
  }
  if (report.devices().empty()) out += "  no device memory was allocated\n";
  for (const v1::DeviceReport& d : report.devices()) {
    AppendDeviceMemory(&out, report, d);
    AppendCuptiAndOoms(&out, report, d, full_form);
    AppendRangesAndSites(&out, d, full_form);
    AppendLibrariesAndLeaks(&out, d, full_form);
  }
  return out;
}

std::string FormatReportsJson(const std::vector<v1::Report>& reports) {
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  print.add_whitespace = true;
  auto one = [&](const v1::Report& report) {
    std::string json;
    (void)google::protobuf::util::MessageToJsonString(report, &json, print);
    return json;
  };
  if (reports.size() == 1) return one(reports[0]);
  std::string out = "{\"reports\": [\n";
  for (std::size_t i = 0; i < reports.size(); ++i) {
    if (i > 0) out += ",\n";
    out += one(reports[i]);
  }
  out += "]}\n";
  return out;
}

}  // namespace vramscope::cli
