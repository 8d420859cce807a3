// Conversion of one ring record (vramscope/ring.h) into a vramscope.v1.Event.
//
// Pure functions, no state: the reader assembles NVTX text from the TEXT records that follow a
// push and passes it in. Error convention: InvalidArgument for a record no writer produces
// (unknown kind, enum value out of range, inconsistent lengths); `event` is then unspecified.
#pragma once

#include <absl/status/status.h>

#include <string>
#include <string_view>

#include "vramscope/ring.h"
#include "vramscope/v1/events.pb.h"

namespace vramscope::agent {

// `nvtx_text` is name + domain for NVTX_PUSH (ignored otherwise). PROCESS_EXIT yields a
// ProcessExit with killed = false. TEXT records are not events: InvalidArgument.
absl::Status DecodeRecord(const vramscope_ring_record& record, std::string_view nvtx_text,
                          v1::Event* event);

// `bytes` with every byte that does not belong to a well-formed UTF-8 sequence replaced by '?'
// (same length). Text from the ring (NVTX names, the command line, host and device names) goes
// into proto3 strings, and a message holding invalid UTF-8 does not parse: one stray byte in a
// program's argv would make the collector refuse every batch of the process.
std::string ValidUtf8(std::string_view bytes);

}  // namespace vramscope::agent
