#include "origin.h"

#include "nvtx_ranges.h"
#include "stacks.h"

namespace vramscope::interposer {

RingAllocOrigin RingCallerOrigin(RingWriter* ring) {
  RingAllocOrigin origin;
  origin.nvtx_range = InnermostRange();
  origin.site = CaptureSite(ring);
  return origin;
}

}  // namespace vramscope::interposer
