// Internal knobs of the caching pool, for tests and measurements (not part of the public API).
#pragma once

#include <cstddef>
#include <memory>

#include "vramscope/pool/pool.h"

namespace vramscope::pool::internal {

enum class Layout { kVmm, kSegments };

struct Tuning {
  // --- Virtual-memory layout ---
  // Soft cap on mapped bytes, with peak = max(peak allocated, allocated + request [+ pending]):
  // a growth that would take mapped + new past peak * (1 + vmm_ceiling_slack) first unmaps free
  // granules until mapped + new <= peak * (1 + vmm_slack); one below that ceiling maps without
  // unmapping. Shares of the pool, so that small pools keep the ratio too; each slack is at least
  // vmm_min_slack_granules granules (which matters below 50 MB only).
  double vmm_slack = 0.04;
  double vmm_ceiling_slack = 0.045;
  std::size_t vmm_min_slack_granules = 1;
  // When mapping, map this share of the allocated bytes beyond the need, within
  // peak * (1 + vmm_slack) counted without pending bytes (mapping ahead bets on allocations).
  double vmm_map_ahead = 0.04;
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
