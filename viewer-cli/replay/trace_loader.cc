#include "replay/trace_loader.h"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "replay/trace_file.h"

namespace vramscope::cli {

absl::Status TraceLoader::Add(const TraceEvent& event, std::uint64_t line) {
  switch (event.action) {
    case TraceAction::kAlloc: {
      if (next_slot_ == std::numeric_limits<std::uint32_t>::max()) {
        return absl::ResourceExhaustedError("more than 2^32 - 1 allocations: not supported");
      }
      auto [it, inserted] = live_.try_emplace(event.addr, Live{event.size, line, next_slot_});
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "alloc of address %d, which is still live (allocated on line %d and not freed)",
            event.addr, it->second.line));
      }
      if (live_bytes_ > std::numeric_limits<std::uint64_t>::max() - event.size) {
        live_.erase(it);
        return absl::InvalidArgumentError("live bytes exceed 2^64: the trace is corrupt");
      }
      trace_.ops.push_back(ReplayOp{event.size, next_slot_, /*is_free=*/false, event.time_us});
      ++next_slot_;
      ++trace_.alloc_events;
      live_bytes_ += event.size;
      trace_.peak_live_bytes = std::max(trace_.peak_live_bytes, live_bytes_);
      return absl::OkStatus();
    }
    case TraceAction::kFreeRequested: {
      auto it = live_.find(event.addr);
      if (it == live_.end()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "free_requested of address %d, which is not live (never allocated, or already freed)",
            event.addr));
      }
      if (it->second.size != event.size) {
        return absl::InvalidArgumentError(
            absl::StrFormat("free_requested of address %d with size %d, but it was allocated "
                            "with size %d on line %d",
                            event.addr, event.size, it->second.size, it->second.line));
      }
      trace_.ops.push_back(
          ReplayOp{it->second.size, it->second.slot, /*is_free=*/true, event.time_us});
      freed_[event.addr] = trace_.ops.size() - 1;
      ++trace_.free_events;
      live_bytes_ -= it->second.size;
      live_.erase(it);
      return absl::OkStatus();
    }
    case TraceAction::kFreeCompleted: {
      // Only a time for the fence models of the replay: checked as before, not replayed.
      if (auto it = freed_.find(event.addr); it != freed_.end()) {
        trace_.ops[it->second].completed_us = event.time_us;
        freed_.erase(it);
      }
      ++trace_.skipped_events;
      return absl::OkStatus();
    }
    case TraceAction::kSegmentAlloc:
    case TraceAction::kSegmentFree:
      ++trace_.skipped_events;
      return absl::OkStatus();
  }
  return absl::InternalError("unhandled trace action");
}

LoadedTrace TraceLoader::Finish(std::string name, std::uint64_t lines) {
  LoadedTrace trace = std::move(trace_);
  trace.name = std::move(name);
  trace.lines = lines;
  trace.live_at_end_bytes = live_bytes_;
  trace.live_at_end_count = live_.size();
  trace_ = LoadedTrace();
  live_.clear();
  live_bytes_ = 0;
  next_slot_ = 0;
  return trace;
}

absl::StatusOr<LoadedTrace> LoadTraceFile(const std::string& path, const LoadProgress& progress) {
  absl::StatusOr<std::unique_ptr<TraceFile>> file = TraceFile::Open(path);
  if (!file.ok()) return file.status();
  TraceParser parser(path);
  TraceLoader loader;
  auto sink = [&loader](const TraceEvent& event, std::uint64_t line) {
    return loader.Add(event, line);
  };
  while (true) {
    absl::StatusOr<std::string_view> chunk = (*file)->Next();
    if (!chunk.ok()) {
      // Say how far the readable part went: the lines before the damage were fine.
      return absl::Status(chunk.status().code(),
                          absl::StrFormat("%s (after line %d)",
                                          std::string(chunk.status().message()), parser.lines()));
    }
    if (chunk->empty()) break;
    absl::Status status = parser.Feed(*chunk, sink);
    if (!status.ok()) return status;
    if (progress && (*file)->file_size() > 0) {
      progress(static_cast<double>((*file)->file_bytes_read()) /
               static_cast<double>((*file)->file_size()));
    }
  }
  absl::Status status = parser.Finish(sink);
  if (!status.ok()) return status;
  return loader.Finish(path, parser.lines());
}

absl::StatusOr<LoadedTrace> LoadTraceBytes(std::string_view name, std::string_view bytes) {
  TraceParser parser{std::string(name)};
  TraceLoader loader;
  auto sink = [&loader](const TraceEvent& event, std::uint64_t line) {
    return loader.Add(event, line);
  };
  absl::Status status = parser.Feed(bytes, sink);
  if (status.ok()) status = parser.Finish(sink);
  if (!status.ok()) return status;
  return loader.Finish(std::string(name), parser.lines());
}

}  // namespace vramscope::cli
