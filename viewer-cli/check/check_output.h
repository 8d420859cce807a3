// What `vramscope check` writes: the readable table, JUnit XML, GitHub Actions annotations.
// Pure functions over a Comparison; no I/O.
#pragma once

#include <string>
#include <string_view>

#include "check/compare.h"

namespace vramscope::cli {

// The aligned table of regressions, improvements, added and removed figures, with a summary
// line; figures within tolerance are counted, not listed.
std::string FormatCheckTable(const Comparison& comparison, const CompareOptions& options);

// One <testcase> per figure (classname: the process, name: the figure); regressions are
// <failure>s, removed figures <skipped/>.
std::string FormatJUnit(const Comparison& comparison, const CompareOptions& options);

// `::error title=...::message` per regression and `::notice` per improvement, one a line.
std::string FormatGitHubAnnotations(const Comparison& comparison, const CompareOptions& options);

}  // namespace vramscope::cli
