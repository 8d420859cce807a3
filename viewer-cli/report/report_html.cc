// The HTML page: see report_html.h for its contract (self-contained, data-path cells, escaping).
#include "report/report_html.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/time/time.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "run/process_end.h"
#include "run/size.h"
#include "vramscope/json/json_string.h"

namespace vramscope::cli {
namespace {

// What a cell holds; the page shows it in a readable form and keeps the exact value.
enum class Unit { kBytes, kSignedBytes, kCount, kRatio, kRate, kNanos, kTime, kHex, kEnum, kText };

const char* UnitName(Unit unit) {
  switch (unit) {
    case Unit::kBytes:
    case Unit::kSignedBytes:
      return "bytes";
    case Unit::kCount:
      return "count";
    case Unit::kRatio:
      return "ratio";
    case Unit::kRate:
      return "rate";
    case Unit::kNanos:
      return "ns";
    case Unit::kTime:
      return "time";
    case Unit::kHex:
      return "hex";
    case Unit::kEnum:
      return "enum";
    case Unit::kText:
      return "text";
  }
  return "text";
}

std::string Double17(double value) { return absl::StrFormat("%.17g", value); }

// "850 ns", "12.500 us", "3.250 ms", "2.000 s".
std::string Seconds(std::uint64_t ns) {
  const double value = static_cast<double>(ns);
  if (ns < 1000) return absl::StrCat(ns, " ns");
  if (ns < 1000000) return absl::StrFormat("%.3f us", value / 1e3);
  if (ns < 1000000000) return absl::StrFormat("%.3f ms", value / 1e6);
  return absl::StrFormat("%.3f s", value / 1e9);
}

// Builds the page. `origin_ns` is the time the current device's plot starts (event clock), so
// OOM and leak times read as offsets on the plot's axis.
class Page {
 public:
  std::string Build(const std::vector<v1::Report>& reports);

 private:
  void Process(const v1::Report& report, int r);
  // The labels' cell: one <code> per label, sorted by key.
  void LabelsCell(const v1::Report& report, const std::string& p);
  void Device(const v1::DeviceReport& device, const std::string& path, int r, int d, bool finished);
  void Plot(const v1::DeviceReport& device, int r, int d);

  // A <td> for a figure at `path` (ending in `field`).
  void Num(const std::string& path, std::string_view field, Unit unit, std::uint64_t value);
  void Signed(const std::string& path, std::string_view field, std::int64_t value);
  void Real(const std::string& path, std::string_view field, Unit unit, double value);
  void Enum(const std::string& path, std::string_view field, const std::string& name);
  void Text(const std::string& path, std::string_view field, std::string_view text);
  void Cell(const std::string& path, std::string_view field, Unit unit, const std::string& value,
            const std::string& shown, const std::string& title = "");

