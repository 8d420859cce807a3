#include "nvtx_ranges.h"

namespace vramscope::interposer::nvtx_internal {

constinit std::atomic<bool> g_any_range{false};
constinit thread_local ThreadStack t_stack = {};

std::uint32_t InnermostRangeSlow() {
  const ThreadStack& stack = t_stack;
  return stack.depth > 0 ? stack.ids[stack.depth - 1] : 0;
}

}  // namespace vramscope::interposer::nvtx_internal
