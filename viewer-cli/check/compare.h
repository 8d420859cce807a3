// Comparing the peaks of a report with a baseline report, figure by figure.
//
// Figures: per process and device, peak requested, allocated and reserved bytes; per NVTX range
// on a device, peak allocated bytes while the range was open. Processes are matched by position
// when each side has exactly one, otherwise by command line (the k-th process with a given
// command line in one file matches the k-th in the other); devices by ordinal; NVTX ranges by
// domain and name.
//
// Verdicts: a figure present on both sides regresses when it grew by more than
// tolerance_percent of its baseline; it improved when it shrank by more than that. A figure with
// no usable baseline (a new process or device, or a baseline of 0) regresses when it reaches
// new_floor_bytes (and is above 0). New NVTX ranges never regress (their memory is already counted
// in the device figures); figures missing from the report are listed as removed and never regress.
// Pure functions, no state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {

struct CompareOptions {
  double tolerance_percent = 5.0;
  std::uint64_t new_floor_bytes = std::uint64_t{1} << 20;
};

enum class Verdict {
  kWithin,       // within tolerance (or new and below the floor)
  kRegression,   // grew beyond tolerance, or new at or above the floor
  kImprovement,  // shrank beyond tolerance
  kAdded,        // only in the report, not a regression
  kRemoved,      // only in the baseline
};

struct Figure {
  std::string process;  // command line of the process, or "pid N" when it has none
  std::string name;     // "cuda:0 peak reserved", "cuda:0 range train:step peak allocated"
  std::optional<std::uint64_t> baseline;  // absent: not in the baseline
  std::optional<std::uint64_t> now;       // absent: not in the report
  Verdict verdict = Verdict::kWithin;
  bool nvtx_range = false;  // an NVTX range's figure (new ones never regress)

  // Signed growth in bytes (0 when either side is absent).
  double DeltaBytes() const;
  // Growth in percent of the baseline; nullopt when either side is absent or the baseline is 0.
  std::optional<double> DeltaPercent() const;
};

struct Comparison {
  std::vector<Figure> figures;  // in report order: process, device, device figures, ranges
  int Count(Verdict verdict) const;
};

Comparison Compare(const std::vector<v1::Report>& baseline, const std::vector<v1::Report>& now,
                   const CompareOptions& options);

}  // namespace vramscope::cli
