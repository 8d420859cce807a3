// Reading the JSON reports `vramscope run --json` writes: one `vramscope.v1.Report` (proto field
// names), or `{"reports": [Report, ...]}` for several processes.
//
// Errors: absl::Status whose message names the file and says what is wrong: kFailedPrecondition
// when it cannot be read, kInvalidArgument for content that is not a report (bad JSON, unknown
// fields, a device or NVTX range listed twice in one process; input nested deeper or longer than
// lib/json's limits, refused before protobuf parses it). Thread-safe.
#pragma once

#include <absl/status/statusor.h>

#include <string>
#include <string_view>
#include <vector>

#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {

// Parses either form; `what` names the input in error messages (usually its path).
absl::StatusOr<std::vector<v1::Report>> ParseReportsJson(std::string_view json,
                                                         std::string_view what);

// Why `reports` measured nothing, or "" when it did: no process at all, no event in any process,
// or no device in any process (each is what a run looks like when the shim did not attach, e.g.
// LD_PRELOAD lost on the way, or the program never used the CUDA driver). A file with several
// processes is judged as a whole: a launcher that used no device beside one that did is fine.
std::string WhyReportsEmpty(const std::vector<v1::Report>& reports);

// Reads and parses `path`. The raw text is stored in *text when text is not null.
absl::StatusOr<std::vector<v1::Report>> ReadReportsFile(const std::string& path,
                                                        std::string* text = nullptr);

}  // namespace vramscope::cli
