// Parser for recorded allocation traces (traces/README.md): CSV with the header
// `action,addr,size,stream,time_us,site`, one event per line.
//
// The parser works on bytes pushed to it in chunks of any size (a decompressor's output, a fuzzer's
// input, a test string), so it never needs the whole file in memory and never reads past what it
// was given. It checks syntax only: the header, the action name, the four numbers, the size
// range. Whether frees pair with allocations is the loader's job (trace_loader.h).
//
// Lines end in LF or CRLF; blank lines are skipped; the site column is the rest of the line after
// the fifth comma, so a site may itself contain commas. A UTF-8 byte order mark before the header
// is accepted.
//
// Thread safety: a TraceParser is not thread-safe; use one per thread.
// Errors: absl::Status. Every error message starts with `NAME:LINE: ` (the source name given to
// the constructor and the 1-based line number), including errors returned by the sink, which
// should therefore not add a location themselves.
#pragma once

#include <absl/functional/function_ref.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace vramscope::cli {

inline constexpr std::string_view kTraceHeader = "action,addr,size,stream,time_us,site";

// Sizes above this are rejected as corrupt (256 TiB: no device has that much memory).
inline constexpr std::uint64_t kMaxTraceSize = std::uint64_t{1} << 48;
// A line longer than this is rejected as corrupt (real lines are under 200 bytes).
inline constexpr std::size_t kMaxTraceLineBytes = std::size_t{64} * 1024;

enum class TraceAction : std::uint8_t {
  kAlloc,          // the application allocates: replayed
  kFreeRequested,  // the application frees: replayed
  kFreeCompleted,  // PyTorch returned the block to its own cache: reference only
  kSegmentAlloc,   // PyTorch's own cudaMalloc of a segment: reference only
  kSegmentFree,    // PyTorch's own cudaFree of a segment: reference only
};

std::string_view TraceActionName(TraceAction action);

struct TraceEvent {
  TraceAction action = TraceAction::kAlloc;
  std::uint64_t addr = 0;
  std::uint64_t size = 0;  // 1 .. kMaxTraceSize for alloc and free_requested
  std::uint64_t stream = 0;
  std::uint64_t time_us = 0;
  std::string_view site;  // points into the parser's buffer: valid only during the sink call
};

// Parses one data line (no line terminator; a trailing CR is tolerated). Errors carry no location.
absl::StatusOr<TraceEvent> ParseTraceLine(std::string_view line);

class TraceParser {
 public:
  // Called once per event with its 1-based line number. A non-OK status stops parsing; the parser
  // returns it with `NAME:LINE: ` prepended and the same code.
  using Sink = absl::FunctionRef<absl::Status(const TraceEvent& event, std::uint64_t line)>;

  explicit TraceParser(std::string source_name) : source_name_(std::move(source_name)) {}

  // Parses every complete line in `bytes` (plus what earlier calls left unfinished). After an
  // error the parser stays failed and returns the same error.
  absl::Status Feed(std::string_view bytes, Sink sink);
  // Parses the last line if it had no terminator, and fails on an input with no header.
  absl::Status Finish(Sink sink);

  // Lines seen so far (complete ones, header and blank lines included).
  std::uint64_t lines() const { return line_; }
  const std::string& source_name() const { return source_name_; }

 private:
  absl::Status ParseLine(std::string_view line, Sink sink);
  absl::Status Fail(absl::StatusCode code, std::string_view message);

  std::string source_name_;
  std::string partial_;  // an unterminated line carried over to the next Feed
  std::uint64_t line_ = 0;
  bool header_seen_ = false;
  absl::Status status_;
};

// Convenience: the whole input at once (tests, fuzzing).
absl::Status ParseTrace(std::string_view source_name, std::string_view bytes,
                        TraceParser::Sink sink);

}  // namespace vramscope::cli
