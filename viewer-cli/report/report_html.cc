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

#include "common/process_end.h"
#include "common/size.h"
#include "vramscope/json/json_string.h"
#include "vramscope/markup.h"

namespace vramscope::cli {

// d3.js (Debian's libjs-d3), embedded at build time by embed_script.py.
extern const char kD3Script[];

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

// The kind as people say it; the enum name stays in data-value.
std::string KindLabel(v1::AllocationKind kind) {
  switch (kind) {
    case v1::ALLOCATION_KIND_POOLED:
      return "pooled";
    case v1::ALLOCATION_KIND_DRIVER:
      return "driver (passed through)";
    case v1::ALLOCATION_KIND_STREAM_ORDERED:
      return "stream-ordered";
    case v1::ALLOCATION_KIND_PITCHED:
      return "pitched";
    case v1::ALLOCATION_KIND_MANAGED:
      return "managed";
    case v1::ALLOCATION_KIND_VMM:
      return "VMM";
    case v1::ALLOCATION_KIND_HOST:
      return "pinned host";
    case v1::ALLOCATION_KIND_IPC_IMPORT:
      return "IPC import";
    case v1::ALLOCATION_KIND_GRAPH:
      return "graph pool";
    case v1::ALLOCATION_KIND_ARRAY:
      return "array";
    default:
      return "unspecified";
  }
}

// Frames of the CUDA runtime, the driver and the shim say nothing about who allocated.
bool RuntimeFrame(std::string_view frame) {
  for (std::string_view module : {"libcudart", "libcuda.so", "libvramscope"}) {
    if (frame.find(module) != std::string_view::npos) return true;
  }
  return false;
}

// "PATH+0xOFFSET" as "BASENAME+0xOFFSET"; a symbolised "FUNCTION (PATH:LINE)" as "FUNCTION
// (BASENAME:LINE)".
std::string ShortFrame(std::string_view frame) {
  const std::size_t open = frame.rfind(" (");
  if (open != std::string_view::npos && frame.back() == ')') {
    const std::size_t slash = frame.rfind('/');
    if (slash != std::string_view::npos && slash > open) {
      return std::string(frame.substr(0, open + 2)) + std::string(frame.substr(slash + 1));
    }
    return std::string(frame);
  }
  const std::size_t plus = frame.rfind("+0x");
  if (plus == std::string_view::npos || frame.find(' ') != std::string_view::npos) {
    return std::string(frame);
  }
  const std::size_t slash = frame.rfind('/', plus);
  return std::string(slash == std::string_view::npos ? frame : frame.substr(slash + 1));
}

// A site's frames and calling library, from DeviceReport.allocation_sites or top_sites.
struct SiteInfo {
  const google::protobuf::RepeatedPtrField<std::string>* frames = nullptr;
  std::string library;
};

// What a site is called on the page: its innermost frame outside the runtime, driver and shim;
// the id in hex when no frames came with the report.
std::string SiteLabel(std::uint64_t site, const std::map<std::uint64_t, SiteInfo>& sites) {
  if (site == 0) return "(no site recorded)";
  auto it = sites.find(site);
  if (it == sites.end() || it->second.frames == nullptr || it->second.frames->empty()) {
    return absl::StrFormat("site %#x", site);
  }
  for (const std::string& frame : *it->second.frames) {
    if (!RuntimeFrame(frame)) return ShortFrame(frame);
  }
  return ShortFrame(it->second.frames->Get(0));
}

// Builds the page. `origin_ns` is the time the current device's plot starts (event clock), so
// OOM and leak times read as offsets on the plot's axis.
class Page {
 public:
  std::string Build(const std::vector<v1::Report>& reports);

