// `vramscope report`: see report_command.h. The input is read completely before anything is
// written, so a corrupt input or an unreachable collector never leaves an output file behind.
#include "report/report_command.h"

#include <absl/status/statusor.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "common/args.h"
#include "common/command.h"
#include "common/report_file.h"
#include "common/report_text.h"
#include "report/collector_source.h"
#include "report/report_html.h"
#include "vramscope/atomic_file.h"
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

void PrintReportUsage(std::FILE* out) {
  std::fprintf(
      out,
      "usage: vramscope report FILE.json [--format text|json|html] [-o FILE]\n"
      "       vramscope report --collector ADDR --pid PID [--host HOST] [--format ...] [-o FILE]\n"
      "       vramscope report --collector ADDR --run ID [--format ...] [-o FILE]\n"
      "       vramscope report --collector ADDR\n"
      "\n"
      "Shows a report: one saved with `vramscope run --json FILE` (one Report, or\n"
      "{\"reports\": [...]} for several processes), or the report a running vramscope-collector\n"
      "holds for process PID. With --collector and no --pid, lists the collector's processes\n"
      "(running and finished) and exits 0: pick one with --pid (and --host when the same pid\n"
      "is known on several hosts; of several processes with that pid on one host, the latest\n"
      "started is shown).\n"
      "\n"
      "options:\n"
      "  --format FORMAT   text (default): the summary `vramscope run` prints at exit;\n"
      "                    json: the report with proto field names, as `vramscope run --json`\n"
      "                    writes it (readable by `vramscope check` and by this command);\n"
      "                    html: one self-contained page (no network): per device a plot of\n"
      "                    requested, allocated and reserved bytes over time with NVTX ranges\n"
      "                    shaded, and tables of peaks, fragmentation, OOMs, NVTX ranges, top\n"
      "                    allocation sites, allocations not freed at exit, bytes by kind\n"
      "  -o, --output FILE write there (replaced atomically) instead of stdout\n"
      "  --collector ADDR  the collector's HOST:PORT (vramscope-collector --listen); several,\n"
      "                    comma-separated, are merged, each event counted once\n"
      "  --pid PID         with --collector: the process to report\n"
      "  --host HOST       with --pid: the host the process ran on\n"
      "  --run ID          with --collector: a run from its history (`vramscope history`\n"
      "                    lists them with their ids), finished at any time\n"
      "  -h, --help        this text\n"
      "with --collector, how to reach it:\n"
      "%s"
      "\n"
      "exit status: 0 ok, 2 usage error, input missing or not a report, no such process at the\n"
      "collector, or an output that cannot be written; 3 the collector cannot be reached.\n",
      net::kClientFlagsHelp);
}

// Which options go together. False after printing why.
bool CheckCombination(const ReportOptions& options, bool have_format) {
  if (options.file.empty() == options.collector.empty()) {
    std::fprintf(stderr, options.file.empty()
                             ? "vramscope report: give a report FILE.json or --collector ADDR\n"
                             : "vramscope report: a FILE and --collector cannot go together\n");
    return false;
  }
  if (!options.file.empty() && (options.pid || !options.host.empty())) {
    std::fprintf(stderr, "vramscope report: --pid and --host need --collector\n");
    return false;
  }
  if (options.run && (options.collector.empty() || options.pid)) {
    std::fprintf(stderr, "vramscope report: --run needs --collector and goes without --pid\n");
    return false;
  }
  if (!options.host.empty() && !options.pid) {
    std::fprintf(stderr, "vramscope report: --host needs --pid\n");
    return false;
  }
  if (!options.collector.empty() && !options.pid && !options.run &&
      (have_format || !options.output.empty())) {
    std::fprintf(stderr,
                 "vramscope report: --format and -o need a report: add --pid PID (`vramscope "
                 "report --collector %s` lists the processes)\n",
                 options.collector.c_str());
    return false;
  }
  return true;
}

// Returns nullopt after printing the problem (usage error) or for --help (help set).
std::optional<ReportOptions> ParseArgs(int argc, char** argv, bool* help) {
  ReportOptions options;
  bool have_format = false;
  ArgReader args("report", argc, argv);
  while (args.Next()) {
    const std::string_view arg = args.arg();
    const std::string& flag = args.flag();
    std::string value;
    auto take = [&]() -> bool { return args.Value(&value); };
    if (flag == "-h" || flag == "--help") {
      *help = true;
      return std::nullopt;
    } else if (flag == "--format") {
      if (!take()) return std::nullopt;
      if (value == "text") {
        options.format = Format::kText;
      } else if (value == "json") {
        options.format = Format::kJson;
      } else if (value == "html") {
        options.format = Format::kHtml;
      } else {
        std::fprintf(stderr, "vramscope report: --format '%s' is not text, json or html\n",
                     value.c_str());
        return std::nullopt;
      }
      have_format = true;
    } else if (flag == "-o" || flag == "--output") {
      if (!take()) return std::nullopt;
      if (value.empty()) {
        std::fprintf(stderr, "vramscope report: %s needs a file name\n", flag.c_str());
        return std::nullopt;
      }
      options.output = value;
    } else if (flag == "--collector") {
      if (!take()) return std::nullopt;
      if (value.empty()) {
        std::fprintf(stderr, "vramscope report: --collector needs HOST:PORT\n");
        return std::nullopt;
      }
      options.collector = value;
    } else if (net::IsClientFlag(flag)) {
      if (!take()) return std::nullopt;
      net::SetClientFlag(flag, value, &options.security);
    } else if (flag == "--pid") {
      if (!take()) return std::nullopt;
      std::uint32_t pid = 0;
      if (!absl::SimpleAtoi(value, &pid) || pid == 0) {
        std::fprintf(stderr, "vramscope report: --pid '%s' is not a process id\n", value.c_str());
        return std::nullopt;
      }
      options.pid = pid;
    } else if (flag == "--host") {
      if (!take()) return std::nullopt;
      options.host = value;
    } else if (flag == "--run") {
      if (!take()) return std::nullopt;
      std::int64_t run = 0;
      if (!absl::SimpleAtoi(value, &run) || run <= 0) {
        std::fprintf(stderr, "vramscope report: --run '%s' is not a run id\n", value.c_str());
        return std::nullopt;
      }
      options.run = run;
    } else if (arg.size() > 1 && arg[0] == '-') {
      std::fprintf(stderr, "vramscope report: unknown option '%s'\n", std::string(arg).c_str());
      return std::nullopt;
    } else if (options.file.empty()) {
      options.file = std::string(arg);
    } else {
      std::fprintf(stderr, "vramscope report: one input file only ('%s' and '%s' given)\n",
                   options.file.c_str(), std::string(arg).c_str());
      return std::nullopt;
    }
  }
  if (!CheckCombination(options, have_format)) return std::nullopt;
  return options;
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

}  // namespace

int RunReport(int argc, char** argv) {
  bool help = false;
  const std::optional<ReportOptions> parsed = ParseArgs(argc, argv, &help);
  if (help) {
    PrintReportUsage(stdout);
    return kExitOk;
  }
  if (!parsed) {
    std::fprintf(stderr, "`vramscope report --help` for usage\n");
    return kExitUsage;
  }
  const ReportOptions& options = *parsed;
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

}  // namespace vramscope::cli
