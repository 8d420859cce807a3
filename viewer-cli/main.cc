// `vramscope`: the user's command line. Dispatches to one subcommand per verb.
#include <cstdio>
#include <cstring>
#include <string_view>

#include "check/check_command.h"
#include "common/command.h"
#include "export/export_command.h"
#include "history/history_command.h"
#include "replay/replay_command.h"
#include "report/report_command.h"
#include "run/run_command.h"
#include "top/top_command.h"

namespace vramscope::cli {
namespace {

// Only commands that exist are listed: `--help` tells the truth. One per line (clang-format
// would pack them into columns).
// clang-format off
constexpr Command kCommands[] = {
    {"run", kRunSummary, RunRun},
    {"replay", kReplaySummary, RunReplay},
    {"export", kExportSummary, RunExport},
    {"check", kCheckSummary, RunCheck},
    {"report", kReportSummary, RunReport},
    {"history", kHistorySummary, RunHistory},
    {"top", kTopSummary, RunTop},  // also the view of `vramscope run --live`
};
// clang-format on

void PrintUsage(std::FILE* out) {
  std::fprintf(out,
               "vramscope %s: GPU memory pooling and observability for unmodified CUDA programs\n"
               "\n"
               "usage: vramscope COMMAND [ARGS...]\n"
               "       vramscope COMMAND --help\n"
               "\n"
               "commands:\n",
               VRAMSCOPE_VERSION);
  for (const Command& command : kCommands) {
    std::fprintf(out, "  %-10.*s %.*s\n", static_cast<int>(command.name.size()),
                 command.name.data(), static_cast<int>(command.summary.size()),
                 command.summary.data());
  }
  std::fprintf(out,
               "\n"
               "The shim itself is used without this command: LD_PRELOAD=libvramscope.so PROGRAM\n"
               "(see README.md for the VRAMSCOPE_* settings).\n"
               "exit codes: 0 ok, 1 check failed, 2 usage or unreadable input, 3 collector "
               "unreachable\n");
}

}  // namespace
}  // namespace vramscope::cli

int main(int argc, char** argv) {
  using namespace vramscope::cli;
  SetRunLiveViewFactory(MakeRunLiveView);  // `vramscope run --live` shows the top dashboard
  if (argc < 2) {
    PrintUsage(stderr);
    return kExitUsage;
  }
  const std::string_view verb = argv[1];
  if (verb == "--help" || verb == "-h" || verb == "help") {
    PrintUsage(stdout);
    return kExitOk;
  }
  if (verb == "--version" || verb == "version") {
    std::printf("vramscope %s\n", VRAMSCOPE_VERSION);
    return kExitOk;
  }
  for (const Command& command : kCommands) {
    if (command.name == verb) return command.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "vramscope: unknown command '%s'; `vramscope --help` lists the commands\n",
               argv[1]);
  return kExitUsage;
}
