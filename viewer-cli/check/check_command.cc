// `vramscope check`: see check_command.h. Reads both files before anything is compared or
// written, so a corrupt input never produces a verdict, a JUnit file or a new baseline.
#include "check/check_command.h"

#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "check/check_output.h"
#include "check/compare.h"
#include "check/history_baseline.h"
#include "common/command.h"
#include "common/labels_arg.h"
#include "common/process_end.h"
#include "common/report_file.h"
#include "common/size.h"
#include "vramscope/atomic_file.h"
#include "vramscope/command_line.h"

namespace vramscope::cli {
namespace {

struct CheckOptions {
  std::string baseline_path;
  std::string report_path;
  std::string junit_path;
  bool update_baseline = false;
  bool allow_empty = false;
  bool allow_killed = false;
  CompareOptions compare;
  HistoryBaselineOptions history;  // --baseline-from
};

constexpr char kFooter[] =
    "Other form: vramscope check --baseline-from ADDR --label KEY=VALUE... [--baseline-runs N] "
    "--report FILE [--tolerance PCT] [--new-floor SIZE] [--junit ...].\n"
    "Compares the peaks in a `vramscope run --json` report with a baseline report (the same "
    "format: one Report, or {\"reports\": [...]}) and fails when one grew.\n"
    "Figures compared, per process and device: peak requested, peak allocated and peak reserved "
    "bytes; per NVTX range on a device: peak allocated bytes while it was open. Processes are "
    "matched by position when each file has exactly one, otherwise by command line (the k-th "
    "process with a command line matches the k-th with the same one); devices by ordinal "
    "(cuda:N); NVTX ranges by domain and name.\n"
    "A figure REGRESSES when it grew by more than the tolerance (percent of its baseline); it is "
    "an improvement when it shrank by more. A device or process only in the report, or a "
    "baseline of 0, has no percentage: it regresses when its peak reaches --new-floor. NVTX "
    "ranges only in the report are listed as added and never regress (their memory is counted in "
    "the device's figures). Figures only in the baseline are listed as removed.\n"
    "Output: a table of what grew or shrank beyond the tolerance, added and removed (baseline, "
    "now, delta, delta %) and a summary line on stdout; problems on stderr. With "
    "GITHUB_ACTIONS=true in the environment, also GitHub annotations on stdout: ::error per "
    "regression, ::notice per improvement.\n"
    "Exit status: 0 no regression (or baseline updated), 1 regression or a killed process "
    "(without --allow-killed), 2 usage error, no passing run with the labels, input file missing, "
    "unreadable, not a report or empty (without --allow-empty), or (when nothing regressed) a "
    "--junit file that cannot be written; 3 --baseline-from's collector cannot be reached.";

std::optional<double> ParseTolerance(std::string text) {
  if (!text.empty() && text.back() == '%') text.pop_back();
  if (text.empty() || text.find_first_not_of("0123456789.") != std::string::npos) {
    return std::nullopt;  // no sign, exponent, hex, nan or inf
  }
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

// Which flags go together: "" or why not.
std::string CheckCombination(const CheckOptions& options) {
  const bool from_history = !options.history.collector.empty();
  if (options.report_path.empty() || from_history == !options.baseline_path.empty()) {
    return "--report FILE and one of --baseline FILE or --baseline-from ADDR are required";
  }
  if (from_history != !options.history.labels.empty()) {
    return from_history ? "--baseline-from needs --label KEY=VALUE (which runs make the baseline)"
                        : "--label goes with --baseline-from";
  }
  if (from_history && options.update_baseline) return "--update-baseline needs --baseline FILE";
  if (options.update_baseline && !options.junit_path.empty()) {
    return "--junit cannot go with --update-baseline (nothing is checked when the baseline is "
           "replaced)";
  }
  return "";
}

// --baseline-from and what goes with it (history_baseline.h).
void DefineHistoryFlags(CLI::App& app, HistoryBaselineOptions* history) {
  app.add_option("--baseline-from", history->collector,
                 "instead of a file: the baseline from the run history of the collector at ADDR "
                 "(HOST:PORT): per device, the median peaks of the last --baseline-runs passing "
                 "runs (exit 0, not killed) having every --label given (NVTX figures: the newest "
                 "such run's)")
      ->type_name("ADDR")
      ->check([](const std::string& value) { return value.empty() ? "needs HOST:PORT" : ""; });
  app.add_option_function<std::vector<std::string>>(
         "--label",
         [history](const std::vector<std::string>& values) {
           for (const std::string& value : values) {
             if (absl::Status s = AddLabelArg(value, &history->labels); !s.ok()) {
               throw CLI::ValidationError(std::string(s.message()));
             }
           }
         },
         "with --baseline-from: which runs (repeatable; at least one)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  app.add_option("--baseline-runs", history->runs, "with --baseline-from: how many runs")
      ->type_name("N")
      ->check(CLI::Range(1, 1000));
  cmdline::AddClientSecurityFlags(app, &history->security);
}

void DefineFlags(CLI::App& app, CheckOptions* options) {
  cmdline::MakeApp(app,
                   "--baseline FILE --report FILE [--tolerance PCT] [--new-floor SIZE] [FLAGS]");
  app.footer(kFooter);
  app.add_option("--baseline", options->baseline_path,
                 "the accepted report (with --update-baseline it may not exist yet)")
      ->type_name("FILE");
  DefineHistoryFlags(app, &options->history);
  app.add_option("--report", options->report_path, "the report to check")->type_name("FILE");
  app.add_option_function<std::string>(
         "--tolerance",
         [options](const std::string& value) {
           const std::optional<double> tolerance = ParseTolerance(value);
           if (!tolerance) {
             throw CLI::ValidationError("--tolerance '" + value +
                                        "' is not a percentage (a number >= 0, e.g. 5 or 2.5)");
           }
           options->compare.tolerance_percent = *tolerance;
         },
         "allowed growth in percent, e.g. 2.5 or 2.5% (default 5)")
      ->type_name("PCT");
  cmdline::AddSize(app, "--new-floor", &options->compare.new_floor_bytes,
                   "peak at which a new device or process, or growth from a baseline of 0, is a "
                   "regression (default 1MiB; 0 = any growth)");
  app.add_option("--junit", options->junit_path,
                 "also write JUnit XML: a testcase per figure, a failure per regression, removed "
                 "figures skipped")
      ->type_name("FILE");
  app.add_flag("--allow-killed", options->allow_killed,
               "a process of the report that was killed (by a signal, or vanished without an exit "
               "record: its peaks may be short of a full run) is only listed; without it, it "
               "fails the check");
  app.add_flag("--update-baseline", options->update_baseline,
               "check that --report is a valid report, print the comparison with the old baseline "
               "when there is a readable one, then replace the baseline with the report file "
               "(atomically) and exit 0");
  app.add_flag("--allow-empty", options->allow_empty,
               "accept a report or baseline that measured nothing (no process, no event, or no "
               "device); without it such a file is an error (exit 2), since it is what a run "
               "looks like when the shim did not attach");
}

// A file that measured nothing must not pass the gate: an empty report is what a run looks like
// when the shim did not attach, and comparing it would list every figure as removed and exit 0.
// Prints the problem and returns false unless --allow-empty.
bool AcceptEmptiness(const CheckOptions& options, std::string_view role, const std::string& path,
                     const std::vector<v1::Report>& reports) {
  const std::string why = WhyReportsEmpty(reports);
  if (why.empty() || options.allow_empty) return true;
  std::fprintf(stderr,
               "vramscope check: %s %s %s: nothing was measured. The likely cause: the shim did "
               "not attach (LD_PRELOAD lost on the way to the program, a static or setuid "
               "binary) or the program never used the CUDA driver. --allow-empty accepts it.\n",
               std::string(role).c_str(), path.c_str(), why.c_str());
  return false;
}

bool InGitHubActions() {
  const char* value = getenv("GITHUB_ACTIONS");
  return value != nullptr && std::string_view(value) == "true";
}

// Lists the report's processes that were killed (or vanished) on stdout; returns how many.
int ListKilled(const std::vector<v1::Report>& reports, bool allowed) {
  int killed = 0;
  for (const v1::Report& report : reports) {
    if (!report.finished() || !report.killed()) continue;
    ++killed;
    std::fprintf(
        stdout, "%s: pid %u (%s) %s: its figures may be short of a full run\n",
        allowed ? "allowed (--allow-killed)" : "FAIL", report.process().pid(),
        report.command_line().empty() ? "?" : absl::StrJoin(report.command_line(), " ").c_str(),
        ProcessEndText(true, report.exit_code(), true, report.signal()).c_str());
  }
  return killed;
}

int UpdateBaseline(const CheckOptions& options) {
  std::string text;
  const absl::StatusOr<std::vector<v1::Report>> report =
      ReadReportsFile(options.report_path, &text);
  if (!report.ok()) {
    std::fprintf(stderr, "vramscope check: %s; the baseline %s is left unchanged\n",
                 std::string(report.status().message()).c_str(), options.baseline_path.c_str());
    return kExitUsage;
  }
  if (!AcceptEmptiness(options, "report", options.report_path, *report)) {
    std::fprintf(stderr, "vramscope check: the baseline %s is left unchanged\n",
                 options.baseline_path.c_str());
    return kExitUsage;
  }
  // The old baseline is only shown: a missing or damaged one is what updating fixes.
  const absl::StatusOr<std::vector<v1::Report>> old = ReadReportsFile(options.baseline_path);
  if (old.ok()) {
    std::fputs("compared with the old baseline:\n", stdout);
    std::fputs(FormatCheckTable(Compare(*old, *report, options.compare), options.compare).c_str(),
               stdout);
  } else {
    std::fprintf(stdout, "no previous baseline to compare with (%s)\n",
                 std::string(old.status().message()).c_str());
  }
  if (absl::Status s = WriteFileAtomically(options.baseline_path, text); !s.ok()) {
    std::fprintf(stderr, "vramscope check: %s\n", std::string(s.message()).c_str());
    return kExitUsage;
  }
  std::fprintf(stdout, "baseline %s updated from %s\n", options.baseline_path.c_str(),
               options.report_path.c_str());
  std::fflush(stdout);
  return kExitOk;
}

// The report against `baseline` (named `baseline_name` in messages): table, annotations,
// JUnit, exit status.
int CompareAndReport(const CheckOptions& options, const std::vector<v1::Report>& baseline,
                     const std::string& baseline_name) {
  const absl::StatusOr<std::vector<v1::Report>> report = ReadReportsFile(options.report_path);
  if (!report.ok()) {
    std::fprintf(stderr, "vramscope check: report: %s\n",
                 std::string(report.status().message()).c_str());
    return kExitUsage;
  }
  if (!AcceptEmptiness(options, "baseline", baseline_name, baseline) ||
      !AcceptEmptiness(options, "report", options.report_path, *report)) {
    return kExitUsage;
  }

  const Comparison comparison = Compare(baseline, *report, options.compare);
  std::fputs(FormatCheckTable(comparison, options.compare).c_str(), stdout);
  if (InGitHubActions()) {
    std::fputs(FormatGitHubAnnotations(comparison, options.compare).c_str(), stdout);
  }
  std::fflush(stdout);

  bool outputs_ok = true;
  if (!options.junit_path.empty()) {
    if (absl::Status s =
            WriteFileAtomically(options.junit_path, FormatJUnit(comparison, options.compare));
        !s.ok()) {
      std::fprintf(stderr, "vramscope check: %s\n", std::string(s.message()).c_str());
      outputs_ok = false;
    }
  }
  const int killed = ListKilled(*report, options.allow_killed);
  std::fflush(stdout);
  if (comparison.Count(Verdict::kRegression) > 0) return kExitCheckFailed;
  if (killed > 0 && !options.allow_killed) return kExitCheckFailed;
  return outputs_ok ? kExitOk : kExitUsage;
}

// --baseline-from: the baseline from the collector's run history (history_baseline.h).
int CheckAgainstHistory(const CheckOptions& options) {
  const absl::StatusOr<std::vector<v1::Report>> baseline = BaselineFromHistory(options.history);
  if (!baseline.ok()) {
    std::fprintf(stderr, "vramscope check: baseline: %s\n",
                 std::string(baseline.status().message()).c_str());
    return absl::IsUnavailable(baseline.status()) ? kExitUnreachable : kExitUsage;
  }
  return CompareAndReport(options, *baseline,
                          "the history of the collector at " + options.history.collector);
}

}  // namespace

std::shared_ptr<void> DefineCheckFlags(CLI::App& app) {
  auto options = std::make_shared<CheckOptions>();
  DefineFlags(app, options.get());
  return options;
}

int RunCheck(int argc, char** argv) {
  CLI::App app(std::string(kCheckSummary), "vramscope check");
  CheckOptions options;
  DefineFlags(app, &options);
  if (std::optional<int> exit_code = cmdline::Parse(app, argc, argv)) return *exit_code;
  if (const std::string problem = CheckCombination(options); !problem.empty()) {
    return cmdline::UsageError(app, problem);
  }
  if (options.update_baseline) return UpdateBaseline(options);

  if (!options.history.collector.empty()) return CheckAgainstHistory(options);
  const absl::StatusOr<std::vector<v1::Report>> baseline = ReadReportsFile(options.baseline_path);
  if (!baseline.ok()) {
    std::fprintf(stderr,
                 "vramscope check: baseline: %s\n(create one with `vramscope check --baseline "
                 "FILE --report REPORT --update-baseline`)\n",
                 std::string(baseline.status().message()).c_str());
    return kExitUsage;
  }
  return CompareAndReport(options, *baseline, options.baseline_path);
}

}  // namespace vramscope::cli
