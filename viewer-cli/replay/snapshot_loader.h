// Loads a PyTorch memory snapshot (the pickle `torch.cuda.memory._dump_snapshot` writes, or
// `vramscope export --format torch-snapshot`) as a replayable trace: one device's
// `device_traces` entries become trace events (alloc, free_requested, free_completed,
// segment_alloc, segment_free; oom, snapshot, segment_map and segment_unmap entries are counted
// as skipped) and go through the same TraceLoader checks as a CSV trace.
//
// PyTorch keeps its history in a ring buffer (`max_entries`), so a snapshot's trace often begins
// after allocations it later frees: such frees (of an address never allocated within the trace)
// are skipped and counted in `frees_before_history`, not errors. Everything else the loader
// rejects in a CSV trace is an error here too.
//
// The pickle is read by vramscope/pickle/pickle_reader.h, which refuses anything but plain
// data (GLOBAL, REDUCE, ...): a hostile file is an error, never code run.
//
// Thread safety: functions of their input. Errors: absl::Status whose message starts with NAME.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "replay/trace_loader.h"

namespace vramscope::cli {

// True when `head` (the file's first bytes) starts like a pickle of protocol 2 or later.
bool LooksLikePickle(std::string_view head);

struct SnapshotLoadInfo {
  std::uint32_t device = 0;   // the device whose trace was loaded
  std::uint32_t devices = 0;  // device traces in the file
  std::uint64_t frees_before_history = 0;
};

// `device`: the device trace to load; by default the first one with an alloc.
absl::StatusOr<LoadedTrace> LoadSnapshotBytes(std::string_view name, std::string_view bytes,
                                              std::optional<std::uint32_t> device,
                                              SnapshotLoadInfo* info = nullptr);

// A CSV trace (plain or gzip) or a snapshot pickle, told apart by the first bytes.
absl::StatusOr<LoadedTrace> LoadAnyTrace(const std::string& path,
                                         std::optional<std::uint32_t> device,
                                         const LoadProgress& progress,
                                         SnapshotLoadInfo* info = nullptr);

}  // namespace vramscope::cli
