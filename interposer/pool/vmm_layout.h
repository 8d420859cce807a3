// The virtual-memory layout of the caching pool (the default): one reserved address range
// (twice the device, or Tuning::vmm_default_va_bytes when its size is unknown); physical granules
// are mapped on demand exactly where the best placement needs them, and free granules are
// unmapped lazily (a soft cap on mapped bytes relative to the peak allocated, ReleaseIdle,
// out-of-memory). An upstream that cannot unmap part of one Map gets whole Map chunks back only.
//
// Implements the layout interface of caching_pool.h for CachingPool<VmmLayout>; the hot-path
// hooks (HeapFor, Unreleasable and the granule maths under it) are inline here.
// Thread safety: none of its own; the core calls it with its mutex held.
// Errors: UpstreamStatus from Grow; nothing throws.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "free_index.h"
#include "pool_internal.h"
#include "slot_pool.h"

namespace vramscope::pool::internal {

template <typename L>
class CachingPool;

class VmmLayout {
 public:
  using Core = CachingPool<VmmLayout>;
  static constexpr std::string_view kName = "vmm";
  // Free granules go back one by one, whatever else their range holds.
  static constexpr bool kBusyPinsRegion = false;

  // `upstream->MapGranularity()` is a power of two (MakeCachingPool checks).
  VmmLayout(Upstream* upstream, std::size_t capacity, const Tuning& tuning, SlotPool* nodes);

  // Heap 1, or heap 0 for small requests when they get an address range of their own.
  std::uint8_t HeapFor(std::size_t rounded) const {
    return separate_small_ && rounded <= small_max_bytes_ ? 0 : 1;
  }

  // A free block's bytes outside the granules (or Map chunks) that unmapping it would give back.
  std::size_t Unreleasable(const Block* b) const { return b->size - InteriorBytes(b); }

  std::size_t LargestRequest(std::uint8_t /*heap*/, std::size_t run) const { return run; }

  // The mapped granules that hold the block.
  void Segment(const Region* region, const Block* b, BlockInfo* info) const;

  // Maps granules for `rounded` bytes where the fewest new ones serve it (mapping ahead unless
  // `retry`, the second attempt after an upstream OOM).
  UpstreamStatus Grow(Core& core, std::size_t rounded, bool retry, Block** block,
                      std::uintptr_t* position) {
    return GrowMapped(core, rounded, /*map_ahead=*/!retry, block, position);
  }
  // Unmaps free granules until `want` bytes are gone (all of them for the maximum).
  std::size_t Release(Core& core, std::size_t want) {
    return UnmapFreeGranules(core, want, nullptr);
  }
  void GiveBack(Core& core);

 private:
  struct Placement {
    Block* hole = nullptr;  // the unmapped block to map part of
    std::uintptr_t position = 0;
    std::uintptr_t map_start = 0;
    std::uintptr_t map_end = 0;
    std::size_t run = 0;
  };

  bool EnsureAddressSpace(Core& core, std::uint8_t heap);
  bool PlaceMapped(std::size_t rounded, std::uint8_t heap, Placement* best) const;
  std::size_t SoftCap(const Core& core, std::size_t rounded, double slack,
                      bool count_pending) const;
  bool PlaceUnderCap(Core& core, std::size_t rounded, std::uint8_t heap, std::size_t budget,
                     Placement* place);
  std::size_t MapAhead(const Core& core, std::size_t rounded, std::size_t cost,
                       Placement* place) const;
  UpstreamStatus GrowMapped(Core& core, std::size_t rounded, bool map_ahead, Block** block,
                            std::uintptr_t* position);
  std::size_t UnmapFreeGranules(Core& core, std::size_t want, const Placement* keep);
  std::size_t UnmapInterior(Core& core, Block* b);
  void MarkMapped(Region* region, std::uintptr_t start, std::uintptr_t end) const;

  // What unmapping a free block could give back: the whole granules inside it, or, when the
  // upstream unmaps whole Maps only, the whole Map chunks inside it (a chunk that is partly
  // live then stays).
  std::size_t InteriorBytes(const Block* b) const {
    if (b->size < granularity_) return 0;
    std::uintptr_t start = 0;
    std::uintptr_t end = 0;
    return ReleasableRange(b, &start, &end) ? end - start : 0;
  }

  bool ReleasableRange(const Block* b, std::uintptr_t* start, std::uintptr_t* end) const {
    const Region* region = b->region;
    const std::uintptr_t base = region->base;
    // Granule indices by shift: this runs on every free-block update of the hot path, where a
    // 64-bit division per bound would cost more than the rest of the update.
    const std::size_t first = (b->addr - base + granularity_ - 1) >> granule_shift_;
    const std::size_t last = (b->addr + b->size - base) >> granule_shift_;
    if (last <= first) return false;
    if (partial_unmap_) {
      *start = base + first * granularity_;
      *end = base + last * granularity_;
      return true;
    }
    const std::size_t from = NextEdge(region->edges, first, last);
    if (from >= last) return false;
    const std::size_t to = PrevEdge(region->edges, last, from);
    if (to <= from) return false;
    *start = base + from * granularity_;
    *end = base + to * granularity_;
    return true;
  }

  // First edge in [from, limit], or limit + 1 if none.
  static std::size_t NextEdge(const std::uint64_t* edges, std::size_t from, std::size_t limit) {
    std::size_t word = from / 64;
    std::uint64_t bits = edges[word] & (~std::uint64_t{0} << (from % 64));
    while (bits == 0) {
      if (++word > limit / 64) return limit + 1;
      bits = edges[word];
    }
    const std::size_t k = word * 64 + static_cast<std::size_t>(std::countr_zero(bits));
    return k <= limit ? k : limit + 1;
  }

  // Last edge in [limit, from], or limit if none (limit itself is known to be an edge).
  static std::size_t PrevEdge(const std::uint64_t* edges, std::size_t from, std::size_t limit) {
    std::size_t word = from / 64;
    const unsigned shift = 63 - static_cast<unsigned>(from % 64);
    std::uint64_t bits = (edges[word] << shift) >> shift;
    while (bits == 0) {
      if (word == 0 || --word < limit / 64) return limit;
      bits = edges[word];
    }
    const std::size_t k = word * 64 + 63 - static_cast<std::size_t>(std::countl_zero(bits));
    return k >= limit ? k : limit;
  }

  const std::size_t granularity_;
  const bool partial_unmap_;  // the upstream unmaps any granules, not only whole Maps
  // Asked for each Map's piece size (Upstream::MapPieceBytes): the pieces are chunks of their own
  // in the edge bitmap.
  const Upstream* const upstream_;
  const unsigned granule_shift_;  // granularity_ is a power of two
  const bool separate_small_;     // Tuning::vmm_separate_small
  const std::size_t small_max_bytes_;
  std::size_t va_bytes_ = 0;
  Region* va_[2] = {nullptr, nullptr};  // one reserved range per heap
  BlockSet unmapped_[2];                // unmapped holes by (size, address)
};

}  // namespace vramscope::pool::internal
