// TorchSnapshot: one process's recorded events as a PyTorch memory snapshot, the pickle
// `torch.cuda.memory._dump_snapshot` writes and https://pytorch.org/memory_viz opens:
//
//   {'segments': [Segment, ...], 'device_traces': [[TraceEntry, ...] per device ordinal]}
//
// TraceEntry: {'action', 'addr', 'size', 'stream', 'time_us', 'frames'}, actions
//   segment_map / segment_unmap   pool memory mapped from the driver and given back (stream 0;
//                                 a release may cover part of a mapping or several: memory_viz
//                                 joins adjacent mapped memory and splits it, as for PyTorch's
//                                 expandable segments);
//   segment_alloc / segment_free  the memory of an allocation the pool did not serve
//                                 (passthrough, stream-ordered, pitched, managed...), which is
//                                 its own segment;
//   alloc                         size = the bytes the block occupies (after the pool's rounding);
//   free_requested, free_completed both at the free (the pool reuses a block once its fence
//                                 passes; the event stream has no completion time);
//   oom                           size = the request, 'device_free' = the free bytes then.
// Frames: the allocation's stack, innermost first, from the run's site definitions
// (`function (file:line)` gives {'name', 'filename', 'line'}; an unsymbolised `PATH+0xOFFSET`
// gives filename PATH, line 0), then the innermost NVTX range open on the thread as one more
// frame with filename `<nvtx>`. Segment: the state at the end of the run: live pool memory
// (adjacent mappings of a device joined: a VMM pool maps pieces and a block may span several;
// 'is_expandable' true, stream 0) with its live blocks ('active_allocated') and the gaps between
// ('inactive'), and the allocations that are their own segments.
// Pinned host allocations and IPC imports (another process's memory) are left out, as the stats
// engine counts.
//
// Thread safety: none (a function of its input). Errors: none; unknown frees are skipped.
#pragma once

#include <cstdint>
#include <string>

#include "common/recorded_events.h"

namespace vramscope::cli {

struct TorchSnapshotStats {
  std::uint64_t allocs = 0;
  std::uint64_t frees = 0;
  std::uint64_t segments_at_end = 0;
  std::uint32_t devices = 0;
};

std::string TorchSnapshot(const ProcessEvents& process, TorchSnapshotStats* stats = nullptr);

}  // namespace vramscope::cli
