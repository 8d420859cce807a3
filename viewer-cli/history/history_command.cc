#include "history/history_command.h"

#include <absl/strings/numbers.h>
#include <absl/time/clock.h>
#include <absl/time/time.h>

#include <cstdio>
#include <optional>
#include <string>

#include "client/collector_call.h"
#include "common/args.h"
#include "common/command.h"
#include "common/labels_arg.h"
#include "history/history_format.h"
#include "vramscope/net_security.h"

namespace vramscope::cli {
namespace {

enum class Format { kText, kCsv, kJson };

struct HistoryOptions {
  std::string collector;
  net::ClientSecurity security;
  Labels labels;
  std::uint64_t since_ns = 0;  // a duration back from now; 0: all
  std::uint32_t limit = 1000;
  Format format = Format::kText;
};

void PrintHistoryUsage(std::FILE* out) {
  std::fprintf(
      out,
      "usage: vramscope history --collector ADDR [--label KEY=VALUE]... [--since AGE]\n"
      "                         [--format text|csv|json] [--limit N]\n"
      "\n"
      "The runs a collector keeps in its history (every traced process that finished), with\n"
      "their peaks: text groups them by label set, oldest first, with a sparkline of peak\n"
      "reserved bytes; csv has one row per run and device; json is the ListRuns answer.\n"
      "\n"
      "  --collector ADDR   the collector's HOST:PORT\n"
      "  --label KEY=VALUE  only runs with this label (repeatable: every one must match)\n"
      "  --since AGE        only runs started within AGE: 45s, 30m, 12h, 7d, 2w\n"
      "  --format FORMAT    text (default), csv or json\n"
      "  --limit N          the N most recent runs at most (default 1000)\n"
      "%s"
      "exit status: 0; 2 usage errors or a collector without history; 3 collector unreachable\n",
      net::kClientFlagsHelp);
}

std::optional<HistoryOptions> ParseArgs(int argc, char** argv, bool* help) {
  HistoryOptions options;
  ArgReader args("history", argc, argv);
  while (args.Next()) {
    std::string value;
    if (args.Is("-h") || args.Is("--help")) {
      *help = true;
      return std::nullopt;
    }
    const bool known = args.Is("--collector") || args.Is("--label") || args.Is("--since") ||
                       args.Is("--format") || args.Is("--limit") || net::IsClientFlag(args.flag());
    if (!known) {
      std::fprintf(stderr, "vramscope history: unknown option '%s'\n",
                   std::string(args.arg()).c_str());
      return std::nullopt;
    }
    if (!args.Value(&value)) return std::nullopt;
    std::string problem;
    if (args.Is("--collector")) {
      options.collector = value;
    } else if (net::SetClientFlag(args.flag(), value, &options.security)) {
    } else if (args.Is("--label")) {
      if (absl::Status s = AddLabelArg(value, &options.labels); !s.ok())
        problem = std::string(s.message());
    } else if (args.Is("--since")) {
      std::uint64_t age = 0;
      if (!ParseSince(value, &age)) problem = "--since '" + value + "' is not an age (7d, 12h)";
      const std::int64_t now = absl::ToUnixNanos(absl::Now());
      options.since_ns = age >= static_cast<std::uint64_t>(now) ? 1 : now - age;
    } else if (args.Is("--format")) {
      if (value == "text") {
        options.format = Format::kText;
      } else if (value == "csv") {
        options.format = Format::kCsv;
      } else if (value == "json") {
        options.format = Format::kJson;
      } else {
        problem = "--format '" + value + "' is not text, csv or json";
      }
    } else if (!absl::SimpleAtoi(value, &options.limit) || options.limit == 0) {
      problem = "--limit '" + value + "' is not a positive count";
    }
    if (!problem.empty()) {
      std::fprintf(stderr, "vramscope history: %s\n", problem.c_str());
      return std::nullopt;
    }
  }
  if (options.collector.empty()) {
    std::fprintf(stderr, "vramscope history: --collector HOST:PORT is required\n");
    return std::nullopt;
  }
  return options;
}

}  // namespace

bool ParseSince(std::string_view text, std::uint64_t* ns) {
  if (text.size() < 2) return false;
  std::uint64_t count = 0;
  if (!absl::SimpleAtoi(std::string(text.substr(0, text.size() - 1)), &count)) return false;
  std::uint64_t unit = 0;
  switch (text.back()) {
    case 's':
      unit = 1;
      break;
    case 'm':
      unit = 60;
      break;
    case 'h':
      unit = 3600;
      break;
    case 'd':
      unit = 86400;
      break;
    case 'w':
      unit = 7 * 86400;
      break;
    default:
      return false;
  }
  if (count > UINT64_MAX / 1000000000 / unit) return false;
  *ns = count * unit * 1000000000;
  return true;
}

int RunHistory(int argc, char** argv) {
  bool help = false;
  const std::optional<HistoryOptions> options = ParseArgs(argc, argv, &help);
  if (help) {
    PrintHistoryUsage(stdout);
    return kExitOk;
  }
  if (!options) {
    std::fprintf(stderr, "`vramscope history --help` for usage\n");
    return kExitUsage;
  }
  v1::ListRunsRequest request;
  for (const auto& [key, value] : options->labels) (*request.mutable_labels())[key] = value;
  request.set_since_time_ns(options->since_ns);
  request.set_limit(options->limit);
  absl::StatusOr<net::ClientCredentials> credentials =
      net::LoadClientCredentials(options->security);
  if (!credentials.ok()) {
    std::fprintf(stderr, "vramscope history: %s\n",
                 std::string(credentials.status().message()).c_str());
    return kExitUsage;
  }
  const absl::StatusOr<v1::ListRunsResponse> runs = ListCollectorRuns(
      {.address = options->collector, .credentials = *std::move(credentials)}, request);
  if (!runs.ok()) {
    std::fprintf(stderr, "vramscope history: %s\n", std::string(runs.status().message()).c_str());
    return absl::IsUnavailable(runs.status()) ? kExitUnreachable : kExitUsage;
  }
  const std::string out = options->format == Format::kCsv    ? FormatRunsCsv(*runs)
                          : options->format == Format::kJson ? FormatRunsJson(*runs)
                                                             : FormatRunsText(*runs);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return std::fflush(stdout) == 0 ? kExitOk : kExitUsage;
}

}  // namespace vramscope::cli
