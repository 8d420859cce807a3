// `vramscope report`: see report_command.h. The input is read completely before anything is
// written, so a corrupt input or an unreachable collector never leaves an output file behind.
#include "report/report_command.h"

#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>

#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/command.h"
#include "common/report_file.h"
#include "common/report_text.h"
#include "report/collector_source.h"
#include "report/report_html.h"
#include "vramscope/atomic_file.h"
#include "vramscope/command_line.h"
#include "vramscope/net_security.h"

namespace vramscope::cli {
namespace {

enum class Format { kText, kJson, kHtml };

struct ReportOptions {
  std::string file;
  std::string collector;
  std::optional<std::uint32_t> pid;
  std::string host;
  std::optional<std::int64_t> run;  // --run: a run from the collector's history
  Format format = Format::kText;
  std::string output;  // empty: stdout
  net::ClientSecurity security;
};

constexpr char kFooter[] =
    "Other forms: vramscope report --collector ADDR --pid PID [--host HOST] [--format ...] [-o "
    "FILE]; vramscope report --collector ADDR --run ID [--format ...] [-o FILE]; vramscope report "
    "--collector ADDR.\n"
    "Shows a report: one saved with `vramscope run --json FILE` (one Report, or {\"reports\": "
    "[...]} for several processes), or the report a running vramscope-collector holds for process "
    "PID. With --collector and no --pid, lists the collector's processes (running and finished) "
    "and exits 0: pick one with --pid (and --host when the same pid is known on several hosts; of "
    "several processes with that pid on one host, the latest started is shown).\n"
    "Exit status: 0 ok, 2 usage error, input missing or not a report, no such process at the "
    "collector, or an output that cannot be written; 3 the collector cannot be reached.";

// Which options go together: "" or why not.
std::string CheckCombination(const ReportOptions& options, bool have_format) {
  if (options.file.empty() == options.collector.empty()) {
    return options.file.empty() ? "give a report FILE.json or --collector ADDR"
                                : "a FILE and --collector cannot go together";
  }
  if (!options.file.empty() && (options.pid || !options.host.empty())) {
    return "--pid and --host need --collector";
  }
  if (options.run && (options.collector.empty() || options.pid)) {
    return "--run needs --collector and goes without --pid";
  }
  if (!options.host.empty() && !options.pid) return "--host needs --pid";
  if (!options.collector.empty() && !options.pid && !options.run &&
      (have_format || !options.output.empty())) {
    return "--format and -o need a report: add --pid PID (`vramscope report --collector " +
           options.collector + "` lists the processes)";
  }
  return "";
}

void DefineFlags(CLI::App& app, ReportOptions* options) {
  cmdline::MakeApp(app, "FILE.json [--format text|json|html] [-o FILE]");
  app.footer(kFooter);
  app.add_option("file", options->file, "a report `vramscope run --json` wrote")
      ->type_name("FILE.json");
  app.add_option("--format", options->format,
                 "text (default): the summary `vramscope run` prints at exit; json: the report "
                 "with proto field names, as `vramscope run --json` writes it (readable by "
                 "`vramscope check` and by this command); html: one self-contained page (no "
                 "network): per device a plot of requested, allocated and reserved bytes over "
                 "time with NVTX ranges shaded, and tables of peaks, fragmentation, OOMs, NVTX "
                 "ranges, top allocation sites, allocations not freed at exit, bytes by kind")
      ->type_name("FORMAT")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, Format>{
              {"text", Format::kText}, {"json", Format::kJson}, {"html", Format::kHtml}},
          CLI::ignore_case));
  app.add_option("-o,--output", options->output,
                 "write there (replaced atomically) instead of stdout")
      ->type_name("FILE")
      ->check([](const std::string& value) { return value.empty() ? "needs a file name" : ""; });
  app.add_option("--collector", options->collector,
                 "the collector's HOST:PORT (vramscope-collector --listen); several, "
                 "comma-separated, are merged, each event counted once")
      ->type_name("ADDR")
      ->check([](const std::string& value) { return value.empty() ? "needs HOST:PORT" : ""; });
  cmdline::AddClientSecurityFlags(app, &options->security);
  app.add_option_function<std::uint32_t>(
         "--pid", [options](std::uint32_t pid) { options->pid = pid; },
         "with --collector: the process to report")
      ->type_name("PID")
      ->check(CLI::PositiveNumber);
  app.add_option("--host", options->host, "with --pid: the host the process ran on")
      ->type_name("HOST");
  app.add_option_function<std::int64_t>(
         "--run", [options](std::int64_t run) { options->run = run; },
         "with --collector: a run from its history (`vramscope history` lists them with their "
         "ids), finished at any time")
      ->type_name("ID")
      ->check(CLI::PositiveNumber);
}

