// Conversion of one ring record (vramscope/ring.h) into a vramscope.v1.Event.
//
// Pure functions, no state: the reader assembles NVTX text from the TEXT records that follow a
// push and passes it in. Error convention: InvalidArgument for a record no writer produces
// (unknown kind, enum value out of range, inconsistent lengths); `event` is then unspecified.
#pragma once

#include <absl/status/status.h>

#include <string_view>

#include "vramscope/ring.h"
#include "vramscope/v1/events.pb.h"

namespace vramscope::agent {

// `nvtx_text` is name + domain for NVTX_PUSH (ignored otherwise). PROCESS_EXIT yields a
// ProcessExit with killed = false. TEXT records are not events: InvalidArgument.
absl::Status DecodeRecord(const vramscope_ring_record& record, std::string_view nvtx_text,
                          v1::Event* event);

}  // namespace vramscope::agent
