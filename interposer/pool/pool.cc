// Policy names, status names and the factory.
#include "vramscope/pool/pool.h"

#include "pool_internal.h"

namespace vramscope::pool {

const char* PoolStatusName(PoolStatus status) {
  switch (status) {
    case PoolStatus::kOk:
      return "ok";
    case PoolStatus::kOutOfMemory:
      return "out_of_memory";
    case PoolStatus::kInvalidAddress:
      return "invalid_address";
    case PoolStatus::kInvalidArgument:
      return "invalid_argument";
    case PoolStatus::kUpstreamError:
      return "upstream_error";
  }
  return "unknown";
}

std::string_view PolicyNames() { return "vmm,segments"; }

std::unique_ptr<Pool> MakePool(Upstream* upstream, FenceTracker* fences,
                               const PoolOptions& options) {
  internal::Layout layout;
  if (options.policy.empty() || options.policy == "vmm") {
    layout = internal::Layout::kVmm;  // falls back to segments without VMM support
  } else if (options.policy == "segments") {
    layout = internal::Layout::kSegments;
  } else {
    return nullptr;
  }
  internal::Tuning tuning;
  if (!options.quick_reuse) tuning.quick_depth = 0;
  tuning.vmm_cap_counts_pending = options.cap_counts_pending;
  return internal::MakeCachingPool(upstream, fences, options, layout, tuning);
}

}  // namespace vramscope::pool
