// The forms of a report `vramscope run` and `vramscope report` write: the readable text (one
// block per process and device) and the JSON of `--json`.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {

// The readable text. Lists are cut (NVTX ranges, allocation sites, leaks at 5; calling libraries
// at 8; OOMs after the first), and a cut list always ends with how many more there are and where
// to see them all: "... and 3 more NVTX ranges (--json for all)", `full_form` naming the option
// that writes the whole report ("--json" for `vramscope run`, "--format json" for `report`).
std::string FormatRunReport(const v1::Report& report, std::string_view full_form = "--json");

// JSON with the proto field names: one process -> its Report, several -> {"reports": [...]}
// (what common/report_file.h reads back).
std::string FormatReportsJson(const std::vector<v1::Report>& reports);

}  // namespace vramscope::cli
