// Byte sizes as people write them, one grammar for every vramscope program: the shim's
// VRAMSCOPE_*_BYTES/CAPACITY variables, every size flag of vramscope, vramscope-agent and
// vramscope-collector.
//
// Grammar: DIGITS [ "." DIGITS ] [ " "... ] [ UNIT ]
//   UNIT, case-insensitive: none or B (bytes); K, KiB, M, MiB, G, GiB, T, TiB (powers of 1024);
//   KB, MB, GB, TB (powers of 1000). So 512MiB = 512M = 0.5GiB = 536870912, 1G = 1GiB =
//   1073741824, 1GB = 1000000000. A fraction is rounded down to whole bytes (digits past the
//   18th after the point are ignored). Refused: empty text, a leading space or sign, exponents,
//   hexadecimal, an unknown unit, more than 2^64 - 1 bytes.
//
// Header-only, C++17, no dependencies beyond the standard headers, no exceptions, no heap in
// ParseSizeText (the shim calls it while reading its environment). FormatBytes allocates (a
// std::string) and is for out-of-process code. Every function is pure: safe from any thread.
#ifndef VRAMSCOPE_SIZE_PARSE_H_
#define VRAMSCOPE_SIZE_PARSE_H_

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace vramscope {

enum class SizeError { kOk, kEmpty, kNotANumber, kUnknownUnit, kTooLarge };

struct SizeParse {
  std::uint64_t bytes = 0;
  SizeError error = SizeError::kOk;
  constexpr bool ok() const { return error == SizeError::kOk; }
};

// What every "not a size" message says after the value.
inline constexpr char kSizeGrammarHelp[] =
    "want bytes or a number with K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024) or KB, MB, GB, TB "
    "(powers of 1000), e.g. 4096, 512MiB, 1.5G";

// Why a text is not a size, for messages ("unknown unit").
constexpr const char* SizeErrorText(SizeError error) {
  switch (error) {
    case SizeError::kOk:
      return "ok";
    case SizeError::kEmpty:
      return "empty";
    case SizeError::kNotANumber:
      return "not a number";
    case SizeError::kUnknownUnit:
      return "unknown unit";
    case SizeError::kTooLarge:
      return "more than 2^64 - 1 bytes";
  }
  return "invalid";
}

namespace size_parse_internal {

__extension__ typedef unsigned __int128 Wide;  // no pedantic warning: a GNU extension on purpose

constexpr char Lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

constexpr bool UnitIs(std::string_view unit, std::string_view name) {
  if (unit.size() != name.size()) return false;
  for (std::size_t i = 0; i < unit.size(); ++i) {
    if (Lower(unit[i]) != name[i]) return false;
  }
  return true;
}

// The unit's multiplier, 0 for an unknown unit.
constexpr std::uint64_t UnitMultiplier(std::string_view unit) {
  struct Unit {
    std::string_view name;
    std::uint64_t multiplier;
  };
  constexpr std::uint64_t kKi = 1024, kK = 1000;
  constexpr Unit kUnits[] = {
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
    if (UnitIs(unit, u.name)) return u.multiplier;
  }
  return 0;
}

}  // namespace size_parse_internal

// Parses `text` (the grammar above). Exact integer arithmetic: no rounding beyond the fraction's.
constexpr SizeParse ParseSizeText(std::string_view text) {
  using size_parse_internal::Wide;
  if (text.empty()) return {0, SizeError::kEmpty};
  Wide integer = 0;
  std::uint64_t fraction = 0, denominator = 1;
  bool digits = false, dot = false, too_large = false;
  std::size_t i = 0;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c >= '0' && c <= '9') {
      digits = true;
      if (!dot) {
        integer = integer * 10 + static_cast<unsigned>(c - '0');
        if (integer > ~std::uint64_t{0}) too_large = true, integer = ~std::uint64_t{0};
      } else if (denominator < 1000000000000000000ull) {
        fraction = fraction * 10 + static_cast<unsigned>(c - '0');
        denominator *= 10;
      }
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      break;
    }
  }
  if (!digits) return {0, SizeError::kNotANumber};
  std::size_t unit_start = i;
  while (unit_start < text.size() && text[unit_start] == ' ') ++unit_start;
  const std::string_view unit = text.substr(unit_start);
  if (unit_start > i && unit.empty()) return {0, SizeError::kNotANumber};  // "1 "
  for (char c : unit) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) return {0, SizeError::kNotANumber};
  }
  const std::uint64_t multiplier = size_parse_internal::UnitMultiplier(unit);
  if (multiplier == 0) return {0, SizeError::kUnknownUnit};
  if (too_large) return {0, SizeError::kTooLarge};
  const Wide bytes = integer * multiplier + Wide{fraction} * multiplier / denominator;
  if (bytes > ~std::uint64_t{0}) return {0, SizeError::kTooLarge};
  return {static_cast<std::uint64_t>(bytes), SizeError::kOk};
}

// nullopt for anything ParseSizeText refuses.
constexpr std::optional<std::uint64_t> ParseSize(std::string_view text) {
  const SizeParse parsed = ParseSizeText(text);
  if (!parsed.ok()) return std::nullopt;
  return parsed.bytes;
}

// "1.50 GiB", "512 B": powers of 1024, three significant figures. ParseSize reads it back
// (within the rounding).
inline std::string FormatBytes(std::uint64_t bytes) {
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

}  // namespace vramscope

#endif  // VRAMSCOPE_SIZE_PARSE_H_
