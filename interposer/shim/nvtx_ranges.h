// The per-thread NVTX range stacks (nvtx.cc fills them from the NVTX callbacks): one
// thread_local array of kMaxDepth entries, every domain together; deeper pushes are counted, not
// stored. InnermostRange() is what the ALLOC records carry (origin.h). Kept below the ring's
// records, apart from the NVTX entry points at the top of the shim, which initialise the shim.
//
// Thread safety: each thread reads and writes only its own stack; g_any_range is a relaxed
// flag (once any range was pushed). Nothing here fails.
#pragma once

#include <atomic>
#include <cstdint>

namespace vramscope::interposer {

namespace nvtx_internal {

inline constexpr int kMaxDepth = 64;

struct ThreadStack {
  int depth;
  int overflow;  // pushes beyond kMaxDepth not on the stack
  std::uint32_t ids[kMaxDepth];
  std::uint16_t domains[kMaxDepth];
};
extern constinit thread_local ThreadStack t_stack;
// Set once any range was pushed: lets the allocation path skip the thread_local access.
extern constinit std::atomic<bool> g_any_range;
std::uint32_t InnermostRangeSlow();

}  // namespace nvtx_internal

// The calling thread's innermost open NVTX range id (push/pop ranges of any domain), 0 if none.
inline std::uint32_t InnermostRange() {
  if (!nvtx_internal::g_any_range.load(std::memory_order_relaxed)) return 0;
  return nvtx_internal::InnermostRangeSlow();
}

}  // namespace vramscope::interposer
