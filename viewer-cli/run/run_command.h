// `vramscope run [OPTIONS] -- CMD ARGS...`: runs CMD under the shim with no daemon, drains the
// event rings of CMD and of every child process it starts, and reports at exit.
//
// Exit status: CMD's own (a signal N becomes 128 + N; 127 when CMD cannot be started); when CMD
// succeeded, 1 if --max-peak was exceeded, else 2 if an output file could not be written, else 3
// if --collector did not acknowledge every event within 10 s. 2 for usage errors (nothing is
// run).
#pragma once

#include <memory>
#include <string_view>

#include "common/command.h"
#include "common/live_view.h"

namespace vramscope::cli {

// `vramscope run --live` uses the view the factory makes (viewer-cli/top's, installed by the
// `vramscope` executable); without a factory `--live` is refused as a usage error.
void SetRunLiveViewFactory(RunLiveViewFactory factory);

inline constexpr std::string_view kRunSummary =
    "run a command under the shim: report peaks and fragmentation at exit, trace, CI gate";

// argv[0] is "run".
int RunRun(int argc, char** argv);
// Adds the verb's flags to `app` (for `vramscope --help`, the man page, the completions).
std::shared_ptr<void> DefineRunFlags(CLI::App& app);

}  // namespace vramscope::cli
