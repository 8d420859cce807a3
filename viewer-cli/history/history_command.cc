#include "history/history_command.h"

#include <absl/strings/numbers.h>
#include <absl/time/clock.h>
#include <absl/time/time.h>

#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "client/collector_call.h"
#include "common/command.h"
#include "common/labels_arg.h"
#include "history/history_format.h"
#include "vramscope/command_line.h"
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

constexpr char kFooter[] =
    "The runs a collector keeps in its history (every traced process that finished), with their "
    "peaks: text groups them by label set, oldest first, with a sparkline of peak reserved "
    "bytes; csv has one row per run and device; json is the ListRuns answer.\n"
    "Exit status: 0; 2 usage errors or a collector without history; 3 collector unreachable.";

void DefineFlags(CLI::App& app, HistoryOptions* options) {
  cmdline::MakeApp(app, "--collector ADDR [--label KEY=VALUE]... [--since AGE] [FLAGS]");
  app.footer(kFooter);
  app.add_option("--collector", options->collector, "the collector's HOST:PORT")->type_name("ADDR");
  cmdline::AddClientSecurityFlags(app, &options->security);
  app.add_option_function<std::vector<std::string>>(
         "--label",
         [options](const std::vector<std::string>& values) {
           for (const std::string& value : values) {
             if (absl::Status s = AddLabelArg(value, &options->labels); !s.ok()) {
               throw CLI::ValidationError(std::string(s.message()));
             }
           }
         },
         "only runs with this label (repeatable: every one must match)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  app.add_option_function<std::string>(
         "--since",
         [options](const std::string& value) {
           std::uint64_t age = 0;
           if (!ParseSince(value, &age)) {
             throw CLI::ValidationError("--since '" + value + "' is not an age (7d, 12h)");
           }
           const std::int64_t now = absl::ToUnixNanos(absl::Now());
           options->since_ns = age >= static_cast<std::uint64_t>(now) ? 1 : now - age;
         },
         "only runs started within AGE: 45s, 30m, 12h, 7d, 2w")
      ->type_name("AGE");
  app.add_option("--format", options->format, "text (default), csv or json")
      ->type_name("FORMAT")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, Format>{
              {"text", Format::kText}, {"csv", Format::kCsv}, {"json", Format::kJson}},
          CLI::ignore_case));
  app.add_option("--limit", options->limit, "the N most recent runs at most")
      ->type_name("N")
      ->check(CLI::Range(std::uint32_t{1}, ~std::uint32_t{0}));
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

std::shared_ptr<void> DefineHistoryFlags(CLI::App& app) {
  auto options = std::make_shared<HistoryOptions>();
  DefineFlags(app, options.get());
  return options;
}

int RunHistory(int argc, char** argv) {
  CLI::App app(std::string(kHistorySummary), "vramscope history");
  auto options = std::make_shared<HistoryOptions>();
  DefineFlags(app, options.get());
  if (std::optional<int> exit_code = cmdline::Parse(app, argc, argv)) return *exit_code;
  if (options->collector.empty()) {
    return cmdline::UsageError(app, "--collector HOST:PORT is required");
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
