// How `vramscope history` shows runs (a ListRunsResponse, most recent first as the collector
// sends it): text grouped by label set, oldest first, with a sparkline of peak reserved bytes per
// group; CSV with one row per run and device; JSON (the response, proto field names).
// Peaks in text are the largest device's (the figure that runs out).
// Thread safety: pure functions. Error convention: none.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vramscope/v1/collector.pb.h"

namespace vramscope::cli {

// "▁▂▃▄▅▆▇█" scaled from the smallest value (▁) to the largest (█); "" for none.
std::string Sparkline(const std::vector<std::uint64_t>& values);

std::string FormatRunsText(const v1::ListRunsResponse& runs);
std::string FormatRunsCsv(const v1::ListRunsResponse& runs);
std::string FormatRunsJson(const v1::ListRunsResponse& runs);

}  // namespace vramscope::cli
