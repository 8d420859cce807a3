// The forms of a report `vramscope run` and `vramscope report` write: the readable text (one
// block per process and device) and the JSON of `--json`.
#pragma once

#include <string>
#include <vector>

#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {

std::string FormatRunReport(const v1::Report& report);

// JSON with the proto field names: one process -> its Report, several -> {"reports": [...]}
// (what check/report_file.h reads back).
std::string FormatReportsJson(const std::vector<v1::Report>& reports);

}  // namespace vramscope::cli
