// `vramscope top [--collector ADDR] [--interval DURATION] [--filter TEXT] [--plain] [--once]`:
// the live dashboard of every process a collector knows (or plain lines when stdout is not a
// terminal). MakeRunLiveView is the same dashboard for `vramscope run --live`, fed by the run's
// own stats engine instead of a collector.
//
// Exit status: 0 (quit, or --once done), 2 usage, 3 the collector cannot be reached (or, in
// plain mode, the stream to it broke).
#pragma once

#include <memory>
#include <string_view>

#include "common/command.h"
#include "common/live_view.h"

namespace vramscope::cli {

inline constexpr std::string_view kTopSummary =
    "live dashboard of the collector's processes: memory per process and device, graph, NVTX";

// argv[0] is "top".
int RunTop(int argc, char** argv);
// Adds the verb's flags to `app` (for `vramscope --help`, the man page, the completions).
std::shared_ptr<void> DefineTopFlags(CLI::App& app);

// The `vramscope run --live` view: the dashboard when stdin and stdout are terminals, else one
// plain line per process and device every second on stdout.
std::unique_ptr<RunLiveView> MakeRunLiveView();

}  // namespace vramscope::cli
