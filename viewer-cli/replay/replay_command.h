// `vramscope replay TRACE [--json] [--policy NAME]`: replays a recorded allocation trace through
// the pool over a virtual upstream and reports peak memory, fragmentation and host cost.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include "common/command.h"
#include "replay/replay.h"
#include "replay/trace_loader.h"

namespace vramscope::cli {

inline constexpr std::string_view kReplaySummary =
    "replay a recorded allocation trace through the pool (no GPU): peaks, fragmentation, cost";

// argv[0] is "replay". Returns the exit code (command.h): 0 ok; 2 usage, or a trace that cannot be
// read or is invalid (the message names FILE:LINE); 1 the pool broke its contract.
int RunReplay(int argc, char** argv);
// Adds the verb's flags to `app` (for `vramscope --help`, the man page, the completions).
std::shared_ptr<void> DefineReplayFlags(CLI::App& app);

// The report, exposed for tests.
std::string FormatReplayJson(const LoadedTrace& trace, const ReplayResult& result);
std::string FormatReplayText(const LoadedTrace& trace, const ReplayResult& result);

}  // namespace vramscope::cli
