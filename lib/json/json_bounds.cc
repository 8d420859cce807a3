// The JSON pre-scan: see json_bounds.h.
#include "vramscope/json/json_bounds.h"

#include <absl/strings/str_cat.h>

namespace vramscope::json {
namespace {

// This Abseil's string_view is not std::string_view.
absl::string_view Absl(std::string_view text) {
  return absl::string_view(text.data(), text.size());
}

}  // namespace

absl::Status CheckJsonSize(std::size_t bytes, std::string_view what, const JsonLimits& limits) {
  if (bytes <= limits.max_bytes) return absl::OkStatus();
  std::string limit = absl::StrCat(limits.max_bytes, " bytes");
  if (limits.max_bytes % (std::size_t{1} << 20) == 0) {
    absl::StrAppend(&limit, " (", limits.max_bytes >> 20, " MiB)");
  }
  return absl::InvalidArgumentError(
      absl::StrCat(Absl(what), ": JSON is ", bytes, " bytes, more than the limit of ", limit));
}

absl::Status CheckJsonBounds(std::string_view json, std::string_view what,
                             const JsonLimits& limits) {
  if (absl::Status s = CheckJsonSize(json.size(), what, limits); !s.ok()) return s;
  // Only brackets outside strings nest; inside a string, `\` makes the next byte literal (a `\"`
  // does not end it). The multi-byte forms (\uXXXX, UTF-8) contain no `"` or `\` bytes past the
  // first, so byte-wise is exact.
  std::size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (std::size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > limits.max_depth) {
          return absl::InvalidArgumentError(absl::StrCat(Absl(what), ": JSON nested deeper than ",
                                                         limits.max_depth, " levels at byte ", i));
        }
        break;
      case ']':
      case '}':
        // An unbalanced closer is a syntax error the parser reports; here it only must not wrap.
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace vramscope::json
