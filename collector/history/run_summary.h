// The history row of one finished process, taken from its report: what ListRuns answers and
// what the database keeps in columns (collector/README.md "Run history").
// Thread safety: pure function. Error convention: none (every report has a summary).
#pragma once

#include "vramscope/v1/collector.pb.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::collector {

// run_id is left 0: the database gives it.
v1::RunSummary SummarizeRun(const v1::Report& report);

// Exit code 0 and not killed: a run `check --baseline-from` may take as a baseline.
bool RunPassed(const v1::RunSummary& run);

}  // namespace vramscope::collector
