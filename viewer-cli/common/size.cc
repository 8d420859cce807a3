#include "common/size.h"

#include <cctype>
#include <cmath>
#include <cstdio>

namespace vramscope::cli {
namespace {

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

std::optional<long double> UnitMultiplier(std::string_view unit) {
  struct Unit {
    std::string_view name;
    long double multiplier;
  };
  static constexpr long double kKi = 1024.0L, kK = 1000.0L;
  static const Unit kUnits[] = {
      {"", 1},
      {"b", 1},
      {"k", kKi},
      {"kib", kKi},
      {"kb", kK},
      {"m", kKi * kKi},
      {"mib", kKi * kKi},
      {"mb", kK * kK},
      {"g", kKi * kKi * kKi},
      {"gib", kKi * kKi * kKi},
      {"gb", kK * kK * kK},
      {"t", kKi * kKi * kKi * kKi},
      {"tib", kKi * kKi * kKi * kKi},
      {"tb", kK * kK * kK * kK},
  };
  for (const Unit& u : kUnits) {
    if (EqualsIgnoreCase(unit, u.name)) return u.multiplier;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::uint64_t> ParseSize(std::string_view text) {
  // Digits, at most one '.', then optional spaces and a unit.
  std::size_t i = 0;
  long double integer = 0;
  long double fraction = 0;
  long double scale = 1;
  bool digits = false;
  bool dot = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c >= '0' && c <= '9') {
      digits = true;
      if (dot) {
        scale /= 10;
        fraction += (c - '0') * scale;
      } else {
        integer = integer * 10 + (c - '0');
        if (integer > 1e30L) return std::nullopt;
      }
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      break;
    }
  }
  if (!digits) return std::nullopt;
  while (i < text.size() && text[i] == ' ') ++i;
  const std::optional<long double> multiplier = UnitMultiplier(text.substr(i));
  if (!multiplier) return std::nullopt;
  const long double bytes = std::floor((integer + fraction) * *multiplier);
  if (!(bytes >= 0) || bytes > 18446744073709551615.0L) return std::nullopt;
  return static_cast<std::uint64_t>(bytes);
}

std::string FormatBytes(std::uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 6) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf),
                value >= 100  ? "%.0f %s"
                : value >= 10 ? "%.1f %s"
                              : "%.2f %s",
                value, kUnits[unit]);
  return buf;
}

}  // namespace vramscope::cli
