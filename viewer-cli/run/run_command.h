// `vramscope run [OPTIONS] -- CMD ARGS...`: runs CMD under the shim with no daemon, drains the
// event rings of CMD and of every child process it starts, and reports at exit.
//
// Exit status: CMD's own (a signal N becomes 128 + N; 127 when CMD cannot be started); when CMD
// succeeded, 1 if --max-peak was exceeded, else 2 if an output file could not be written, else 3
// if --collector did not acknowledge every event within 10 s. 2 for usage errors (nothing is
// run).
#pragma once

#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "command.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {

// `vramscope run --live`: a view fed while CMD runs (viewer-cli/top implements it; the
// `vramscope` executable installs it with SetRunLiveViewFactory). Called on the thread that
// supervises CMD.
class RunLiveView {
 public:
  virtual ~RunLiveView() = default;
  // True when the view draws on the terminal: CMD then reads /dev/null and its output is held
  // back in a file and printed after the view closes.
  virtual bool TakesTerminal() const = 0;
  // About every 10 ms while CMD runs. `reports` builds the current reports (costly: the view
  // calls it at its own pace).
  virtual void Tick(const std::function<std::vector<v1::Report>()>& reports) = 0;
  // CMD has exited and every ring is drained: the final state; the terminal is given back.
  virtual void Close(const std::vector<v1::Report>& reports) = 0;
};
using RunLiveViewFactory = std::unique_ptr<RunLiveView> (*)();
// Without a factory `--live` is refused as a usage error.
void SetRunLiveViewFactory(RunLiveViewFactory factory);

inline constexpr std::string_view kRunSummary =
    "run a command under the shim: report peaks and fragmentation at exit, trace, CI gate";

// argv[0] is "run".
int RunRun(int argc, char** argv);
// Adds the verb's flags to `app` (for `vramscope --help`, the man page, the completions).
std::shared_ptr<void> DefineRunFlags(CLI::App& app);

}  // namespace vramscope::cli
