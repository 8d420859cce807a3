// The self-contained HTML page of `vramscope report --format html`.
//
// One page for any number of reports (processes): per process a table of what ran, per device a
// plot of requested, allocated and reserved bytes over time (DeviceReport.timeline) with the NVTX
// range instances shaded (DeviceReport.nvtx_instances), and the tables: peaks and counts,
// fragmentation (now and at peak), OOMs, NVTX ranges, top allocation sites, leaks, peak bytes by
// allocation kind.
//
// Self-contained: inline CSS and one small inline script, no network (a Content-Security-Policy
// forbids any fetch). The plot is drawn by the script into an empty <svg> from a JSON block
// (<script type="application/json">); without JavaScript the tables are all there.
//
// Machine-findable numbers: every figure in a table is a cell
//   <td data-path="R.devices.D.peak_reserved_bytes" data-field="peak_reserved_bytes"
//       data-value="1234" data-unit="bytes">1.21 KiB</td>
// where data-path walks the report from its index R in the input (fields by proto name, repeated
// fields by index, maps by key) and data-value is the exact value as in the JSON form (integers in
// decimal, doubles with 17 significant digits, enums by name). Strings from the report (command
// line, device and range names, frames) are cells with data-path and data-unit="text", their text
// the string itself. Everything from the report is HTML-escaped; strings in the script's JSON have
// <, > and & escaped as \u003c etc. so no input can close the script element.
//
// Thread-safe (no state).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {

std::string FormatReportsHtml(const std::vector<v1::Report>& reports);

}  // namespace vramscope::cli
