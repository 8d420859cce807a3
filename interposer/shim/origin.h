// The caller's origin an ALLOC record carries: the thread's innermost NVTX range
// (nvtx_ranges.h) and, with VRAMSCOPE_STACKS=1, the allocation site (stacks.h).
//
// Thread safety: any thread; reads the calling thread's own range stack and stack. Never fails
// (0 where there is no range or no site).
#pragma once

#include <cstdint>

#include "ring_events.h"

namespace vramscope::interposer {

// What an ALLOC record carries about its caller (RingCallerOrigin unwinds the calling thread
// when stacks are on).
struct RingAllocOrigin {
  std::uint32_t nvtx_range = 0;
  std::uint64_t site = 0;
};
RingAllocOrigin RingCallerOrigin(RingWriter* ring);

}  // namespace vramscope::interposer
