#include "replay/trace_parser.h"

#include <absl/strings/escaping.h>
#include <absl/strings/str_format.h>

#include <array>
#include <charconv>
#include <system_error>

namespace vramscope::cli {
namespace {

constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";

// Quotes a field from untrusted input for an error message: escaped, and cut to a readable length.
std::string Quote(std::string_view field) {
  constexpr std::size_t kMaxShown = 40;
  const std::string_view cut = field.substr(0, kMaxShown);
  std::string shown = absl::CHexEscape(absl::string_view(cut.data(), cut.size()));
  return absl::StrFormat("'%s%s", shown, field.size() > kMaxShown ? "'..." : "'");
}

absl::StatusOr<TraceAction> ParseAction(std::string_view name) {
  // Ordered by frequency in real traces.
  static constexpr std::array<std::pair<std::string_view, TraceAction>, 5> kActions = {{
      {"alloc", TraceAction::kAlloc},
      {"free_requested", TraceAction::kFreeRequested},
      {"free_completed", TraceAction::kFreeCompleted},
      {"segment_alloc", TraceAction::kSegmentAlloc},
      {"segment_free", TraceAction::kSegmentFree},
  }};
  for (const auto& [action_name, action] : kActions) {
    if (name == action_name) return action;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown action %s (expected alloc, free_requested, free_completed, segment_alloc or "
      "segment_free)",
      Quote(name)));
}

// Unsigned decimal, digits only: no sign, no spaces, no hex, no exponent.
absl::StatusOr<std::uint64_t> ParseNumber(std::string_view column, std::string_view field) {
  if (field.empty()) return absl::InvalidArgumentError(absl::StrFormat("empty %s", column));
  std::uint64_t value = 0;
  const char* end = field.data() + field.size();
  auto [ptr, ec] = std::from_chars(field.data(), end, value);
  if (ec == std::errc::result_out_of_range) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s %s out of range (more than 64 bits)", column, Quote(field)));
  }
  // from_chars accepts a leading '-' for unsigned types; a digit must come first.
  if (ec != std::errc() || ptr != end || field.front() < '0' || field.front() > '9') {
    return absl::InvalidArgumentError(
        absl::StrFormat("malformed %s %s (expected a decimal integer)", column, Quote(field)));
  }
  return value;
}

}  // namespace

std::string_view TraceActionName(TraceAction action) {
  switch (action) {
    case TraceAction::kAlloc:
      return "alloc";
    case TraceAction::kFreeRequested:
      return "free_requested";
    case TraceAction::kFreeCompleted:
      return "free_completed";
    case TraceAction::kSegmentAlloc:
      return "segment_alloc";
    case TraceAction::kSegmentFree:
      return "segment_free";
  }
  return "?";
}

absl::StatusOr<TraceEvent> ParseTraceLine(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  // Five separators; the site is whatever follows the fifth.
  std::array<std::string_view, 5> fields;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    std::size_t comma = line.find(',');
    if (comma == std::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "expected 6 comma-separated columns (%s), found %d", kTraceHeader, i + 1));
    }
    fields[i] = line.substr(0, comma);
    line.remove_prefix(comma + 1);
  }
  TraceEvent event;
  auto action = ParseAction(fields[0]);
  if (!action.ok()) return action.status();
  event.action = *action;
  auto addr = ParseNumber("addr", fields[1]);
  if (!addr.ok()) return addr.status();
  auto size = ParseNumber("size", fields[2]);
  if (!size.ok()) return size.status();
  auto stream = ParseNumber("stream", fields[3]);
  if (!stream.ok()) return stream.status();
  auto time_us = ParseNumber("time_us", fields[4]);
  if (!time_us.ok()) return time_us.status();
  event.addr = *addr;
  event.size = *size;
  event.stream = *stream;
  event.time_us = *time_us;
  event.site = line;
  if (event.action == TraceAction::kAlloc || event.action == TraceAction::kFreeRequested) {
    if (event.size == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s of size 0 (applications never allocate 0 bytes: the trace is corrupt)",
          TraceActionName(event.action)));
    }
    if (event.size > kMaxTraceSize) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s of size %d is larger than 2^48 bytes (the trace is corrupt)",
                          TraceActionName(event.action), event.size));
    }
  }
  return event;
}

absl::Status TraceParser::Fail(absl::StatusCode code, std::string_view message) {
  status_ = absl::Status(code, absl::StrFormat("%s:%d: %s", source_name_, line_, message));
  return status_;
}

absl::Status TraceParser::ParseLine(std::string_view line, Sink sink) {
  ++line_;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (!header_seen_) {
    if (line_ == 1 && line.substr(0, kUtf8Bom.size()) == kUtf8Bom) {
      line.remove_prefix(kUtf8Bom.size());
    }
    if (line != kTraceHeader) {
      return Fail(absl::StatusCode::kInvalidArgument,
                  absl::StrFormat("expected the header '%s', found %s (is this a vramscope/PyTorch "
                                  "allocation trace?)",
                                  kTraceHeader, Quote(line)));
    }
    header_seen_ = true;
    return absl::OkStatus();
  }
  if (line.empty()) return absl::OkStatus();
  absl::StatusOr<TraceEvent> event = ParseTraceLine(line);
  if (!event.ok()) return Fail(event.status().code(), std::string(event.status().message()));
  absl::Status sunk = sink(*event, line_);
  if (!sunk.ok()) return Fail(sunk.code(), std::string(sunk.message()));
  return absl::OkStatus();
}

absl::Status TraceParser::Feed(std::string_view bytes, Sink sink) {
  if (!status_.ok()) return status_;
  while (!bytes.empty()) {
    std::size_t newline = bytes.find('\n');
    std::string_view piece = bytes.substr(0, newline);
    // Bounded memory whatever the input: a binary file may have no newline at all.
    if (partial_.size() + piece.size() > kMaxTraceLineBytes) {
      ++line_;
      return Fail(
          absl::StatusCode::kInvalidArgument,
          absl::StrFormat("line longer than %d bytes (is this a text file?)", kMaxTraceLineBytes));
    }
    if (newline == std::string_view::npos) {
      partial_.append(piece);
      return absl::OkStatus();
    }
    bytes.remove_prefix(newline + 1);
    absl::Status status;
    if (partial_.empty()) {
      status = ParseLine(piece, sink);
    } else {
      partial_.append(piece);
      status = ParseLine(partial_, sink);
      partial_.clear();
    }
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status TraceParser::Finish(Sink sink) {
  if (!status_.ok()) return status_;
  if (!partial_.empty()) {
    std::string last = std::move(partial_);
    partial_.clear();
    absl::Status status = ParseLine(last, sink);
    if (!status.ok()) return status;
  }
  if (!header_seen_) {
    if (line_ == 0) line_ = 1;  // an empty file: point at its (missing) first line
    return Fail(absl::StatusCode::kInvalidArgument,
                absl::StrFormat("empty trace: expected the header '%s'", kTraceHeader));
  }
  return absl::OkStatus();
}

absl::Status ParseTrace(std::string_view source_name, std::string_view bytes,
                        TraceParser::Sink sink) {
  TraceParser parser{std::string(source_name)};
  absl::Status status = parser.Feed(bytes, sink);
  if (!status.ok()) return status;
  return parser.Finish(sink);
}

}  // namespace vramscope::cli
