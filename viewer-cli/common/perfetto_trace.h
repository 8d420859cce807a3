// PerfettoTrace: a run's recorded events as a Perfetto protobuf trace (perfetto.protos.Trace,
// proto/perfetto/trace.proto) for ui.perfetto.dev and trace_processor:
//
//   process track per traced pid (ProcessDescriptor: pid, command line)
//     "cuda:N requested" / "cuda:N allocated" / "cuda:N reserved": counter tracks (bytes), a
//         value at every event that changes them (exact, not downsampled);
//     "cuda:N allocations": a parent track whose child tracks ("cuda:N lane K") hold one slice
//         per allocation, from its alloc to its free (or the end of the process), named by its
//         size, with debug annotations size/requested/address/stream/kind/nvtx range and the
//         allocation's stack as an interned callstack (callstack_iid); an allocation goes to the
//         lowest lane free at its alloc, so slices on one track never overlap;
//     OOMs as instants on the allocations track;
//   thread track per (pid, tid) that pushed NVTX ranges, the ranges as slices.
// Callstacks: frames interned once per trace (InternedData function_names, source_paths,
// mapping_paths, mappings, frames, callstacks); `function (file:line)` frames carry their
// function, file and line; `PATH+0xOFFSET` frames a mapping named PATH and rel_pc OFFSET.
// Timestamps are the events' CLOCK_MONOTONIC nanoseconds on the default trace clock; all packets
// are on one sequence (trusted_packet_sequence_id 1).
//
// Thread safety: none (a function of its input). Errors: none.
#pragma once

#include <string>
#include <vector>

#include "common/recorded_events.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {

// `reports` may be empty; when one has the same pid, its command line names the process.
std::string PerfettoTrace(const RecordedEvents& events, const std::vector<v1::Report>& reports);

}  // namespace vramscope::cli