std::string Render(const std::vector<v1::Report>& reports, Format format) {
  switch (format) {
    case Format::kJson:
      return FormatReportsJson(reports);
    case Format::kHtml:
      return FormatReportsHtml(reports);
    case Format::kText:
      break;
  }
  std::string out;
  for (const v1::Report& report : reports) out += FormatRunReport(report, "--format json");
  return out;
}

int ListProcesses(const ReportOptions& options, const CollectorQuery& query) {
  const absl::StatusOr<v1::ListProcessesResponse> list = ListCollectorProcesses(query);
  if (!list.ok()) {
    std::fprintf(stderr, "vramscope report: %s\n", std::string(list.status().message()).c_str());
    return kExitUnreachable;
  }
  if (list->processes().empty()) {
    std::printf("the collector at %s has no processes yet\n", options.collector.c_str());
  } else {
    std::fputs(FormatProcessList(*list).c_str(), stdout);
    std::printf("\npick one: vramscope report --collector %s --pid PID [--host HOST]\n",
                options.collector.c_str());
  }
  std::fflush(stdout);
  return kExitOk;
}

// Reads or fetches the report and writes it; the exit code.
int Execute(const ReportOptions& options) {
  CollectorQuery query;
  query.address = options.collector;
  if (!options.collector.empty()) {
    absl::StatusOr<net::ClientCredentials> credentials =
        net::LoadClientCredentials(options.security);
    if (!credentials.ok()) {
      std::fprintf(stderr, "vramscope report: %s\n",
                   std::string(credentials.status().message()).c_str());
      return kExitUsage;
    }
    query.credentials = *std::move(credentials);
  }
  if (!options.collector.empty() && !options.pid && !options.run) {
    return ListProcesses(options, query);
  }

  std::vector<v1::Report> reports;
  if (!options.file.empty()) {
    absl::StatusOr<std::vector<v1::Report>> read = ReadReportsFile(options.file);
    if (!read.ok()) {
      std::fprintf(stderr, "vramscope report: %s\n", std::string(read.status().message()).c_str());
      return kExitUsage;
    }
    reports = std::move(*read);
  } else {
    absl::StatusOr<v1::Report> fetched =
        options.run ? FetchCollectorRun(query, *options.run)
                    : FetchCollectorReport(query, *options.pid, options.host);
    if (!fetched.ok()) {
      std::fprintf(stderr, "vramscope report: %s\n",
                   std::string(fetched.status().message()).c_str());
      return absl::IsUnavailable(fetched.status()) ? kExitUnreachable : kExitUsage;
    }
    reports.push_back(std::move(*fetched));
  }

  const std::string content = Render(reports, options.format);
  if (options.output.empty()) {
    std::fwrite(content.data(), 1, content.size(), stdout);
    if (std::fflush(stdout) != 0) {
      std::fprintf(stderr, "vramscope report: cannot write to stdout\n");
      return kExitUsage;
    }
    return kExitOk;
  }
  if (absl::Status s = WriteFileAtomically(options.output, content); !s.ok()) {
    std::fprintf(stderr, "vramscope report: %s\n", std::string(s.message()).c_str());
    return kExitUsage;
  }
  return kExitOk;
}

}  // namespace

std::shared_ptr<void> DefineReportFlags(CLI::App& app) {
  auto options = std::make_shared<ReportOptions>();
  DefineFlags(app, options.get());
  return options;
}

int RunReport(int argc, char** argv) {
  CLI::App app(std::string(kReportSummary), "vramscope report");
  ReportOptions options;
  DefineFlags(app, &options);
  if (std::optional<int> exit_code = cmdline::Parse(app, argc, argv)) return *exit_code;
  if (const std::string problem = CheckCombination(options, app.count("--format") > 0);
      !problem.empty()) {
    return cmdline::UsageError(app, problem);
  }
  return Execute(options);
}

}  // namespace vramscope::cli
