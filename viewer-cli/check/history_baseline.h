// `vramscope check --baseline-from ADDR --label K=V... [--baseline-runs N]`: a baseline taken
// from a collector's run history instead of a committed file. The baseline is the most recent
// passing run with those labels (exit code 0, not killed), its report as stored, with each
// device's peak requested, allocated and reserved bytes replaced by the median over the last N
// passing runs with those labels that had that device (the mean of the two middle values for an
// even count). NVTX range figures are the latest run's.
//
// Thread safety: pure functions but BaselineFromHistory (network). Errors: absl::Status:
// kNotFound when no passing run has the labels, else as client/collector_call.h.
#pragma once

#include <absl/status/statusor.h>

#include <optional>
#include <string>
#include <vector>

#include "client/collector_call.h"
#include "common/labels_arg.h"
#include "vramscope/net_security.h"
#include "vramscope/v1/collector.pb.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {

struct HistoryBaselineOptions {
  std::string collector;         // --baseline-from; empty: not used
  Labels labels;                 // --label (at least one with --baseline-from)
  int runs = 5;                  // --baseline-runs
  net::ClientSecurity security;  // --tls-ca, --tls-cert, --tls-key, --token-file, ...
};

// The median baseline (above) from `latest` (the newest run's report) and `runs`.
v1::Report MedianBaseline(const v1::Report& latest, const std::vector<v1::RunSummary>& runs);

absl::StatusOr<std::vector<v1::Report>> BaselineFromHistory(const HistoryBaselineOptions& options);

}  // namespace vramscope::cli
