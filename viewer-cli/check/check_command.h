// `vramscope check --baseline FILE --report FILE [OPTIONS]`: the CI gate. Compares the peaks of a
// `vramscope run --json` report with a baseline report (see check/compare.h for the rules).
//
// Exit status: 0 within tolerance (or baseline updated), 1 on a regression, 2 for usage errors,
// unreadable or corrupt input files, or an output file that cannot be written.
#pragma once

#include <memory>
#include <string_view>

#include "common/command.h"

namespace vramscope::cli {

inline constexpr std::string_view kCheckSummary =
    "compare a run's JSON report with a baseline: exit 1 when a peak grew (CI gate, JUnit)";

// argv[0] is "check".
int RunCheck(int argc, char** argv);
// Adds the verb's flags to `app` (for `vramscope --help`, the man page, the completions).
std::shared_ptr<void> DefineCheckFlags(CLI::App& app);

}  // namespace vramscope::cli
