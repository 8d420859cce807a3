// Internal knobs of the caching pool, for tests and measurements (not part of the public API).
#pragma once

#include <cstddef>
#include <memory>

#include "vramscope/pool/pool.h"

namespace vramscope::pool::internal {

enum class Layout { kVmm, kSegments };

struct Tuning {
  // --- Virtual-memory layout ---
  // Soft cap on mapped bytes: before mapping more, free granules are unmapped until
  // mapped + new <= peak_allocated * (1 + vmm_slack) + vmm_slack_granules * granularity.
  double vmm_slack = 0.03;
  std::size_t vmm_slack_granules = 2;
  // When mapping, map this share of the allocated bytes beyond the need (within the soft cap).
  double vmm_map_ahead = 0.03;
  // The soft cap counts pending bytes (freed, fence not complete) as in use.
  bool vmm_cap_counts_pending = true;
  // Requests up to small_max_bytes get a reserved range of their own (measured: more upstream
  // calls on the traces for no better ratio, so off).
  bool vmm_separate_small = false;
  // Address space reserved when neither the options nor the upstream say how big the device is.
  std::size_t vmm_default_va_bytes = std::size_t{1} << 40;
  // --- Segment layout (PyTorch's constants) ---
  std::size_t small_max_bytes = std::size_t{1} << 20;
  std::size_t small_segment_bytes = std::size_t{2} << 20;
  std::size_t large_segment_bytes = std::size_t{20} << 20;
  std::size_t large_exact_above_bytes = std::size_t{10} << 20;
  std::size_t segment_round_bytes = std::size_t{2} << 20;
  // --- Fences ---
  std::size_t poll_fences_per_allocate = 4;  // IsComplete calls per Allocate, oldest first
  std::size_t poll_blocks_per_allocate = 64;
  // --- Quick bins (fenced frees) ---
  // Blocks held unmerged in the bin of one size; 0 turns the bins off.
  std::uint32_t quick_depth = 4096;
};

// A CachingPool<VmmLayout> (kVmm, when the upstream's MapGranularity() is a power of two) or a
// CachingPool<SegmentLayout>; nullptr without an upstream or fence tracker.
std::unique_ptr<Pool> MakeCachingPool(Upstream* upstream, FenceTracker* fences,
                                      const PoolOptions& options, Layout layout,
                                      const Tuning& tuning);

}  // namespace vramscope::pool::internal
