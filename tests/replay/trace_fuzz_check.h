// The contract every reader of untrusted trace bytes keeps, as one check a fuzzer can call:
// no crash, no hang, and either success or a clean error `NAME:LINE: message` whose line exists.
// Used by the deterministic gtest fuzzer (trace_fuzz_test.cc) and the libFuzzer entry point
// (trace_fuzzer.cc, built only with a compiler that has -fsanitize=fuzzer).
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include "replay/replay.h"
#include "replay/trace_loader.h"
#include "replay/trace_parser.h"

namespace vramscope::cli::testing {

inline constexpr std::string_view kFuzzName = "fuzz.csv";

// Checks that `status` reads `fuzz.csv:LINE: message` with 1 <= LINE <= `lines`. Returns what is
// wrong, or an empty string.
inline std::string CheckLocatedError(const absl::Status& status, std::uint64_t lines) {
  const std::string message(status.message());
  const std::string prefix = std::string(kFuzzName) + ":";
  if (message.rfind(prefix, 0) != 0) return "error does not start with the file name: " + message;
  const char* begin = message.data() + prefix.size();
  const char* end = message.data() + message.size();
  std::uint64_t line = 0;
  auto [ptr, ec] = std::from_chars(begin, end, line);
  if (ec != std::errc() || ptr == begin) return "error has no line number: " + message;
  if (end - ptr < 3 || ptr[0] != ':' || ptr[1] != ' ') return "no ': ' after the line: " + message;
  if (line < 1 || line > lines) {
    return "line " + std::to_string(line) + " outside 1.." + std::to_string(lines) + ": " + message;
  }
  if (status.code() != absl::StatusCode::kInvalidArgument &&
      status.code() != absl::StatusCode::kResourceExhausted) {
    return "unexpected status code: " + status.ToString();
  }
  return "";
}

// Runs `bytes` through the parser and loader (whole, and again in chunks of `chunk` bytes, which
// must give the same answer), and through a replay when it loads and `replay` is set.
inline std::string CheckTraceInput(std::string_view bytes, std::size_t chunk, bool replay) {
  const std::uint64_t lines = std::count(bytes.begin(), bytes.end(), '\n') + 1;
  absl::StatusOr<LoadedTrace> whole = LoadTraceBytes(kFuzzName, bytes);

  // The same bytes in pieces.
  chunk = std::max<std::size_t>(chunk, 1);
  TraceParser parser{std::string(kFuzzName)};
  TraceLoader loader;
  auto sink = [&loader](const TraceEvent& event, std::uint64_t line) {
    return loader.Add(event, line);
  };
  absl::Status pieces;
  for (std::size_t i = 0; i < bytes.size() && pieces.ok(); i += chunk) {
    pieces = parser.Feed(bytes.substr(i, chunk), sink);
  }
  if (pieces.ok()) pieces = parser.Finish(sink);
  if (pieces.ToString() != whole.status().ToString()) {
    return "chunked parse differs: '" + pieces.ToString() + "' vs '" + whole.status().ToString() +
           "'";
  }

  if (!whole.ok()) return CheckLocatedError(whole.status(), lines);
  LoadedTrace pieces_trace = loader.Finish(std::string(kFuzzName), parser.lines());
  if (pieces_trace.ops.size() != whole->ops.size() ||
      pieces_trace.peak_live_bytes != whole->peak_live_bytes) {
    return "chunked parse loaded a different trace";
  }
  if (whole->ops.size() != whole->alloc_events + whole->free_events) return "ops miscounted";
  if (!replay) return "";

  absl::StatusOr<ReplayResult> result = ReplayTrace(*whole, "");
  if (!result.ok()) return "replay failed: " + result.status().ToString();
  // The pool's requested bytes are the trace's live bytes: its peak must match exactly.
  if (result->failed_allocs == 0 && result->stats.peak_requested_bytes != whole->peak_live_bytes) {
    return "pool peak_requested_bytes " + std::to_string(result->stats.peak_requested_bytes) +
           " != trace peak live " + std::to_string(whole->peak_live_bytes);
  }
  if (result->fragmentation_at_peak < 0 || result->fragmentation_at_peak > 1) {
    return "fragmentation outside 0..1";
  }
  return "";
}

}  // namespace vramscope::cli::testing
