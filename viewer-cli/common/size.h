// Byte sizes as people write them: "4GiB", "512MiB", "1.5GB", "4096", "2G".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace vramscope::cli {

// Units, case-insensitive: B; KiB MiB GiB TiB and K M G T (powers of 1024); KB MB GB TB (powers
// of 1000). A fraction is allowed ("1.5GB") and rounded down to whole bytes. nullopt for
// anything else: empty, negative, unknown unit, beyond 2^64 - 1.
std::optional<std::uint64_t> ParseSize(std::string_view text);

// "1.50 GiB", "512 B": binary units, three significant figures.
std::string FormatBytes(std::uint64_t bytes);

}  // namespace vramscope::cli
