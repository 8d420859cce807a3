#include "check/history_baseline.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <cstdio>

namespace vramscope::cli {
namespace {

std::uint64_t Median(std::vector<std::uint64_t> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  if (n % 2 == 1) return values[n / 2];
  // The mean of the middle two, without overflow.
  const std::uint64_t a = values[n / 2 - 1];
  const std::uint64_t b = values[n / 2];
  return a + (b - a) / 2;
}

}  // namespace

std::optional<bool> ParseHistoryBaselineFlag(ArgReader& args, HistoryBaselineOptions* options) {
  const bool security = net::IsClientFlag(args.flag());
  if (!args.Is("--baseline-from") && !args.Is("--label") && !args.Is("--baseline-runs") &&
      !security) {
    return std::nullopt;
  }
  std::string value;
  if (!args.Value(&value)) return false;
  if (security) return net::SetClientFlag(args.flag(), value, &options->security);
  if (args.Is("--baseline-from")) {
    options->collector = value;
    if (value.empty()) std::fprintf(stderr, "vramscope check: --baseline-from needs HOST:PORT\n");
    return !value.empty();
  }
  if (args.Is("--label")) {
    absl::Status s = AddLabelArg(value, &options->labels);
    if (!s.ok()) std::fprintf(stderr, "vramscope check: %s\n", std::string(s.message()).c_str());
    return s.ok();
  }
  if (!absl::SimpleAtoi(value, &options->runs) || options->runs < 1 || options->runs > 1000) {
    std::fprintf(stderr, "vramscope check: --baseline-runs '%s' is not a count (1..1000)\n",
                 value.c_str());
    return false;
  }
  return true;
}

v1::Report MedianBaseline(const v1::Report& latest, const std::vector<v1::RunSummary>& runs) {
  v1::Report baseline = latest;
  for (v1::DeviceReport& device : *baseline.mutable_devices()) {
    std::vector<std::uint64_t> requested, allocated, reserved;
    for (const v1::RunSummary& run : runs) {
      for (const v1::RunDevicePeaks& peaks : run.devices()) {
        if (peaks.ordinal() != device.device().ordinal()) continue;
        requested.push_back(peaks.peak_requested_bytes());
        allocated.push_back(peaks.peak_allocated_bytes());
        reserved.push_back(peaks.peak_reserved_bytes());
      }
    }
    if (reserved.empty()) continue;
    device.set_peak_requested_bytes(Median(requested));
    device.set_peak_allocated_bytes(Median(allocated));
    device.set_peak_reserved_bytes(Median(reserved));
  }
  return baseline;
}

absl::StatusOr<std::vector<v1::Report>> BaselineFromHistory(const HistoryBaselineOptions& options) {
  absl::StatusOr<net::ClientCredentials> credentials = net::LoadClientCredentials(options.security);
  if (!credentials.ok()) return absl::InvalidArgumentError(credentials.status().message());
  const CollectorQuery query{.address = options.collector, .credentials = *std::move(credentials)};
  v1::ListRunsRequest request;
  for (const auto& [key, value] : options.labels) (*request.mutable_labels())[key] = value;
  request.set_passing_only(true);
  request.set_limit(static_cast<std::uint32_t>(options.runs));
  absl::StatusOr<v1::ListRunsResponse> runs = ListCollectorRuns(query, request);
  if (!runs.ok()) return runs.status();
  if (runs->runs().empty()) {
    return absl::NotFoundError(absl::StrFormat(
        "no passing run (exit code 0, not killed) with the labels %s in the history of the "
        "collector at %s; `vramscope history --collector %s` lists its runs",
        LabelsForDisplay(options.labels), options.collector, options.collector));
  }
  absl::StatusOr<v1::Report> latest = FetchCollectorRun(query, runs->runs(0).run_id());
  if (!latest.ok()) return latest.status();
  const std::vector<v1::RunSummary> summaries(runs->runs().begin(), runs->runs().end());
  std::fprintf(stdout,
               "baseline: the median of the last %zu passing run(s) with %s (newest: run %lld)\n",
               summaries.size(), LabelsForDisplay(options.labels).c_str(),
               static_cast<long long>(runs->runs(0).run_id()));
  return std::vector<v1::Report>{MedianBaseline(*latest, summaries)};
}

}  // namespace vramscope::cli
