// CheckJsonBounds: the limits every JSON input of vramscope meets before a parser sees it.
//
// protobuf's JSON parser (JsonStringToMessage) spends time quadratic in the nesting depth of an
// input: 100 KB of nested brackets cost it minutes of CPU before it reports an error. This is a
// single linear pass over the text, run first: it counts the nesting of `[` and `{` outside
// strings (following `"` and `\` escapes) and refuses input nested deeper, or longer, than the
// limits. It does not validate the syntax otherwise: that stays the parser's job, on input that is
// now cheap to parse.
//
// The defaults are far above what vramscope writes: by its schema (proto/vramscope/v1/report.proto)
// a `vramscope run --json` report nests at most 8 levels,
// `{"reports": [{"devices": [{"top_sites": [{"frames": ["..."]}]}]}]}`, and is kilobytes to a few
// megabytes. Past the limits the pre-scan answers in one pass (100 KB of nesting: under a
// millisecond), where the parser would spend minutes.
//
// Errors: absl::InvalidArgumentError whose message starts with `what` (usually the file's path)
// and names the limit and where it was passed, e.g.
//   "report.json: JSON nested deeper than 64 levels at byte 64"
//   "report.json: JSON is 300000000 bytes, more than the limit of 268435456 bytes (256 MiB)"
// Byte positions count from 0. Pure function of its arguments: thread-safe, no I/O.
#pragma once

#include <absl/status/status.h>

#include <cstddef>
#include <string_view>

namespace vramscope::json {

struct JsonLimits {
  // Brackets open at once, `[` and `{` together.
  std::size_t max_depth = 64;
  // Length of the whole text.
  std::size_t max_bytes = std::size_t{256} << 20;
};

absl::Status CheckJsonBounds(std::string_view json, std::string_view what,
                             const JsonLimits& limits = JsonLimits());

// The size limit alone, for a reader that knows a file's length before reading it.
absl::Status CheckJsonSize(std::size_t bytes, std::string_view what,
                           const JsonLimits& limits = JsonLimits());

}  // namespace vramscope::json
