// `vramscope report`: a report as readable text, JSON or a self-contained HTML page, from a saved
// `vramscope run --json` file or from a running collector (by pid).
//
// Exit status: 0 ok (also for the process listing of `--collector ADDR` alone), 2 usage error,
// input missing, unreadable or not a report, no such process at the collector, or an output file
// that cannot be written; 3 the collector cannot be reached.
#pragma once

#include <memory>
#include <string_view>

#include "common/command.h"

namespace vramscope::cli {

inline constexpr std::string_view kReportSummary =
    "show a saved or a collector's report as text, JSON or an HTML page with a plot";

// argv[0] is "report".
int RunReport(int argc, char** argv);
// Adds the verb's flags to `app` (for `vramscope --help`, the man page, the completions).
std::shared_ptr<void> DefineReportFlags(CLI::App& app);

}  // namespace vramscope::cli