 private:
  void Process(const v1::Report& report, int r);
  // The summary rows from "status, exit code" to "saturated events" (p: the report's path).
  void ProcessStatusRows(const v1::Report& report, const std::string& p);
  // The labels' cell: one <code> per label, sorted by key.
  void LabelsCell(const v1::Report& report, const std::string& p);
  void Device(const v1::DeviceReport& device, const std::string& path, int r, int d, bool finished);
  // Device's parts, in page order. DeviceOriginAndSites sets origin_ns_ and sites_ for the rest.
  void DeviceOriginAndSites(const v1::DeviceReport& device);
  void PeaksAndCounts(const v1::DeviceReport& device, const std::string& path, bool finished);
  void Fragmentation(const v1::DeviceReport& device, const std::string& path);
  void Ooms(const v1::DeviceReport& device, const std::string& path);
  void NvtxRanges(const v1::DeviceReport& device, const std::string& path);
  void TopSites(const v1::DeviceReport& device, const std::string& path);
  void Leaks(const v1::DeviceReport& device, const std::string& path, bool finished);
  void Cupti(const v1::DeviceReport& device, const std::string& path);
  void BytesByKindAndLibrary(const v1::DeviceReport& device, const std::string& path);
  void Plot(const v1::DeviceReport& device, int r, int d);
  // The plot's data for the script: one object appended to plots_json_.
  void PlotData(const v1::DeviceReport& device, const std::string& id, int r, int d);
  // memory_viz's two views: active allocations over time (bands drawn by the script) and the
  // memory state at the peak (tables, largest first; by site and by library).
  void Allocations(const v1::DeviceReport& device, int r, int d);
  void PeakState(const v1::DeviceReport& device, const std::string& path);
  // PeakState's tables by site and by library of the allocations `live` (indices) at the peak.
  void PeakGroups(const v1::DeviceReport& device, const std::vector<int>& live);
  // A site cell: exact id in data-value, its name shown, its frames in the title.
  void SiteCell(const std::string& path, std::uint64_t site);

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
  std::map<std::uint64_t, SiteInfo> sites_;  // the current device's sites
};

void Page::Cell(const std::string& path, std::string_view field, Unit unit,
                const std::string& value, const std::string& shown, const std::string& title) {
  absl::StrAppend(&out_, "<td class=\"", unit == Unit::kText ? "text" : "num", "\" data-path=\"",
                  MarkupEscape(path), "\" data-field=\"", MarkupEscape(field), "\" data-unit=\"",
                  UnitName(unit), "\"");
  if (unit != Unit::kText) absl::StrAppend(&out_, " data-value=\"", MarkupEscape(value), "\"");
  if (!title.empty()) absl::StrAppend(&out_, " title=\"", MarkupEscape(title), "\"");
  absl::StrAppend(&out_, ">", MarkupEscape(shown), "</td>");
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
p.none, p.note { color: #777; margin: .2em 0 1em; }
figure { margin: .5em 0 1em; }
svg.plot, svg.alloc-plot { width: 100%; height: auto; border: 1px solid #ddd; background: #fff;
                           cursor: crosshair; user-select: none; }
svg .axis path, svg .axis line { fill: none; stroke: #ccc; shape-rendering: crispEdges; }
svg .axis .tick line { stroke: #eee; }
svg text { font-size: 11px; fill: #555; }
svg rect.background { fill: none; pointer-events: all; }
svg line.cursor { stroke: #444; stroke-dasharray: 3 3; pointer-events: none; }
svg path.series { fill: none; stroke-width: 1.5; pointer-events: none; }
svg path.area { stroke: none; pointer-events: none; }
svg path.area.allocated_bytes { fill: var(--alloc); fill-opacity: .15; }
svg path.requested_bytes, .swatch.requested_bytes { stroke: var(--req); background: var(--req); }
svg path.series.requested_bytes { stroke-width: 2; stroke-dasharray: 6 3; }
svg path.allocated_bytes, .swatch.allocated_bytes { stroke: var(--alloc); background: var(--alloc); }
svg path.reserved_bytes, .swatch.reserved_bytes { stroke: var(--res); background: var(--res); }
svg rect.nvtx-range { fill: var(--nvtx); fill-opacity: .10; stroke: var(--nvtx);
                      stroke-opacity: .35; stroke-width: .5; }
svg text.nvtx-label { fill: #6a3d9a; font-size: 10px; pointer-events: none; }
svg path.alloc-band { stroke: #fff; stroke-width: .3; fill-opacity: .85;
                      vector-effect: non-scaling-stroke; }
svg path.alloc-band.hover { fill-opacity: 1; stroke: #000; stroke-width: 1; }
svg path.timeline-requested { fill: none; stroke: #000; stroke-width: 1; stroke-dasharray: 4 2;
                              pointer-events: none; }
svg line.peak-marker { stroke: #d62728; stroke-width: 1; pointer-events: none; }
figcaption { font-size: 12px; color: #555; }
.readout { font: 12px ui-monospace, monospace; color: #333; min-height: 1.4em; }
.swatch { display: inline-block; width: 14px; height: 3px; vertical-align: middle; margin: 0 4px 0 10px; }
.swatch.area { height: 10px; opacity: .3; }
.swatch.nvtx { height: 10px; background: var(--nvtx); opacity: .25; }
.tooltip { position: fixed; z-index: 10; background: #fffff4; border: 1px solid #999;
           padding: 4px 8px; font-size: 12px; max-width: 60em; pointer-events: none;
           box-shadow: 1px 1px 4px rgba(0,0,0,.2); }
.stack { font: 12px ui-monospace, monospace; }
.stack-title { font-weight: 600; }
.stack ol { margin: .2em 0 1em; padding-left: 2.5em; }
pre.script-error { color: #b00; }
)css";

// Draws the plots from the JSON block with d3 (inlined: kD3Script): per device the totals (one
// step path per series, one M or V command per timeline point; one rect per NVTX range instance)
// and the allocations over time (one band per listed allocation). Every plot zooms and pans on x
// (wheel, drag) and shows a cursor readout. Names go in through textContent only.
constexpr char kScript[] = R"js(
(function () {
  'use strict';
  var W = 960, L = 84, R = 16, T = 12, B = 34;
  var charts = [];  // every chart(), for the fragment's #window=
  var BYTE_UNITS = [[1, 'B'], [1024, 'KiB'], [1048576, 'MiB'], [1073741824, 'GiB'],
                    [1099511627776, 'TiB'], [1125899906842624, 'PiB']];
  var TIME_UNITS = [[1, 'ns'], [1e3, 'us'], [1e6, 'ms'], [1e9, 's']];
  function pick(units, v) {
    var u = units[0];
    units.forEach(function (c) { if (v >= c[0]) u = c; });
    return u;
  }
  function bytes(v) {
    var u = pick(BYTE_UNITS, v);
    return u[0] === 1 ? Math.round(v) + ' B' : (v / u[0]).toFixed(2) + ' ' + u[1];
  }
  function seconds(ns) {
    var u = pick(TIME_UNITS, Math.abs(ns));
    return u[0] === 1 ? Math.round(ns) + ' ns' : (ns / u[0]).toFixed(3) + ' ' + u[1];
  }
  // Ticks at round values of the unit that suits the span: multiples of 1, 2 or 5 x 10^k
  // (d3's linear ticks over the scaled domain), labelled with as many decimals as the step needs.
  function roundTicks(lo, hi, unit, count) {
    var values = d3.scale.linear().domain([lo / unit[0], hi / unit[0]]).ticks(count);
    var step = values.length > 1 ? values[1] - values[0] : 1;
    var dec = Math.max(0, -Math.floor(Math.log(step) / Math.LN10 + 1e-9));
    return values.map(function (v) {
      return {value: v * unit[0], label: v.toFixed(dec) + ' ' + unit[1]};
    });
  }
  function setAxis(g, scale, ticks, orient, size, prefix) {
    var labels = {};
    ticks.forEach(function (t) { labels[t.value] = (prefix || '') + t.label; });
    g.call(d3.svg.axis().scale(scale).orient(orient)
               .tickValues(ticks.map(function (t) { return t.value; }))
               .tickFormat(function (v) { return labels[v]; })
               .innerTickSize(-size).outerTickSize(0).tickPadding(6));
    g.selectAll('.tick').attr('data-value', function (v) { return v; });
  }
  // A chart: fixed y, x zoomed and panned by d3's zoom behaviour within [0, tmax], a cursor
  // line with a readout. draw() redraws what depends on x; readout(t) says what is at time t.
  function chart(svgId, height, tmax, ymax, readoutId) {
    var svg = d3.select(document.getElementById(svgId));
    var H = height;
    svg.attr('viewBox', '0 0 ' + W + ' ' + H);
    var x = d3.scale.linear().domain([0, tmax]).range([L, W - R]);
    var y = d3.scale.linear().domain([0, ymax]).range([H - B, T]);
    var clipId = 'clip-' + svgId;
    svg.append('clipPath').attr('id', clipId).append('rect')
        .attr({x: L, y: 0, width: W - L - R, height: H - B});
    var yAxis = svg.append('g').attr('class', 'axis y-axis').attr('transform', 'translate(' + L + ',0)');
    var xAxis = svg.append('g').attr('class', 'axis x-axis')
        .attr('transform', 'translate(0,' + (H - B) + ')');
    setAxis(yAxis, y, roundTicks(0, ymax, pick(BYTE_UNITS, ymax), 6), 'left', W - L - R);
    var body = svg.append('g').attr('class', 'body').attr('clip-path', 'url(#' + clipId + ')');
    body.append('rect').attr('class', 'background')
        .attr({x: L, y: T, width: W - L - R, height: H - B - T});
    var cursor = svg.append('line').attr('class', 'cursor')
        .attr({y1: T, y2: H - B}).style('display', 'none');
    var c = {svg: svg, body: body, x: x, x0: x.copy(), y: y, H: H, draws: [], readout: null,
             view: {s: 1, tx: 0}};
    function drawAll() {
      var d = x.domain();
      setAxis(xAxis, x, roundTicks(d[0], d[1], pick(TIME_UNITS, d[1] - d[0]), 8), 'bottom',
              H - B - T, '+');
      c.draws.forEach(function (f) { f(); });
    }
    c.redraw = drawAll;
    var zoom = d3.behavior.zoom().duration(0).x(x).scaleExtent([1, Math.max(1, tmax)]).on('zoom', function () {
      var s = zoom.scale(), tx = zoom.translate()[0];
      tx = Math.min(L * (1 - s), Math.max((W - R) * (1 - s), tx));  // stay within the run
      zoom.translate([tx, 0]);
      c.view = {s: s, tx: tx};
      drawAll();
      svg.attr('data-zoom', s.toFixed(3));
    });
    svg.call(zoom);
    c.zoom = zoom;
    c.tmax = tmax;
    charts.push(c);
    svg.on('mousemove.readout', function () {
      var m = d3.mouse(svg.node());
      if (m[0] < L || m[0] > W - R) return;
      cursor.attr({x1: m[0], x2: m[0]}).style('display', null);
      var t = x.invert(m[0]);
      var out = document.getElementById(readoutId);
      if (out && c.readout) out.textContent = '+' + seconds(t) + ': ' + c.readout(t);
    });
    return c;
  }
  // The index of the last point at or before t (points sorted by time), -1 before the first.
  function at(points, t) { return d3.bisector(function (p) { return p[0]; }).right(points, t) - 1; }
  function stepPath(points, col, x, y) {
    var d = '';
    points.forEach(function (p, i) {
      d += i === 0 ? 'M' + x(p[0]).toFixed(1) + ',' + y(p[col]).toFixed(1)
                   : 'H' + x(p[0]).toFixed(1) + 'V' + y(p[col]).toFixed(1);
    });
    return d;
  }
  var SERIES = [['reserved_bytes', 3, 'reserved'], ['allocated_bytes', 2, 'allocated'],
                ['requested_bytes', 1, 'requested']];

  function totalsPlot(plot) {
    var points = plot.points, ranges = plot.ranges;
    var ymax = 1;
    points.forEach(function (p) { ymax = Math.max(ymax, p[1], p[2], p[3]); });
    var c = chart(plot.id, 300, plot.tmax, ymax, 'readout-' + plot.id);
    var x = c.x, y = c.y;
    var rects = c.body.selectAll('rect.nvtx-range').data(ranges).enter().append('rect')
        .attr('class', 'nvtx-range');
    rects.append('title').text(function (r) { return r.label; });
    var labels = c.body.selectAll('text.nvtx-label').data(ranges.filter(function (r) {
      return r.d === 0;
    })).enter().append('text').attr('class', 'nvtx-label').text(function (r) { return r.label; });
    // Allocated as a shaded area, requested as a line on top: the gap is the rounding.
    var area = c.body.append('path').attr('class', 'area allocated_bytes');
    var paths = SERIES.map(function (s) {
      var p = c.body.append('path').attr('class', 'series ' + s[0]).attr('data-series', s[0]);
      p.append('title').text(s[2]);
      return p;
    });
    c.draws.push(function () {
      rects.attr('x', function (r) { return x(r.s); })
          .attr('width', function (r) { return Math.max(1, x(r.e) - x(r.s)); })
          .attr('y', function (r) { return c.y.range()[1] + 12 * r.d; })
          .attr('height', function (r) { return c.y.range()[0] - c.y.range()[1] - 12 * r.d; });
      labels.attr('x', function (r) { return x(r.s) + 2; }).attr('y', c.y.range()[1] + 10);
      paths.forEach(function (p, i) { p.attr('d', stepPath(points, SERIES[i][1], x, y)); });
      var a = stepPath(points, 2, x, y);
      if (points.length) {
        a += 'V' + y(0) + 'H' + x(points[0][0]).toFixed(1) + 'Z';
      }
      area.attr('d', a);
    });
    c.readout = function (t) {
      var i = at(points, t);
      if (i < 0) return 'before the first event';
      var p = points[i];
      return 'requested ' + bytes(p[1]) + ', allocated ' + bytes(p[2]) + ' (rounding ' +
             bytes(p[2] - p[1]) + '), reserved ' + bytes(p[3]);
    };
    c.redraw();
    c.svg.attr('data-rendered', 'true');
  }

  // memory_viz's active allocations: one band per listed allocation, stacked in the order the
  // live ones were made; a free moves the ones above it down.
  // At most MAX_BANDS bands are drawn (the largest; the others are in the gap under the dashed
  // total), and a band's offset changes at most once per 1/BUCKETS of the run: a free low in a
  // big stack moves every band above it, which would otherwise make O(bands x frees) points.
  var MAX_BANDS = 2000, BUCKETS = 1000;
  function allocationPlot(plot) {
    var A = plot.allocs, n = A.length, tmax = plot.tmax;
    var drawn = A.map(function (a, i) { return i; });
    if (n > MAX_BANDS) {
      drawn.sort(function (p, q) { return A[q][2] - A[p][2] || p - q; });
      drawn = drawn.slice(0, MAX_BANDS).sort(function (p, q) { return p - q; });
    }
    var events = [];
    drawn.forEach(function (i) {
      var a = A[i];
      events.push([a[0], 1, i]);
      if (a[1] >= 0) events.push([a[1], 0, i]);
    });
    events.sort(function (p, q) { return p[0] - q[0] || p[1] - q[1] || p[2] - q[2]; });
    var bucket = tmax / BUCKETS;
    var stack = [], offset = {}, pts = {}, gone = {}, total = 0, totals = [[0, 0]], ymax = 1;
    events.forEach(function (e) {
      var t = e[0], k = e[2], size = A[k][2];
      if (e[1] === 1) {
        offset[k] = total;
        pts[k] = [[t, total]];
        if (gone[k]) return;  // freed at (or, in a bad report, before) its allocation's time
        stack.push(k);
        total += size;
      } else {
        var p = stack.indexOf(k);
        if (p < 0) {
          gone[k] = true;
          return;
        }
        stack.splice(p, 1);
        for (var j = p; j < stack.length; j++) {
          var q = stack[j], list = pts[q], last = list[list.length - 1];
          offset[q] -= size;
          if (list.length > 1 && Math.floor(last[0] / bucket) === Math.floor(t / bucket)) {
            last[1] = offset[q];
          } else {
            list.push([t, offset[q]]);
          }
        }
        total -= size;
      }
      ymax = Math.max(ymax, total);
      totals.push([t, total]);
    });
    plot.points.forEach(function (p) { ymax = Math.max(ymax, p[1]); });
    var c = chart(plot.alloc, 360, tmax, ymax, 'readout-' + plot.alloc);
    var x = c.x0, y = c.y;
    c.svg.attr('data-drawn', drawn.length);
    var color = d3.scale.category20();
    // Drawn once at the unzoomed scale; zooming transforms the group.
    var group = c.body.append('g').attr('class', 'bands');
    var bands = group.selectAll('path.alloc-band').data(drawn).enter().append('path')
        .attr('class', 'alloc-band')
        .attr('data-index', function (i) { return i; })
        .style('fill', function (i) { return A[i][5] < 0 ? '#9a9a9a' : color(A[i][5]); })
        .attr('d', function (k) {
          var a = A[k], p = pts[k], size = gone[k] ? 0 : a[2], d = '', j;
          var end = a[1] >= 0 ? Math.max(a[0], a[1]) : tmax;
          for (j = 0; j < p.length; j++) {
            d += (j === 0 ? 'M' + x(p[j][0]).toFixed(1) + ',' : 'H' + x(p[j][0]).toFixed(1) + 'V') +
                 y(p[j][1] + size).toFixed(1);
          }
          d += 'H' + x(end).toFixed(1) + 'V' + y(p[p.length - 1][1]).toFixed(1);
          for (j = p.length - 1; j > 0; j--) {
            d += 'H' + x(p[j][0]).toFixed(1) + 'V' + y(p[j - 1][1]).toFixed(1);
          }
          return d + 'H' + x(p[0][0]).toFixed(1) + 'Z';
        });
    var requested = c.body.append('path').attr('class', 'timeline-requested');
    var peak = c.body.append('line').attr('class', 'peak-marker')
        .style('display', plot.peak >= 0 ? null : 'none');
    c.draws.push(function () {
      group.attr('transform', 'translate(' + c.view.tx + ',0) scale(' + c.view.s + ',1)');
      requested.attr('d', stepPath(plot.points, 1, c.x, y));
      peak.attr({x1: c.x(plot.peak), x2: c.x(plot.peak), y1: y.range()[1], y2: y.range()[0]});
    });
    c.readout = function (t) {
      var i = at(totals, t), j = at(plot.points, t);
      return 'listed allocations ' + bytes(i < 0 ? 0 : totals[i][1]) + ' of requested ' +
             bytes(j < 0 ? 0 : plot.points[j][1]);
    };
    c.redraw();

    var tip = document.getElementById('vramscope-tooltip');
    function site(a) { return a[5] < 0 ? null : plot.sites[a[5]]; }
    function describe(a) {
      var s = site(a), end = a[1] >= 0 ? a[1] : tmax;
      return [
        a[7] + ': ' + bytes(a[2]) + ' requested, ' + bytes(a[3]) + ' allocated, ' + a[4],
        'site: ' + (s ? s.n + ' (' + s.l + ')' : 'not recorded (vramscope run --stacks)'),
        'NVTX range: ' + (a[6] === '' ? 'none' : a[6]),
        'allocated at +' + seconds(a[0]) +
            (a[1] >= 0 ? ', freed at +' + seconds(a[1]) + ', age ' + seconds(end - a[0])
                       : ', not freed, age ' + seconds(end - a[0]) + ' at the end'),
        a[9] ? 'live at the peak' : 'not live at the peak'
      ];
    }
    bands.on('mousemove', function (k) {
      var lines = describe(A[k]);
      tip.textContent = '';
      lines.forEach(function (line) {
        var div = document.createElement('div');
        div.textContent = line;
        tip.appendChild(div);
      });
      tip.setAttribute('data-band', plot.alloc + ':' + k);
      tip.hidden = false;
      var ev = d3.event;
      // Beside the cursor, kept inside the window.
      tip.style.left = Math.max(0, Math.min(ev.clientX + 14,
                                            window.innerWidth - tip.offsetWidth - 8)) + 'px';
      tip.style.top = Math.max(0, Math.min(ev.clientY + 14,
                                           window.innerHeight - tip.offsetHeight - 8)) + 'px';
      d3.select(this).classed('hover', true);
    }).on('mouseout', function () {
      tip.hidden = true;
      d3.select(this).classed('hover', false);
    }).on('click', function (k) {
      var a = A[k];
      var panel = document.getElementById('stack-' + plot.alloc);
      var s = site(a);
      panel.textContent = '';
      var h = document.createElement('div');
      h.className = 'stack-title';
      h.textContent = 'Stack of ' + a[7] + ' (' + bytes(a[2]) + ', ' +
                      (s ? 'site ' + s.h + ', ' + s.l : 'no site recorded') + ')';
      panel.appendChild(h);
      var list = document.createElement('ol');
      (s ? s.f : []).forEach(function (f) {
        var li = document.createElement('li');
        li.textContent = f;
        list.appendChild(li);
      });
      if (!s || !s.f.length) {
        var none = document.createElement('p');
        none.textContent = 'no frames recorded (vramscope run --stacks)';
        panel.appendChild(none);
      }
      panel.appendChild(list);
      panel.setAttribute('data-band', plot.alloc + ':' + k);
    });
    c.svg.attr('data-rendered', 'true');
  }

  var data = JSON.parse(document.getElementById('vramscope-plot-data').textContent);
  data.forEach(function (plot) {
    if (document.getElementById(plot.id)) totalsPlot(plot);
    if (plot.alloc && document.getElementById(plot.alloc)) allocationPlot(plot);
  });
  // The fragment, directives joined by '&' (for links to a moment or to one allocation, and for
  // checking the page in a headless browser): #window=T0:T1 shows seconds T0 to T1 of the run on
  // every plot, as zooming there would; #zoom=SVG_ID double-clicks the middle of a plot;
  // #hover=SVG_ID:INDEX or #click=SVG_ID:INDEX points at a band as a mouse would.
  function showWindow(t0, t1) {
    charts.forEach(function (c) {
      var a = Math.max(0, Math.min(t0, c.tmax)), b = Math.min(c.tmax, t1);
      if (!(b > a)) return;
      var s = Math.min(c.zoom.scaleExtent()[1], c.tmax / (b - a));
      c.zoom.scale(s).translate([L - c.x0(a) * s, 0]);  // a at the left edge
      c.zoom.event(c.svg);
    });
  }
  function pointAt(kind, svgId, index) {
    var band = document.querySelector('#' + svgId + ' path.alloc-band[data-index="' + index + '"]');
    if (!band) return;
    var box = band.getBoundingClientRect();
    var opts = {bubbles: true, clientX: box.left + box.width / 2,
                clientY: box.top + box.height / 2, view: window};
    band.dispatchEvent(new MouseEvent('mousemove', opts));
    if (kind === 'click') band.dispatchEvent(new MouseEvent('click', opts));
  }
  location.hash.replace(/^#/, '').split('&').forEach(function (part) {
    var w = /^window=([\d.]+):([\d.]+)$/.exec(part);
    if (w) showWindow(+w[1] * 1e9, +w[2] * 1e9);  // the plots count nanoseconds
    var z = /^zoom=([\w-]+)$/.exec(part), svgZoom = z && document.getElementById(z[1]);
    if (svgZoom) {
      var r = svgZoom.getBoundingClientRect();
      svgZoom.dispatchEvent(new MouseEvent('dblclick', {bubbles: true, view: window,
          clientX: r.left + r.width / 2, clientY: r.top + r.height / 2}));
    }
    var m = /^(hover|click)=([\w-]+):(\d+)$/.exec(part);
    if (m) pointAt(m[1], m[2], m[3]);
  });
  document.body.setAttribute('data-rendered', 'true');
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
      MarkupEscape(title), "</title>\n<style>", kStyle, "</style>\n</head>\n<body>\n",
      "<h1>vramscope report</h1>\n");
  if (reports.empty()) out_ += "<p class=\"none\">no processes</p>\n";
  for (std::size_t r = 0; r < reports.size(); ++r) Process(reports[r], static_cast<int>(r));
  // A script error shows on the page (and in a headless browser's DOM), not only in a console.
  absl::StrAppend(&out_,
                  "<div id=\"vramscope-tooltip\" class=\"tooltip\" hidden></div>\n"
                  "<script>window.addEventListener('error', function (e) {"
                  " var p = document.createElement('pre'); p.className = 'script-error';"
                  " p.textContent = 'script error: ' + e.message; document.body.appendChild(p);"
                  " });</script>\n<script>",
                  kD3Script,
                  "</script>\n<script type=\"application/json\" id=\"vramscope-plot-data\">[",
                  plots_json_, "]</script>\n<script>", kScript, "</script>\n</body>\n</html>\n");
  return std::move(out_);
}

void Page::LabelsCell(const v1::Report& report, const std::string& p) {
  out_ += "<td class=\"text\">";
  // Sorted by key (the map's order is not defined), one element per label.
  const std::map<std::string, std::string> labels(report.labels().begin(), report.labels().end());
  bool first = true;
  for (const auto& [key, value] : labels) {
    absl::StrAppend(&out_, first ? "" : " ", "<code data-path=\"", p, ".labels.", MarkupEscape(key),
                    "\" data-field=\"labels\" data-unit=\"text\">", MarkupEscape(key), "=",
                    MarkupEscape(value), "</code>");
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
                      : absl::StrCat(" on ", MarkupEscape(report.process().host())),
                  report.command_line().empty()
                      ? ""
                      : absl::StrCat(": ", MarkupEscape(absl::StrJoin(report.command_line(), " "))),
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
                    MarkupEscape(report.command_line(i)), "</code>");
  }
  out_ += "</td></tr>\n";
  if (!report.labels().empty()) {
    row("labels");
    LabelsCell(report, p);
  }
  row("mode");
  Text(p + ".mode", "mode", report.mode());
  out_ += "</tr>\n";
  ProcessStatusRows(report, p);
  if (report.devices().empty()) out_ += "<p class=\"none\">no device memory was allocated</p>\n";
  for (int d = 0; d < report.devices_size(); ++d) {
    Device(report.devices(d), absl::StrCat(p, ".devices.", d), r, d, report.finished());
  }
  out_ += "</section>\n";
}

void Page::ProcessStatusRows(const v1::Report& report, const std::string& p) {
  auto row = [&](const char* label) { absl::StrAppend(&out_, "<tr><th>", label, "</th>"); };
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
}

void Page::Device(const v1::DeviceReport& device, const std::string& path, int r, int d,
                  bool finished) {
  const v1::DeviceInfo& info = device.device();
  absl::StrAppend(&out_, "<section class=\"device\" data-report=\"", r, "\" data-device=\"", d,
                  "\" data-ordinal=\"", info.ordinal(), "\">\n<h3>cuda:", info.ordinal(),
                  info.name().empty() ? "" : absl::StrCat(" ", MarkupEscape(info.name())),
                  "</h3>\n");
  DeviceOriginAndSites(device);

  out_ += "<table class=\"device-info\">\n<tr><th>name</th>";
  Text(path + ".device.name", "name", info.name());
  out_ += "<th>uuid</th>";
  Text(path + ".device.uuid", "uuid", info.uuid());
  out_ += "<th>memory</th>";
  Num(path + ".device.total_memory_bytes", "total_memory_bytes", Unit::kBytes,
      info.total_memory_bytes());
  out_ += "</tr>\n</table>\n";

  Plot(device, r, d);
  Allocations(device, r, d);
  PeakState(device, path);

  PeaksAndCounts(device, path, finished);

  Fragmentation(device, path);

  Ooms(device, path);

  NvtxRanges(device, path);

  TopSites(device, path);

  Leaks(device, path, finished);

  Cupti(device, path);

  BytesByKindAndLibrary(device, path);
  out_ += "</section>\n";
}

void Page::DeviceOriginAndSites(const v1::DeviceReport& device) {
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
  for (const v1::AllocationRecord& allocation : device.allocations()) {
    if (!has_origin_ || allocation.alloc_time_ns() < origin_ns_) {
      origin_ns_ = allocation.alloc_time_ns();
    }
    has_origin_ = true;
  }
  sites_.clear();
  for (const v1::SiteStats& site : device.top_sites()) sites_[site.site()].frames = &site.frames();
  for (const v1::AllocationSite& site : device.allocation_sites()) {
    SiteInfo& info = sites_[site.site()];
    info.frames = &site.frames();
    info.library = site.library();
  }
}

void Page::PeaksAndCounts(const v1::DeviceReport& device, const std::string& path, bool finished) {
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
}

void Page::Fragmentation(const v1::DeviceReport& device, const std::string& path) {
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
}

void Page::Ooms(const v1::DeviceReport& device, const std::string& path) {
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
}

void Page::NvtxRanges(const v1::DeviceReport& device, const std::string& path) {
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
}

void Page::TopSites(const v1::DeviceReport& device, const std::string& path) {
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
}

void Page::Leaks(const v1::DeviceReport& device, const std::string& path, bool finished) {
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
      Cell(at + "kind", "kind", Unit::kEnum, v1::AllocationKind_Name(leak.kind()),
           KindLabel(leak.kind()));
      SiteCell(at + "site", leak.site());
      Num(at + "time_ns", "time_ns", Unit::kTime, leak.time_ns());
      out_ += "</tr>\n";
    }
    out_ += "</table>\n";
  }
}

void Page::Cupti(const v1::DeviceReport& device, const std::string& path) {
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
      absl::StrAppend(&out_, "<tr><th>", MarkupEscape(kind), "</th>");
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
}

void Page::BytesByKindAndLibrary(const v1::DeviceReport& device, const std::string& path) {
  out_ += "<h4>Peak bytes by allocation kind</h4>\n";
  if (device.peak_bytes_by_kind().empty()) {
    out_ += "<p class=\"none\">none</p>\n";
  } else {
    out_ += "<table class=\"bytes-by-kind\">\n<tr><th>kind</th><th>peak</th></tr>\n";
    // Sorted by name: the proto map has no order.
    const std::map<std::string, std::uint64_t> kinds(device.peak_bytes_by_kind().begin(),
                                                     device.peak_bytes_by_kind().end());
    for (const auto& [kind, bytes] : kinds) {
      absl::StrAppend(&out_, "<tr><th>", MarkupEscape(kind), "</th>");
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
    absl::StrAppend(&out_, "<tr><th>", MarkupEscape(library), "</th>");
    Num(absl::StrCat(path, ".peak_requested_bytes_by_library.", library),
        "peak_requested_bytes_by_library", Unit::kBytes, bytes);
    out_ += "</tr>\n";
  }
  out_ += "<tr><th>without a recorded site</th>";
  Num(path + ".unattributed_peak_requested_bytes", "unattributed_peak_requested_bytes",
      Unit::kBytes, device.unattributed_peak_requested_bytes());
  out_ += "</tr>\n</table>\n";
}

void Page::SiteCell(const std::string& path, std::uint64_t site) {
  std::string title = absl::StrFormat("site %#x", site);
  auto it = sites_.find(site);
  if (it != sites_.end()) {
    if (!it->second.library.empty()) absl::StrAppend(&title, " in ", it->second.library);
    if (it->second.frames != nullptr) {
      for (const std::string& frame : *it->second.frames) absl::StrAppend(&title, "\n", frame);
    }
  }
  Cell(path, "site", Unit::kHex, absl::StrCat(site), SiteLabel(site, sites_), title);
}

void Page::Plot(const v1::DeviceReport& device, int r, int d) {
  const std::string id = absl::StrCat("plot-", r, "-", d);
  absl::StrAppend(&out_, "<figure class=\"plot\">\n<svg class=\"plot\" id=\"", id,
                  "\" data-report=\"", r, "\" data-device=\"", d, "\" data-points=\"",
                  device.timeline_size(), "\" data-ranges=\"", device.nvtx_instances_size(),
                  "\" role=\"img\" aria-label=\"requested, allocated and reserved bytes over "
                  "time\" xmlns=\"http://www.w3.org/2000/svg\"></svg>\n<div class=\"readout\" "
                  "id=\"readout-",
                  id, "\"></div>\n<figcaption>");
  for (const char* series : {"requested_bytes", "allocated_bytes", "reserved_bytes"}) {
    const std::string name(series);
    absl::StrAppend(&out_, "<span class=\"swatch ", name, "\"></span>",
                    name.substr(0, name.find('_')));
  }
  absl::StrAppend(&out_, " (shaded: allocated; dashed: requested; the gap is rounding)",
                  "<span class=\"swatch nvtx\"></span>NVTX ranges (", device.nvtx_instances_size(),
                  " shaded)");
  if (device.timeline().empty()) out_ += "; no timeline points recorded";
  out_ +=
      ". Wheel or double-click to zoom, drag to pan; the line under the plot reads the cursor."
      "<noscript> (the plot needs JavaScript; the tables below do not)</noscript></figcaption>\n"
      "</figure>\n";

  PlotData(device, id, r, d);
}

void Page::PlotData(const v1::DeviceReport& device, const std::string& id, int r, int d) {
  // Times relative to the plot's origin keep the numbers within a double's exact range.
  const std::uint64_t origin = has_origin_ ? origin_ns_ : 0;
  std::uint64_t end = origin;
  auto rel = [&](std::uint64_t t) {
    end = std::max(end, t);
    return t >= origin ? t - origin : 0;
  };
  if (!plots_json_.empty()) plots_json_ += ",";
  absl::StrAppend(&plots_json_, "\n{\"id\":", json::Quote(id, json::QuoteFor::kScriptElement),
                  ",\"points\":[");
  for (int i = 0; i < device.timeline_size(); ++i) {
    const v1::TimelinePoint& point = device.timeline(i);
    absl::StrAppend(&plots_json_, i == 0 ? "" : ",", "[", rel(point.time_ns()), ",",
                    point.requested_bytes(), ",", point.allocated_bytes(), ",",
                    point.reserved_bytes(), "]");
  }
  plots_json_ += "],\"ranges\":[";
  for (int i = 0; i < device.nvtx_instances_size(); ++i) {
    const v1::NvtxRangeInstance& range = device.nvtx_instances(i);
    const std::string label =
        range.domain().empty() ? range.name() : absl::StrCat(range.domain(), ":", range.name());
    const std::uint64_t range_end = std::max(range.end_ns(), range.start_ns());
    absl::StrAppend(&plots_json_, i == 0 ? "" : ",", "{\"s\":", rel(range.start_ns()),
                    ",\"e\":", rel(range_end), ",\"d\":", range.depth(),
                    ",\"label\":", json::Quote(label, json::QuoteFor::kScriptElement), "}");
  }
  // Allocations: [alloc, free (-1: not freed), requested, allocated, kind, site index (-1:
  // none), NVTX range, address, thread, live at the peak]; sites by index.
  plots_json_ += "],\"allocs\":[";
  std::vector<std::uint64_t> site_order;
  std::map<std::uint64_t, std::size_t> site_index;
  for (int i = 0; i < device.allocations_size(); ++i) {
    const v1::AllocationRecord& a = device.allocations(i);
    long long site = -1;
    if (a.site() != 0) {
      auto [it, added] = site_index.try_emplace(a.site(), site_order.size());
      if (added) site_order.push_back(a.site());
      site = static_cast<long long>(it->second);
    }
    const std::string range =
        a.nvtx_domain().empty() ? a.nvtx_name() : absl::StrCat(a.nvtx_domain(), ":", a.nvtx_name());
    absl::StrAppend(&plots_json_, i == 0 ? "" : ",", "[", rel(a.alloc_time_ns()), ",",
                    a.free_time_ns() != 0 ? absl::StrCat(rel(a.free_time_ns())) : std::string("-1"),
                    ",", a.requested_bytes(), ",", a.allocated_bytes(), ",",
                    json::Quote(KindLabel(a.kind()), json::QuoteFor::kScriptElement), ",", site,
                    ",", json::Quote(range, json::QuoteFor::kScriptElement), ",\"",
                    absl::StrFormat("%#x", a.address()), "\",", a.thread_id(), ",",
                    a.live_at_peak() ? 1 : 0, "]");
  }
  plots_json_ += "],\"sites\":[";
  for (std::size_t i = 0; i < site_order.size(); ++i) {
    const std::uint64_t site = site_order[i];
    auto it = sites_.find(site);
    absl::StrAppend(&plots_json_, i == 0 ? "" : ",", "{\"h\":\"", absl::StrFormat("%#x", site),
                    "\",\"n\":",
                    json::Quote(SiteLabel(site, sites_), json::QuoteFor::kScriptElement), ",\"l\":",
                    json::Quote(it != sites_.end() && !it->second.library.empty()
                                    ? it->second.library
                                    : std::string("library unknown"),
                                json::QuoteFor::kScriptElement),
                    ",\"f\":[");
    if (it != sites_.end() && it->second.frames != nullptr) {
      for (int f = 0; f < it->second.frames->size(); ++f) {
        absl::StrAppend(&plots_json_, f == 0 ? "" : ",",
                        json::Quote(it->second.frames->Get(f), json::QuoteFor::kScriptElement));
      }
    }
    plots_json_ += "]}";
  }
  const bool has_peak = device.peak_live_count() > 0;
  const long long peak = has_peak ? static_cast<long long>(rel(device.peak_time_ns())) : -1;
  std::uint64_t tmax = end > origin ? end - origin : 1;
  absl::StrAppend(&plots_json_, "],\"peak\":", peak, ",\"tmax\":", tmax, ",\"alloc\":",
                  device.allocations().empty() ? std::string("null")
                                               : json::Quote(absl::StrCat("alloc-", r, "-", d),
                                                             json::QuoteFor::kScriptElement),
                  "}");
}

void Page::Allocations(const v1::DeviceReport& device, int r, int d) {
  out_ += "<h4>Active allocations over time</h4>\n";
  if (device.allocations().empty()) {
    out_ += "<p class=\"none\">no allocations listed</p>\n";
    return;
  }
  const std::string id = absl::StrCat("alloc-", r, "-", d);
  absl::StrAppend(
      &out_,
      "<p class=\"note\">One band per allocation, stacked in the order the live ones were "
      "made (",
      device.allocations_size(),
      " listed: every allocation live at the peak, up to a "
      "limit, and the largest others; ",
      device.allocations_omitted(),
      " not listed, which only "
      "the dashed total of requested bytes includes; at most 2000 bands are drawn, the largest, "
      "and a band moves at most once per 1/1000 of the run). Hover a band for its size, site, NVTX "
      "range "
      "and age; click it for its stack.</p>\n<figure class=\"alloc-plot\">\n<svg "
      "class=\"alloc-plot\" "
      "id=\"",
      id, "\" data-report=\"", r, "\" data-device=\"", d, "\" data-allocations=\"",
      device.allocations_size(),
      "\" role=\"img\" aria-label=\"active allocations over time\" "
      "xmlns=\"http://www.w3.org/2000/svg\"></svg>\n<div class=\"readout\" id=\"readout-",
      id,
      "\"></div>\n<figcaption>Bands coloured by site (grey: no site recorded); dashed: requested "
      "bytes of every allocation (the timeline); red line: the peak of allocated "
      "bytes.</figcaption>\n"
      "</figure>\n<div class=\"stack\" id=\"stack-",
      id, "\"></div>\n");
}

void Page::PeakState(const v1::DeviceReport& device, const std::string& path) {
  out_ +=
      "<h4>Memory at the peak</h4>\n<table class=\"peak-state\">\n<tr><th>peak of allocated bytes "
      "at</th>";
  Num(path + ".peak_time_ns", "peak_time_ns", Unit::kTime, device.peak_time_ns());
  out_ += "</tr>\n<tr><th>allocations live then</th>";
  Num(path + ".peak_live_count", "peak_live_count", Unit::kCount, device.peak_live_count());
  out_ += "</tr>\n<tr><th>of them not listed</th>";
  Num(path + ".peak_live_omitted", "peak_live_omitted", Unit::kCount, device.peak_live_omitted());
  out_ += "</tr>\n<tr><th>their requested bytes</th>";
  Num(path + ".peak_live_omitted_bytes", "peak_live_omitted_bytes", Unit::kBytes,
      device.peak_live_omitted_bytes());
  out_ += "</tr>\n<tr><th>allocations not listed at all</th>";
  Num(path + ".allocations_omitted", "allocations_omitted", Unit::kCount,
      device.allocations_omitted());
  out_ += "</tr>\n</table>\n";

  std::vector<int> live;
  for (int i = 0; i < device.allocations_size(); ++i) {
    if (device.allocations(i).live_at_peak()) live.push_back(i);
  }
  if (live.empty()) {
    out_ += "<p class=\"none\">no allocation recorded live at the peak</p>\n";
    return;
  }
  std::stable_sort(live.begin(), live.end(), [&](int a, int b) {
    return device.allocations(a).requested_bytes() > device.allocations(b).requested_bytes();
  });
  if (device.peak_live_omitted() > 0) {
    absl::StrAppend(&out_, "<p class=\"note\">", device.peak_live_omitted(),
                    " smaller allocations live at the peak (",
                    FormatBytes(device.peak_live_omitted_bytes()),
                    ") are not listed and not in the tables below.</p>\n");
  }
  // Largest first; at most kShown rows, the rest counted (all are in --format json).
  constexpr std::size_t kShown = 100;
  out_ +=
      "<table class=\"peak-allocations\">\n<tr><th>address</th><th>requested</th>"
      "<th>allocated</th><th>kind</th><th>site</th><th>NVTX range</th><th>allocated at</th>"
      "<th>freed at</th></tr>\n";
  for (std::size_t n = 0; n < live.size() && n < kShown; ++n) {
    const int i = live[n];
    const v1::AllocationRecord& a = device.allocations(i);
    const std::string at = absl::StrCat(path, ".allocations.", i, ".");
    absl::StrAppend(&out_, "<tr data-index=\"", i, "\">");
    Num(at + "address", "address", Unit::kHex, a.address());
    Num(at + "requested_bytes", "requested_bytes", Unit::kBytes, a.requested_bytes());
    Num(at + "allocated_bytes", "allocated_bytes", Unit::kBytes, a.allocated_bytes());
    Cell(at + "kind", "kind", Unit::kEnum, v1::AllocationKind_Name(a.kind()), KindLabel(a.kind()));
    SiteCell(at + "site", a.site());
    Text(at + "nvtx_name", "nvtx_name", a.nvtx_name());
    Num(at + "alloc_time_ns", "alloc_time_ns", Unit::kTime, a.alloc_time_ns());
    if (a.free_time_ns() == 0) {
      Cell(at + "free_time_ns", "free_time_ns", Unit::kTime, "0", "not freed");
    } else {
      Num(at + "free_time_ns", "free_time_ns", Unit::kTime, a.free_time_ns());
    }
    out_ += "</tr>\n";
  }
  out_ += "</table>\n";
  if (live.size() > kShown) {
    absl::StrAppend(&out_, "<p class=\"note\">... and ", live.size() - kShown,
                    " more live at the peak (--format json for all)</p>\n");
  }

  PeakGroups(device, live);
}

void Page::PeakGroups(const v1::DeviceReport& device, const std::vector<int>& live) {
  // By site and by calling library: the listed allocations live at the peak, largest first.
  struct Group {
    std::uint64_t bytes = 0;
    std::uint64_t count = 0;
  };
  std::map<std::uint64_t, Group> by_site;
  std::map<std::string, Group> by_library;
  for (const int i : live) {
    const v1::AllocationRecord& a = device.allocations(i);
    Group& site = by_site[a.site()];
    site.bytes += a.requested_bytes();
    ++site.count;
    auto info = sites_.find(a.site());
    const std::string library = a.site() == 0 ? "(no site recorded)"
                                : info != sites_.end() && !info->second.library.empty()
                                    ? info->second.library
                                    : std::string("(unknown)");
    Group& lib = by_library[library];
    lib.bytes += a.requested_bytes();
    ++lib.count;
  }
  auto rows = [&](const char* cls, const char* heading, auto& groups, auto label) {
    std::vector<std::pair<typename std::decay_t<decltype(groups)>::key_type, Group>> sorted(
        groups.begin(), groups.end());
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const auto& a, const auto& b) { return a.second.bytes > b.second.bytes; });
    absl::StrAppend(&out_, "<table class=\"", cls, "\">\n<tr><th>", heading,
                    "</th><th>requested at the peak</th><th>allocations</th></tr>\n");
    for (const auto& [key, group] : sorted) {
      absl::StrAppend(&out_, "<tr><td class=\"text\">", MarkupEscape(label(key)),
                      "</td><td class=\"num\" title=\"", group.bytes, " bytes\">",
                      FormatBytes(group.bytes), "</td><td class=\"num\">", group.count,
                      "</td></tr>\n");
    }
    out_ += "</table>\n";
  };
  out_ += "<h4>At the peak, by site</h4>\n";
  rows("peak-by-site", "site", by_site,
       [&](std::uint64_t site) { return SiteLabel(site, sites_); });
  out_ += "<h4>At the peak, by calling library</h4>\n";
  rows("peak-by-library", "library", by_library, [](const std::string& name) { return name; });
}

}  // namespace

std::string FormatReportsHtml(const std::vector<v1::Report>& reports) {
  return Page().Build(reports);
}

}  // namespace vramscope::cli
