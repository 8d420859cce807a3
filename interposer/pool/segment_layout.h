// The segments layout of the caching pool (PyTorch-like; the fallback without virtual memory):
// requests up to Tuning::small_max_bytes are packed into small segments, larger ones into large
// segments or, above large_exact_above_bytes, exact segment_round_bytes-rounded ones; a segment
// with no busy block goes back whole.
//
// Implements the layout interface of caching_pool.h for CachingPool<SegmentLayout>.
// Thread safety: none of its own; the core calls it with its mutex held.
// Errors: UpstreamStatus from Grow; nothing throws.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "free_index.h"
#include "pool_internal.h"
#include "slot_pool.h"

namespace vramscope::pool::internal {

template <typename L>
class CachingPool;

class SegmentLayout {
 public:
  using Core = CachingPool<SegmentLayout>;
  static constexpr std::string_view kName = "segments";
  // A segment goes back only when no block in it is busy: until then all its free bytes stay.
  static constexpr bool kBusyPinsRegion = true;

  SegmentLayout(Upstream* /*upstream*/, std::size_t /*capacity*/, const Tuning& tuning,
                SlotPool* /*nodes*/)
      : small_max_bytes_(tuning.small_max_bytes) {}

  // Heap 0: small requests (small segments); heap 1: the rest.
  std::uint8_t HeapFor(std::size_t rounded) const { return rounded <= small_max_bytes_ ? 0 : 1; }

  std::size_t Unreleasable(const Block* b) const {
    return b->region->busy_blocks != 0 ? b->size : 0;
  }

  // Small segments serve small requests only.
  std::size_t LargestRequest(std::uint8_t heap, std::size_t run) const {
    return heap == 0 ? std::min(run, small_max_bytes_) : run;
  }

  void Segment(const Region* region, const Block* /*b*/, BlockInfo* info) const {
    info->segment_base = region->base;
    info->segment_size = region->size;
  }

  // One new segment holding a free block for `rounded` bytes (`retry` changes nothing here).
  UpstreamStatus Grow(Core& core, std::size_t rounded, bool retry, Block** block,
                      std::uintptr_t* position);
  // Every segment with no busy block, back to the upstream (`want` changes nothing here).
  std::size_t Release(Core& core, std::size_t want);
  void GiveBack(Core& core);

 private:
  const std::size_t small_max_bytes_;
};

}  // namespace vramscope::pool::internal
