// `vramscope`: the user's command line. Dispatches to one subcommand per verb; `--help`,
// `--version` and the generated man page and completions come from the same CLI11 definitions.
#include <cstdio>
#include <memory>
#include <string_view>
#include <vector>

#include "check/check_command.h"
#include "common/command.h"
#include "export/export_command.h"
#include "history/history_command.h"
#include "replay/replay_command.h"
#include "report/report_command.h"
#include "run/run_command.h"
#include "top/top_command.h"
#include "vramscope/command_line.h"

namespace vramscope::cli {
namespace {

// Only commands that exist are listed: `--help` tells the truth. One per line (clang-format
// would pack them into columns).
// clang-format off
constexpr Command kCommands[] = {
    {"run", kRunSummary, RunRun, DefineRunFlags},
    {"replay", kReplaySummary, RunReplay, DefineReplayFlags},
    {"export", kExportSummary, RunExport, DefineExportFlags},
    {"check", kCheckSummary, RunCheck, DefineCheckFlags},
    {"report", kReportSummary, RunReport, DefineReportFlags},
    {"history", kHistorySummary, RunHistory, DefineHistoryFlags},
    {"top", kTopSummary, RunTop, DefineTopFlags},  // also the view of `vramscope run --live`
};
// clang-format on

constexpr char kFooter[] =
    "The shim itself is used without this command: LD_PRELOAD=libvramscope.so PROGRAM\n"
    "(see README.md for the VRAMSCOPE_* settings). `vramscope COMMAND --help` describes one.\n"
    "Exit codes: 0 ok, 1 check failed, 2 usage or unreadable input, 3 collector unreachable.";

// The whole command line: every verb with its flags. `keep` owns what the flags write into.
void DefineAll(CLI::App& app, std::vector<std::shared_ptr<void>>* keep) {
  cmdline::MakeApp(app, "COMMAND [ARGS...]");
  app.footer(kFooter);
  for (const Command& command : kCommands) {
    CLI::App* verb = app.add_subcommand(std::string(command.name), std::string(command.summary));
    keep->push_back(command.define(*verb));
  }
}

}  // namespace
}  // namespace vramscope::cli

int main(int argc, char** argv) {
  using namespace vramscope::cli;
  SetRunLiveViewFactory(MakeRunLiveView);  // `vramscope run --live` shows the top dashboard
  if (argc >= 2) {
    const std::string_view verb = argv[1];
    for (const Command& command : kCommands) {
      if (command.name == verb) return command.run(argc - 1, argv + 1);
    }
    if (!verb.empty() && verb[0] != '-' && verb != "help" && verb != "version") {
      std::fprintf(stderr,
                   "vramscope: unknown command '%s'; `vramscope --help` lists the commands\n",
                   argv[1]);
      return kExitUsage;
    }
  }
  CLI::App app("GPU memory pooling and observability for unmodified CUDA programs", "vramscope");
  std::vector<std::shared_ptr<void>> keep;
  DefineAll(app, &keep);
  if (argc == 2 &&
      (std::string_view(argv[1]) == "help" || std::string_view(argv[1]) == "version")) {
    const char* flag = argv[1][0] == 'h' ? "--help" : "--version";
    const char* args[] = {argv[0], flag};
    return vramscope::cmdline::Parse(app, 2, args).value_or(kExitOk);
  }
  if (std::optional<int> exit_code = vramscope::cmdline::Parse(app, argc, argv)) {
    return *exit_code;
  }
  std::fputs(app.help().c_str(), stderr);  // no command
  return kExitUsage;
}