  std::string out_;
  std::string plots_json_;  // the script's data: one object per plotted device
  std::uint64_t origin_ns_ = 0;
  bool has_origin_ = false;
};

void Page::Cell(const std::string& path, std::string_view field, Unit unit,
                const std::string& value, const std::string& shown, const std::string& title) {
  absl::StrAppend(&out_, "<td class=\"", unit == Unit::kText ? "text" : "num", "\" data-path=\"",
                  HtmlEscape(path), "\" data-field=\"", HtmlEscape(field), "\" data-unit=\"",
                  UnitName(unit), "\"");
  if (unit != Unit::kText) absl::StrAppend(&out_, " data-value=\"", HtmlEscape(value), "\"");
  if (!title.empty()) absl::StrAppend(&out_, " title=\"", HtmlEscape(title), "\"");
  absl::StrAppend(&out_, ">", HtmlEscape(shown), "</td>");
}

void Page::Num(const std::string& path, std::string_view field, Unit unit, std::uint64_t value) {
  const std::string exact = absl::StrCat(value);
  switch (unit) {
    case Unit::kBytes:
      Cell(path, field, unit, exact, FormatBytes(value), absl::StrCat(value, " bytes"));
      return;
    case Unit::kNanos:
      Cell(path, field, unit, exact, Seconds(value), absl::StrCat(value, " ns"));
      return;
    case Unit::kTime: {
      // An event-clock time: shown as its offset on the device's plot when there is one.
      std::string shown = has_origin_ && value >= origin_ns_
                              ? absl::StrCat("+", Seconds(value - origin_ns_))
                              : absl::StrCat(value, " ns");
      Cell(path, field, unit, exact, shown, absl::StrCat(value, " ns (event clock)"));
      return;
    }
    case Unit::kHex:
      Cell(path, field, unit, exact, absl::StrFormat("%#x", value));
      return;
    default:
      Cell(path, field, unit, exact, exact);
      return;
  }
}

void Page::Signed(const std::string& path, std::string_view field, std::int64_t value) {
  const std::uint64_t magnitude =
      value < 0 ? static_cast<std::uint64_t>(-(value + 1)) + 1 : static_cast<std::uint64_t>(value);
  Cell(path, field, Unit::kSignedBytes, absl::StrCat(value),
       absl::StrCat(value < 0 ? "-" : "+", FormatBytes(magnitude)), absl::StrCat(value, " bytes"));
}

void Page::Real(const std::string& path, std::string_view field, Unit unit, double value) {
  std::string shown = unit == Unit::kRate ? absl::StrFormat("%.1f/s", value)
                      : field == "reserved_over_allocated"
                          ? absl::StrFormat("%.3f", value)
                          : absl::StrFormat("%.2f%%", 100.0 * value);
  Cell(path, field, unit, Double17(value), shown);
}

void Page::Enum(const std::string& path, std::string_view field, const std::string& name) {
  Cell(path, field, Unit::kEnum, name, name);
}

void Page::Text(const std::string& path, std::string_view field, std::string_view text) {
  Cell(path, field, Unit::kText, "", std::string(text));
}

constexpr char kStyle[] = R"css(
:root { --req: #1f77b4; --alloc: #2ca02c; --res: #d62728; --nvtx: #9467bd; }
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em auto; max-width: 1100px; color: #222;
       padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.25em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.1em; margin-top: 1.5em; } h4 { font-size: 1em; margin: 1em 0 .3em; }
table { border-collapse: collapse; margin: .3em 0 1em; }
th, td { border: 1px solid #ddd; padding: 2px 8px; vertical-align: top; }
th { background: #f4f4f4; text-align: left; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.text { word-break: break-all; }
p.none { color: #777; margin: .2em 0 1em; }
figure { margin: .5em 0 1em; }
svg.plot { width: 100%; height: auto; border: 1px solid #ddd; background: #fff; }
svg.plot .axis { stroke: #888; stroke-width: 1; }
svg.plot .grid { stroke: #eee; stroke-width: 1; }
svg.plot text { font-size: 11px; fill: #555; }
svg.plot path.series { fill: none; stroke-width: 1.5; }
svg.plot path.requested_bytes, .swatch.requested_bytes { stroke: var(--req); background: var(--req); }
svg.plot path.allocated_bytes, .swatch.allocated_bytes { stroke: var(--alloc); background: var(--alloc); }
svg.plot path.reserved_bytes, .swatch.reserved_bytes { stroke: var(--res); background: var(--res); }
svg.plot rect.nvtx-range { fill: var(--nvtx); fill-opacity: .12; stroke: var(--nvtx);
                           stroke-opacity: .35; stroke-width: .5; }
svg.plot text.nvtx-label { fill: #6a3d9a; font-size: 10px; }
figcaption { font-size: 12px; color: #555; }
.swatch { display: inline-block; width: 14px; height: 3px; vertical-align: middle; margin: 0 4px 0 10px; }
.swatch.nvtx { height: 10px; background: var(--nvtx); opacity: .25; }
)css";

// Draws every <svg class="plot"> from the JSON block: per device one path per series (a step
// line, one M or V command per timeline point) and one rect per NVTX range instance. Names go in
// through textContent only.
constexpr char kScript[] = R"js(
(function () {
  'use strict';
  var NS = 'http://www.w3.org/2000/svg';
  var SERIES = [['requested_bytes', 1, 'requested'], ['allocated_bytes', 2, 'allocated'],
                ['reserved_bytes', 3, 'reserved']];
  var W = 960, H = 300, L = 72, R = 16, T = 14, B = 34;
  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, String(attrs[k]));
    if (parent) parent.appendChild(e);
    return e;
  }
  function bytes(v) {
    var units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'], i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? String(Math.round(v)) : v.toPrecision(3)) + ' ' + units[i];
  }
  function seconds(ns) {
    if (ns < 1e3) return Math.round(ns) + ' ns';
    if (ns < 1e6) return (ns / 1e3).toPrecision(3) + ' us';
    if (ns < 1e9) return (ns / 1e6).toPrecision(3) + ' ms';
    return (ns / 1e9).toPrecision(3) + ' s';
  }
  var data = JSON.parse(document.getElementById('vramscope-plot-data').textContent);
  data.forEach(function (plot) {
    var svg = document.getElementById(plot.id);
    if (!svg) return;
    svg.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
    var points = plot.points, ranges = plot.ranges;
    var tmax = 1, ymax = 1;
    points.forEach(function (p) {
      tmax = Math.max(tmax, p[0]);
      ymax = Math.max(ymax, p[1], p[2], p[3]);
    });
    ranges.forEach(function (r) { tmax = Math.max(tmax, r.e); });
    function x(t) { return (L + (W - L - R) * t / tmax).toFixed(1); }
    function y(v) { return (H - B - (H - B - T) * v / ymax).toFixed(1); }
    var grid = el('g', {'class': 'grid-lines'}, svg);
    for (var i = 0; i <= 4; i++) {
      var v = ymax * i / 4, yy = y(v);
      el('line', {'class': 'grid', x1: L, x2: W - R, y1: yy, y2: yy}, grid);
      el('text', {x: L - 6, y: yy, 'text-anchor': 'end', 'dominant-baseline': 'middle'}, grid)
          .textContent = bytes(v);
      var t = tmax * i / 4, xx = x(t);
      var anchor = i === 0 ? 'start' : (i === 4 ? 'end' : 'middle');
      el('text', {x: xx, y: H - B + 16, 'text-anchor': anchor}, grid).textContent = seconds(t);
    }
    var shading = el('g', {'class': 'nvtx'}, svg);
    ranges.forEach(function (r) {
      var x0 = Number(x(r.s)), width = Math.max(1, Number(x(r.e)) - x0);
      var rect = el('rect', {'class': 'nvtx-range', x: x0, y: T, width: width, height: H - B - T,
                             'data-depth': r.d}, shading);
      el('title', {}, rect).textContent = r.label + ' (' + seconds(r.e - r.s) + ')';
      if (width > 48) {
        el('text', {'class': 'nvtx-label', x: x0 + 3, y: T + 10 + 11 * Math.min(r.d, 8)}, shading)
            .textContent = r.label;
      }
    });
    el('line', {'class': 'axis', x1: L, x2: L, y1: T, y2: H - B}, svg);
    el('line', {'class': 'axis', x1: L, x2: W - R, y1: H - B, y2: H - B}, svg);
    SERIES.forEach(function (s) {
      var d = '';
      points.forEach(function (p, i) {
        d += i === 0 ? 'M' + x(p[0]) + ',' + y(p[s[1]]) : 'H' + x(p[0]) + 'V' + y(p[s[1]]);
      });
      var path = el('path', {'class': 'series ' + s[0], 'data-series': s[0], d: d}, svg);
      el('title', {}, path).textContent = s[2];
    });
    svg.setAttribute('data-rendered', 'true');
  });
})();
)js";

std::string Page::Build(const std::vector<v1::Report>& reports) {
  std::string title = "vramscope report";
  if (reports.size() == 1) {
    const v1::Report& report = reports[0];
    absl::StrAppend(&title, ": pid ", report.process().pid());
    if (!report.command_line().empty()) absl::StrAppend(&title, " ", report.command_line(0));
  }
  absl::StrAppend(
      &out_,
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      // Nothing may be fetched: the page must work as a file, offline, from a CI artefact.
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
      "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">\n"
      "<meta name=\"generator\" content=\"vramscope report\">\n<title>",
      HtmlEscape(title), "</title>\n<style>", kStyle, "</style>\n</head>\n<body>\n",
      "<h1>vramscope report</h1>\n");
  if (reports.empty()) out_ += "<p class=\"none\">no processes</p>\n";
  for (std::size_t r = 0; r < reports.size(); ++r) Process(reports[r], static_cast<int>(r));
  absl::StrAppend(&out_, "<script type=\"application/json\" id=\"vramscope-plot-data\">[",
                  plots_json_, "]</script>\n<script>", kScript, "</script>\n</body>\n</html>\n");
  return std::move(out_);
}

void Page::LabelsCell(const v1::Report& report, const std::string& p) {
  out_ += "<td class=\"text\">";
  // Sorted by key (the map's order is not defined), one element per label.
  const std::map<std::string, std::string> labels(report.labels().begin(), report.labels().end());
  bool first = true;
  for (const auto& [key, value] : labels) {
    absl::StrAppend(&out_, first ? "" : " ", "<code data-path=\"", p, ".labels.", HtmlEscape(key),
                    "\" data-field=\"labels\" data-unit=\"text\">", HtmlEscape(key), "=",
                    HtmlEscape(value), "</code>");
    first = false;
  }
  out_ += "</td></tr>\n";
}

void Page::Process(const v1::Report& report, int r) {
  const std::string p = absl::StrCat(r);
  absl::StrAppend(&out_, "<section class=\"process\" data-report=\"", r, "\">\n<h2>pid ",
                  report.process().pid(),
                  report.process().host().empty()
                      ? ""
                      : absl::StrCat(" on ", HtmlEscape(report.process().host())),
                  report.command_line().empty()
                      ? ""
                      : absl::StrCat(": ", HtmlEscape(absl::StrJoin(report.command_line(), " "))),
                  "</h2>\n<table class=\"process-summary\">\n");
  auto row = [&](const char* label) { absl::StrAppend(&out_, "<tr><th>", label, "</th>"); };
  row("host");
  Text(p + ".process.host", "host", report.process().host());
  out_ += "</tr>\n";
  row("pid");
  Num(p + ".process.pid", "pid", Unit::kCount, report.process().pid());
  out_ += "</tr>\n";
  row("command line");
  // One element per argument (so each is findable), shown as one line.
  out_ += "<td class=\"text\">";
  if (report.command_line().empty()) out_ += "?";
  for (int i = 0; i < report.command_line_size(); ++i) {
    absl::StrAppend(&out_, i == 0 ? "" : " ", "<code data-path=\"", p, ".command_line.", i,
                    "\" data-field=\"command_line\" data-unit=\"text\">",
                    HtmlEscape(report.command_line(i)), "</code>");
  }
  out_ += "</td></tr>\n";
  if (!report.labels().empty()) {
    row("labels");
    LabelsCell(report, p);
  }
  row("mode");
  Text(p + ".mode", "mode", report.mode());
  out_ += "</tr>\n";
  row("status, exit code");
  Cell(p + ".finished", "finished", Unit::kEnum, report.finished() ? "true" : "false",
       report.finished()
           ? ProcessEndText(true, report.exit_code(), report.killed(), report.signal())
           : "still running");
  if (report.finished()) {
    Cell(p + ".exit_code", "exit_code", Unit::kCount, absl::StrCat(report.exit_code()),
         absl::StrCat(report.exit_code()));
  }
  out_ += "</tr>\n";
  if (report.finished()) {
    row("killed, signal, vanished");
    Cell(p + ".killed", "killed", Unit::kEnum, report.killed() ? "true" : "false",
         report.killed() ? "killed" : "not killed");
    Cell(p + ".signal", "signal", Unit::kCount, absl::StrCat(report.signal()),
         absl::StrCat(report.signal()), report.signal() > 0 ? SignalName(report.signal()) : "");
    Cell(p + ".vanished", "vanished", Unit::kEnum, report.vanished() ? "true" : "false",
         report.vanished() ? "no exit record" : "exit record written");
    out_ += "</tr>\n";
  }
  row("started");
  {
    const absl::Time start = absl::FromUnixNanos(
        static_cast<std::int64_t>(std::min<std::uint64_t>(report.start_time_ns(), INT64_MAX)));
    Cell(p + ".start_time_ns", "start_time_ns", Unit::kTime, absl::StrCat(report.start_time_ns()),
         absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC", start, absl::UTCTimeZone()),
         absl::StrCat(report.start_time_ns(), " ns"));
  }
  out_ += "</tr>\n";
  row("duration");
  Cell(p + ".end_time_ns", "end_time_ns", Unit::kTime, absl::StrCat(report.end_time_ns()),
       Seconds(report.end_time_ns() > report.start_time_ns()
                   ? report.end_time_ns() - report.start_time_ns()
                   : 0),
       absl::StrCat("ends at ", report.end_time_ns(), " ns"));
  out_ += "</tr>\n";
  row("events");
  Num(p + ".events", "events", Unit::kCount, report.events());
  out_ += "</tr>\n";
  // What the agent could check of the ring's claims, and whether sizes had to be held at 2^64-1
  // (agent/README.md, "Hostile ring files").
  row("uid, identity");
  Num(p + ".uid", "uid", Unit::kCount, report.uid());
  Enum(p + ".identity", "identity", v1::ProcessIdentity_Name(report.identity()));
  out_ += "</tr>\n";
  row("saturated events");
  Num(p + ".saturated_events", "saturated_events", Unit::kCount, report.saturated_events());
  out_ += "</tr>\n</table>\n";
  if (report.devices().empty()) out_ += "<p class=\"none\">no device memory was allocated</p>\n";
  for (int d = 0; d < report.devices_size(); ++d) {
    Device(report.devices(d), absl::StrCat(p, ".devices.", d), r, d, report.finished());
  }
  out_ += "</section>\n";
}

void Page::Device(const v1::DeviceReport& device, const std::string& path, int r, int d,
                  bool finished) {
  const v1::DeviceInfo& info = device.device();
  absl::StrAppend(&out_, "<section class=\"device\" data-report=\"", r, "\" data-device=\"", d,
                  "\" data-ordinal=\"", info.ordinal(), "\">\n<h3>cuda:", info.ordinal(),
                  info.name().empty() ? "" : absl::StrCat(" ", HtmlEscape(info.name())), "</h3>\n");
  // Times of OOMs and leaks as offsets on this device's plot.
  has_origin_ = false;
  for (const v1::TimelinePoint& point : device.timeline()) {
    if (!has_origin_ || point.time_ns() < origin_ns_) origin_ns_ = point.time_ns();
    has_origin_ = true;
  }
  for (const v1::NvtxRangeInstance& range : device.nvtx_instances()) {
    if (!has_origin_ || range.start_ns() < origin_ns_) origin_ns_ = range.start_ns();
    has_origin_ = true;
  }

  out_ += "<table class=\"device-info\">\n<tr><th>name</th>";
  Text(path + ".device.name", "name", info.name());
  out_ += "<th>uuid</th>";
  Text(path + ".device.uuid", "uuid", info.uuid());
  out_ += "<th>memory</th>";
  Num(path + ".device.total_memory_bytes", "total_memory_bytes", Unit::kBytes,
      info.total_memory_bytes());
  out_ += "</tr>\n</table>\n";

  Plot(device, r, d);

  out_ += "<h4>Peaks</h4>\n<table class=\"peaks\">\n<tr><th></th><th>peak</th><th>";
  out_ += finished ? "at exit" : "now";
  out_ += "</th></tr>\n";
  const struct {
    const char* label;
    const char* peak;
    std::uint64_t peak_value;
    const char* current;
    std::uint64_t current_value;
  } peaks[] = {
      {"requested", "peak_requested_bytes", device.peak_requested_bytes(),
       "current_requested_bytes", device.current_requested_bytes()},
      {"allocated", "peak_allocated_bytes", device.peak_allocated_bytes(),
       "current_allocated_bytes", device.current_allocated_bytes()},
      {"reserved", "peak_reserved_bytes", device.peak_reserved_bytes(), "current_reserved_bytes",
       device.current_reserved_bytes()},
  };
  for (const auto& row : peaks) {
    absl::StrAppend(&out_, "<tr><th>", row.label, "</th>");
    Num(absl::StrCat(path, ".", row.peak), row.peak, Unit::kBytes, row.peak_value);
    Num(absl::StrCat(path, ".", row.current), row.current, Unit::kBytes, row.current_value);
    out_ += "</tr>\n";
  }
  out_ += "</table>\n<table class=\"counts\">\n";
  auto count_row = [&](const char* label, const char* field, std::uint64_t value) {
    absl::StrAppend(&out_, "<tr><th>", label, "</th>");
    Num(absl::StrCat(path, ".", field), field, Unit::kCount, value);
    out_ += "</tr>\n";
  };
  out_ += "<tr><th>reserved / allocated at peak</th>";
  Real(path + ".reserved_over_allocated", "reserved_over_allocated", Unit::kRatio,
       device.reserved_over_allocated());
  out_ += "</tr>\n";
  count_row("allocations", "alloc_count", device.alloc_count());
  count_row("frees", "free_count", device.free_count());
  out_ += "<tr><th>allocation rate</th>";
  Real(path + ".allocs_per_second", "allocs_per_second", Unit::kRate, device.allocs_per_second());
  out_ += "</tr>\n";
  count_row("pool reservations", "pool_reserve_count", device.pool_reserve_count());
  count_row("pool releases", "pool_release_count", device.pool_release_count());
  count_row("records dropped", "dropped_records", device.dropped_records());
  count_row("NVTX range instances not plotted", "nvtx_instances_dropped",
            device.nvtx_instances_dropped());
  out_ += "</table>\n";

  out_ +=
      "<h4>Fragmentation</h4>\n<table class=\"fragmentation\">\n<tr><th></th><th>"
      "now</th><th>at peak reserved</th></tr>\n";
  const struct {
    const char* label;
    const char* field;
    std::uint64_t (v1::FragmentationStats::*get)() const;
  } frag[] = {
      {"free", "free_bytes", &v1::FragmentationStats::free_bytes},
      {"of it waiting for the fence", "pending_fence_bytes",
       &v1::FragmentationStats::pending_fence_bytes},
      {"largest free block", "largest_free_block_bytes",
       &v1::FragmentationStats::largest_free_block_bytes},
      {"unreleasable free", "unreleasable_free_bytes",
       &v1::FragmentationStats::unreleasable_free_bytes},
      {"rounding waste", "rounding_waste_bytes", &v1::FragmentationStats::rounding_waste_bytes},
      {"largest allocatable", "largest_allocatable_bytes",
       &v1::FragmentationStats::largest_allocatable_bytes},
  };
  out_ += "<tr><th>external fragmentation</th>";
  Real(path + ".fragmentation.external_fragmentation", "external_fragmentation", Unit::kRatio,
       device.fragmentation().external_fragmentation());
  Real(path + ".fragmentation_at_peak.external_fragmentation", "external_fragmentation",
       Unit::kRatio, device.fragmentation_at_peak().external_fragmentation());
  out_ += "</tr>\n";
  for (const auto& row : frag) {
    absl::StrAppend(&out_, "<tr><th>", row.label, "</th>");
    Num(absl::StrCat(path, ".fragmentation.", row.field), row.field, Unit::kBytes,
        (device.fragmentation().*row.get)());
    Num(absl::StrCat(path, ".fragmentation_at_peak.", row.field), row.field, Unit::kBytes,
        (device.fragmentation_at_peak().*row.get)());
    out_ += "</tr>\n";
  }
  out_ += "</table>\n";

  out_ += "<h4>Out of memory</h4>\n";
  if (device.ooms().empty()) {
    out_ += "<p class=\"none\">none</p>\n";
  } else {
    out_ +=
        "<table class=\"ooms\">\n<tr><th>time</th><th>requested</th><th>free</th>"
        "<th>largest free block</th><th>verdict</th></tr>\n";
    for (int i = 0; i < device.ooms_size(); ++i) {
      const v1::OomRecord& oom = device.ooms(i);
      const std::string at = absl::StrCat(path, ".ooms.", i, ".");
      out_ += "<tr>";
      Num(at + "time_ns", "time_ns", Unit::kTime, oom.time_ns());
      Num(at + "requested_bytes", "requested_bytes", Unit::kBytes, oom.requested_bytes());
      Num(at + "free_bytes", "free_bytes", Unit::kBytes, oom.free_bytes());
      Num(at + "largest_free_block_bytes", "largest_free_block_bytes", Unit::kBytes,
          oom.largest_free_block_bytes());
      Enum(at + "verdict", "verdict", v1::OomVerdict_Name(oom.verdict()));
      out_ += "</tr>\n";
    }
    out_ += "</table>\n";
  }

  out_ += "<h4>NVTX ranges</h4>\n";
  if (device.nvtx_ranges().empty()) {
    out_ += "<p class=\"none\">none</p>\n";
  } else {
    out_ +=
        "<table class=\"nvtx-ranges\">\n<tr><th>domain</th><th>name</th><th>count</th>"
        "<th>peak allocated while open</th><th>net growth</th><th>allocations</th>"
        "<th>total time</th></tr>\n";
    for (int i = 0; i < device.nvtx_ranges_size(); ++i) {
      const v1::NvtxRangeStats& range = device.nvtx_ranges(i);
      const std::string at = absl::StrCat(path, ".nvtx_ranges.", i, ".");
      out_ += "<tr>";
      Text(at + "domain", "domain", range.domain());
      Text(at + "name", "name", range.name());
      Num(at + "count", "count", Unit::kCount, range.count());
      Num(at + "peak_allocated_bytes", "peak_allocated_bytes", Unit::kBytes,
          range.peak_allocated_bytes());
      Signed(at + "net_growth_bytes", "net_growth_bytes", range.net_growth_bytes());
      Num(at + "alloc_count", "alloc_count", Unit::kCount, range.alloc_count());
      Num(at + "total_time_ns", "total_time_ns", Unit::kNanos, range.total_time_ns());
      out_ += "</tr>\n";
    }
    out_ += "</table>\n";
  }

  out_ += "<h4>Top allocation sites</h4>\n";
  if (device.top_sites().empty()) {
    out_ += "<p class=\"none\">none</p>\n";
  } else {
    out_ +=
        "<table class=\"top-sites\">\n<tr><th>site</th><th>peak live</th><th>allocations</th>"
        "<th>total bytes</th><th>frames</th></tr>\n";
    for (int i = 0; i < device.top_sites_size(); ++i) {
      const v1::SiteStats& site = device.top_sites(i);
      const std::string at = absl::StrCat(path, ".top_sites.", i, ".");
      out_ += "<tr>";
      Num(at + "site", "site", Unit::kHex, site.site());
      Num(at + "peak_live_bytes", "peak_live_bytes", Unit::kBytes, site.peak_live_bytes());
      Num(at + "alloc_count", "alloc_count", Unit::kCount, site.alloc_count());
      Num(at + "total_bytes", "total_bytes", Unit::kBytes, site.total_bytes());
      out_ += "<td class=\"frames\"><table class=\"frames\">";
      for (int f = 0; f < site.frames_size(); ++f) {
        out_ += "<tr>";
        Text(absl::StrCat(at, "frames.", f), "frames", site.frames(f));
        out_ += "</tr>";
      }
      out_ += "</table></td></tr>\n";
    }
    out_ += "</table>\n";
  }

  out_ += "<h4>Not freed at exit</h4>\n";
  if (device.leaks().empty()) {
    out_ += finished ? "<p class=\"none\">none</p>\n"
                     : "<p class=\"none\">the process has not exited</p>\n";
  } else {
    out_ +=
        "<table class=\"leaks\">\n<tr><th>address</th><th>requested</th><th>kind</th>"
        "<th>site</th><th>allocated at</th></tr>\n";
    for (int i = 0; i < device.leaks_size(); ++i) {
      const v1::Leak& leak = device.leaks(i);
      const std::string at = absl::StrCat(path, ".leaks.", i, ".");
      out_ += "<tr>";
      Num(at + "address", "address", Unit::kHex, leak.address());
      Num(at + "requested_bytes", "requested_bytes", Unit::kBytes, leak.requested_bytes());
      Enum(at + "kind", "kind", v1::AllocationKind_Name(leak.kind()));
      Num(at + "site", "site", Unit::kHex, leak.site());
      Num(at + "time_ns", "time_ns", Unit::kTime, leak.time_ns());
      out_ += "</tr>\n";
    }
    out_ += "</table>\n";
  }

  if (device.has_cupti()) {
    // The driver's own records (CUPTI), apart from the shim's figures above.
    const v1::CuptiStats& cupti = device.cupti();
    const std::string at = path + ".cupti.";
    out_ +=
        "<h4>CUPTI (the driver's view)</h4>\n<table class=\"cupti\">\n<tr><th></th><th>now</th>"
        "<th>peak</th></tr>\n<tr><th>device memory</th>";
    Num(at + "current_bytes", "current_bytes", Unit::kBytes, cupti.current_bytes());
    Num(at + "peak_bytes", "peak_bytes", Unit::kBytes, cupti.peak_bytes());
    out_ += "</tr>\n";
    // Memory kinds sorted by name (proto maps have no order); a kind may have only one side.
    std::map<std::string, std::pair<const std::uint64_t*, const std::uint64_t*>> kinds;
    for (const auto& [kind, bytes] : cupti.current_bytes_by_memory_kind()) {
      kinds[kind].first = &bytes;
    }
    for (const auto& [kind, bytes] : cupti.peak_bytes_by_memory_kind()) kinds[kind].second = &bytes;
    for (const auto& [kind, values] : kinds) {
      absl::StrAppend(&out_, "<tr><th>", HtmlEscape(kind), "</th>");
      if (values.first != nullptr) {
        Num(absl::StrCat(at, "current_bytes_by_memory_kind.", kind), "current_bytes_by_memory_kind",
            Unit::kBytes, *values.first);
      } else {
        out_ += "<td></td>";
      }
      if (values.second != nullptr) {
        Num(absl::StrCat(at, "peak_bytes_by_memory_kind.", kind), "peak_bytes_by_memory_kind",
            Unit::kBytes, *values.second);
      } else {
        out_ += "<td></td>";
      }
      out_ += "</tr>\n";
    }
    out_ += "</table>\n<table class=\"cupti-counts\">\n";
    const struct {
      const char* label;
      const char* field;
      std::uint64_t value;
    } counts[] = {
        {"allocation records", "alloc_count", cupti.alloc_count()},
        {"release records", "free_count", cupti.free_count()},
        {"stream-ordered pool operations", "pool_operations", cupti.pool_operations()},
        {"records CUPTI dropped", "dropped_records", cupti.dropped_records()},
    };
    for (const auto& row : counts) {
      absl::StrAppend(&out_, "<tr><th>", row.label, "</th>");
      Num(at + row.field, row.field, Unit::kCount, row.value);
      out_ += "</tr>\n";
    }
    out_ += "<tr><th>latest record</th>";
    Num(at + "last_time_ns", "last_time_ns", Unit::kTime, cupti.last_time_ns());
    out_ += "</tr>\n</table>\n";
  }

  out_ += "<h4>Peak bytes by allocation kind</h4>\n";
  if (device.peak_bytes_by_kind().empty()) {
    out_ += "<p class=\"none\">none</p>\n";
  } else {
    out_ += "<table class=\"bytes-by-kind\">\n<tr><th>kind</th><th>peak</th></tr>\n";
    // Sorted by name: the proto map has no order.
    const std::map<std::string, std::uint64_t> kinds(device.peak_bytes_by_kind().begin(),
                                                     device.peak_bytes_by_kind().end());
    for (const auto& [kind, bytes] : kinds) {
      absl::StrAppend(&out_, "<tr><th>", HtmlEscape(kind), "</th>");
      Num(absl::StrCat(path, ".peak_bytes_by_kind.", kind), "peak_bytes_by_kind", Unit::kBytes,
          bytes);
      out_ += "</tr>\n";
    }
    out_ += "</table>\n";
  }

  // Each library's own peak (not at one instant), from the sites `--stacks` records.
  out_ += "<h4>Peak requested bytes by calling library</h4>\n";
  if (device.peak_requested_bytes_by_library().empty()) {
    out_ += "<p class=\"none\">no allocation sites recorded (vramscope run --stacks)</p>\n";
  }
  out_ += "<table class=\"bytes-by-library\">\n<tr><th>library</th><th>peak</th></tr>\n";
  std::vector<std::pair<std::string, std::uint64_t>> libraries(
      device.peak_requested_bytes_by_library().begin(),
      device.peak_requested_bytes_by_library().end());
  std::sort(libraries.begin(), libraries.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  for (const auto& [library, bytes] : libraries) {
    absl::StrAppend(&out_, "<tr><th>", HtmlEscape(library), "</th>");
    Num(absl::StrCat(path, ".peak_requested_bytes_by_library.", library),
        "peak_requested_bytes_by_library", Unit::kBytes, bytes);
    out_ += "</tr>\n";
  }
  out_ += "<tr><th>without a recorded site</th>";
  Num(path + ".unattributed_peak_requested_bytes", "unattributed_peak_requested_bytes",
      Unit::kBytes, device.unattributed_peak_requested_bytes());
  out_ += "</tr>\n</table>\n";
  out_ += "</section>\n";
}

void Page::Plot(const v1::DeviceReport& device, int r, int d) {
  const std::string id = absl::StrCat("plot-", r, "-", d);
  absl::StrAppend(&out_, "<figure class=\"plot\">\n<svg class=\"plot\" id=\"", id,
                  "\" data-report=\"", r, "\" data-device=\"", d, "\" data-points=\"",
                  device.timeline_size(), "\" data-ranges=\"", device.nvtx_instances_size(),
                  "\" role=\"img\" aria-label=\"requested, allocated and reserved bytes over "
                  "time\" xmlns=\"http://www.w3.org/2000/svg\"></svg>\n<figcaption>");
  for (const char* series : {"requested_bytes", "allocated_bytes", "reserved_bytes"}) {
    const std::string name(series);
    absl::StrAppend(&out_, "<span class=\"swatch ", name, "\"></span>",
                    name.substr(0, name.find('_')));
  }
  absl::StrAppend(&out_, "<span class=\"swatch nvtx\"></span>NVTX ranges (",
                  device.nvtx_instances_size(), " shaded)");
  if (device.timeline().empty()) out_ += "; no timeline points recorded";
  out_ +=
      "<noscript> (the plot needs JavaScript; the tables below do not)</noscript></figcaption>\n"
      "</figure>\n";

  // Times relative to the plot's origin keep the numbers within a double's exact range.
  if (!plots_json_.empty()) plots_json_ += ",";
  absl::StrAppend(&plots_json_, "\n{\"id\":", json::Quote(id, json::QuoteFor::kScriptElement),
                  ",\"points\":[");
  const std::uint64_t origin = has_origin_ ? origin_ns_ : 0;
  for (int i = 0; i < device.timeline_size(); ++i) {
    const v1::TimelinePoint& point = device.timeline(i);
    absl::StrAppend(&plots_json_, i == 0 ? "" : ",", "[", point.time_ns() - origin, ",",
                    point.requested_bytes(), ",", point.allocated_bytes(), ",",
                    point.reserved_bytes(), "]");
  }
  plots_json_ += "],\"ranges\":[";
  for (int i = 0; i < device.nvtx_instances_size(); ++i) {
    const v1::NvtxRangeInstance& range = device.nvtx_instances(i);
    const std::string label =
        range.domain().empty() ? range.name() : absl::StrCat(range.domain(), ":", range.name());
    const std::uint64_t end = std::max(range.end_ns(), range.start_ns());
    absl::StrAppend(&plots_json_, i == 0 ? "" : ",", "{\"s\":", range.start_ns() - origin,
                    ",\"e\":", end - origin, ",\"d\":", range.depth(),
                    ",\"label\":", json::Quote(label, json::QuoteFor::kScriptElement), "}");
  }
  plots_json_ += "]}";
}

}  // namespace

std::string HtmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string FormatReportsHtml(const std::vector<v1::Report>& reports) {
  return Page().Build(reports);
}

}  // namespace vramscope::cli
