// `vramscope history --collector ADDR [--label K=V]... [--since 7d] [--format text|csv|json]
// [--limit N]`: the collector's run history (ListRuns), shown by history_format.h.
// Exit status: 0; 2 usage errors and a collector that keeps no history; 3 collector unreachable.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "common/command.h"

namespace vramscope::cli {

inline constexpr std::string_view kHistorySummary =
    "runs over time from a collector's history: peaks per label set, sparklines, CSV, JSON";

// argv[0] is "history".
int RunHistory(int argc, char** argv);
std::shared_ptr<void> DefineHistoryFlags(CLI::App& app);

// "7d", "12h", "30m", "45s", "2w" as nanoseconds; false for anything else.
bool ParseSince(std::string_view text, std::uint64_t* ns);

}  // namespace vramscope::cli
