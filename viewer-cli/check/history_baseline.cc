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
