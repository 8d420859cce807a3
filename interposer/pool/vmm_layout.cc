// The virtual-memory layout: reserving the range, placing and mapping granules under the soft
// cap, and unmapping free ones.
#include "vmm_layout.h"

#include <algorithm>
#include <bit>
#include <cstdlib>

#include "caching_pool.h"

namespace vramscope::pool::internal {

VmmLayout::VmmLayout(Upstream* upstream, std::size_t capacity, const Tuning& tuning,
                     SlotPool* nodes)
    : granularity_(upstream->MapGranularity()),
      partial_unmap_(upstream->UnmapsPartialMaps()),
      upstream_(upstream),
      granule_shift_(static_cast<unsigned>(std::countr_zero(granularity_))),
      separate_small_(tuning.vmm_separate_small),
      small_max_bytes_(tuning.small_max_bytes),
      unmapped_{BlockSet(BySizeAddr{}, SlotAllocator<Block*>(nodes)),
                BlockSet(BySizeAddr{}, SlotAllocator<Block*>(nodes))} {
  const std::size_t device = capacity != 0 ? capacity : upstream->TotalBytes();
  // Twice the device: address space is free, and best fit over it never runs out of room
  // before physical memory does.
  va_bytes_ = device != 0 ? RoundUp(device, granularity_) * 2
                          : RoundUp(tuning.vmm_default_va_bytes, granularity_);
}

void VmmLayout::Segment(const Region* region, const Block* b, BlockInfo* info) const {
  info->segment_base = RoundDown(b->addr - region->base, granularity_) + region->base;
  info->segment_size =
      RoundUp(b->addr + b->size - region->base, granularity_) + region->base - info->segment_base;
}

void VmmLayout::GiveBack(Core& core) {
  for (Region* va : va_) {
    if (va == nullptr) continue;
    Block* b = va->pages[0];
    while (b != nullptr) {
      if (b->state == BlockState::kUnmapped) {
        b = b->next;
        continue;
      }
      const std::uintptr_t start = b->addr;
      while (b != nullptr && b->state != BlockState::kUnmapped) b = b->next;
      const std::uintptr_t end = b != nullptr ? b->addr : va->base + va->size;
      (void)core.upstream_->Unmap(start, end - start);
    }
    (void)core.upstream_->ReleaseRange(va->base, va->size);
  }
}

// Small requests get an address range of their own when Tuning::vmm_separate_small says so (like
// PyTorch's small pool), so the small long-lived blocks cannot pin the large mapped chunks.
bool VmmLayout::EnsureAddressSpace(Core& core, std::uint8_t heap) {
  if (va_[heap] != nullptr) return true;
  Region* region = Core::NewRegion(va_bytes_, heap);
  if (region == nullptr) return false;
  region->edges = static_cast<std::uint64_t*>(
      std::calloc(va_bytes_ / granularity_ / 64 + 1, sizeof(std::uint64_t)));
  if (region->edges == nullptr) {
    Core::DeleteRegion(region);
    return false;
  }
  std::uintptr_t base = 0;
  ++core.stats_.upstream_grow_calls;
  if (core.upstream_->ReserveRange(va_bytes_, &base) != UpstreamStatus::kOk) {
    Core::DeleteRegion(region);
    return false;
  }
  if (base % granularity_ != 0) {
    ++core.stats_.upstream_shrink_calls;
    (void)core.upstream_->ReleaseRange(base, va_bytes_);
    Core::DeleteRegion(region);
    return false;
  }
  region->base = base;
  core.regions_.emplace(base, region);
  va_[heap] = region;
  Block* b = core.NewBlock();
  b->addr = base;
  b->size = va_bytes_;
  b->region = region;
  b->heap = heap;
  b->state = BlockState::kUnmapped;
  region->pages[0] = b;
  unmapped_[heap].insert(b);
  return true;
}

// Where to put `rounded` bytes so the fewest new granules are mapped: for every unmapped hole,
// the run it forms with its free mapped neighbours, placed against either end of the run.
// Holes only appear where granules were unmapped, so there are few of them.
bool VmmLayout::PlaceMapped(std::size_t rounded, std::uint8_t heap, Placement* best) const {
  bool found = false;
  const std::size_t g = granularity_;
  for (Block* hole : unmapped_[heap]) {
    Block* left =
        hole->prev != nullptr && hole->prev->state == BlockState::kFree ? hole->prev : nullptr;
    Block* right =
        hole->next != nullptr && hole->next->state == BlockState::kFree ? hole->next : nullptr;
    const std::uintptr_t run_start = left != nullptr ? left->addr : hole->addr;
    const std::uintptr_t run_end =
        right != nullptr ? right->addr + right->size : hole->addr + hole->size;
    if (run_end - run_start < rounded) continue;
    for (const std::uintptr_t position : {run_start, run_end - rounded}) {
      const std::uintptr_t overlap_start = std::max<std::uintptr_t>(position, hole->addr);
      const std::uintptr_t overlap_end =
          std::min<std::uintptr_t>(position + rounded, hole->addr + hole->size);
      Placement p;
      p.hole = hole;
      p.position = position;
      p.run = run_end - run_start;
      if (overlap_end > overlap_start) {
        p.map_start = hole->addr + RoundDown(overlap_start - hole->addr, g);
        p.map_end = hole->addr + RoundUp(overlap_end - hole->addr, g);
      } else {
        p.map_start = p.map_end = 0;
      }
      const std::size_t cost = p.map_end - p.map_start;
      const std::size_t best_cost = best->map_end - best->map_start;
      if (!found || cost < best_cost || (cost == best_cost && p.run < best->run) ||
          (cost == best_cost && p.run == best->run && p.position < best->position)) {
        *best = p;
        found = true;
      }
    }
  }
  return found;
}

// The soft cap on mapped bytes: keep them near the peak of allocated bytes, which is what the
// ratio goal measures. The slack is a share of that peak, not a number of granules: a fixed slack
// big enough to spare a large pool its remaps is a large share of a small one (7 granules are 8%
// of a 170 MB pool). Pending bytes (freed, fence not complete) count as in use
// (`count_pending`, unless Tuning says otherwise): they can be neither reused nor unmapped yet.
// Without them, a pool whose frees wait for fences sits above the cap for good, unmaps what just
// became free at every growth and maps exactly the request each time.
std::size_t VmmLayout::SoftCap(const Core& core, std::size_t rounded, double slack,
                               bool count_pending) const {
  const Tuning& tuning = core.tuning_;
  const std::size_t in_use =
      core.stats_.current_allocated_bytes + rounded +
      (count_pending && tuning.vmm_cap_counts_pending ? core.PendingBytesRelaxed() : 0);
  const std::size_t peak = std::max(core.stats_.peak_allocated_bytes, in_use);
  return peak + std::max(static_cast<std::size_t>(static_cast<double>(peak) * slack),
                         tuning.vmm_min_slack_granules * granularity_);
}

// The best placement, after unmapping free granules elsewhere when mapping it would pass the
// ceiling (Tuning::vmm_ceiling_slack) or the capacity. Past the ceiling it unmaps down to the soft
// cap (`budget`), not just to the ceiling: with dynamic shapes a pool at its cap meets a request
// that fits no free block every few allocations, and each would otherwise cost an unmap and a
// map; the room between the two lets the next ones map without unmapping. The free neighbours the
// placement extends are unmapped last (unmapping them would make it cost more, or move it).
// Unmapping can still move the best placement, so this repeats while over and something was
// still unmapped.
bool VmmLayout::PlaceUnderCap(Core& core, std::size_t rounded, std::uint8_t heap,
                              std::size_t budget, Placement* place) {
  if (!PlaceMapped(rounded, heap, place)) return false;
  const std::size_t ceiling = std::max(
      budget, SoftCap(core, rounded, core.tuning_.vmm_ceiling_slack, /*count_pending=*/true));
  std::size_t cost = place->map_end - place->map_start;
  for (int round = 0; round < 4 && (core.reserved_ + cost > ceiling || core.OverCapacity(cost));
       ++round) {
    std::size_t want = core.reserved_ + cost > ceiling ? core.reserved_ + cost - budget : 0;
    if (core.OverCapacity(cost)) want = std::max(want, core.reserved_ + cost - core.capacity_);
    std::size_t released = UnmapFreeGranules(core, want, place);
    if (released < want) released += UnmapFreeGranules(core, want - released, nullptr);
    if (released == 0) break;
    if (!PlaceMapped(rounded, heap, place)) return false;
    cost = place->map_end - place->map_start;
  }
  return true;
}

// Map ahead while memory grows: a share of what is allocated, within the soft cap counted without
// pending bytes (they are not allocations, and mapping ahead bets on allocations growing), so a
// build-up phase takes geometrically fewer calls and overshoots the peak by at most that share.
// Extends `place` and returns the extra bytes.
std::size_t VmmLayout::MapAhead(const Core& core, std::size_t rounded, std::size_t cost,
                                Placement* place) const {
  const std::size_t reserved = core.reserved_;
  const std::size_t budget =
      SoftCap(core, rounded, core.tuning_.vmm_slack, /*count_pending=*/false);
  const std::uintptr_t hole_end = place->hole->addr + place->hole->size;
  std::size_t ahead =
      static_cast<std::size_t>(core.tuning_.vmm_map_ahead *
                               static_cast<double>(core.stats_.current_allocated_bytes + rounded));
  const std::size_t room = budget > reserved + cost ? budget - reserved - cost : 0;
  ahead = std::min({ahead, room, hole_end - place->map_end});
  const std::size_t device = core.capacity_ != 0 ? core.capacity_ : core.upstream_->TotalBytes();
  if (device != 0) ahead = std::min(ahead, device > reserved + cost ? device - reserved - cost : 0);
  ahead = RoundDown(ahead, granularity_);
  place->map_end += ahead;
  return ahead;
}

UpstreamStatus VmmLayout::GrowMapped(Core& core, std::size_t rounded, bool map_ahead, Block** block,
                                     std::uintptr_t* position) {
  const std::uint8_t heap = HeapFor(rounded);
  if (!EnsureAddressSpace(core, heap)) return UpstreamStatus::kError;
  const std::size_t budget = SoftCap(core, rounded, core.tuning_.vmm_slack, /*count_pending=*/true);
  Placement place;
  if (!PlaceUnderCap(core, rounded, heap, budget, &place)) return UpstreamStatus::kOutOfMemory;
  std::size_t cost = place.map_end - place.map_start;
  if (core.OverCapacity(cost)) return UpstreamStatus::kOutOfMemory;
  if (cost != 0 && map_ahead) cost += MapAhead(core, rounded, cost, &place);
  if (cost == 0) {
    // The run is already mapped (free neighbours fit together): nothing to ask for.
    *block = place.position < place.hole->addr ? place.hole->prev : place.hole->next;
    *position = place.position;
    return UpstreamStatus::kOk;
  }
  ++core.stats_.upstream_grow_calls;
  const UpstreamStatus status = core.upstream_->Map(place.map_start, cost);
  if (status != UpstreamStatus::kOk) return status;
  MarkMapped(place.hole->region, place.map_start, place.map_end);
  core.AddReserved(cost);
  // Cut the mapped part out of the hole and merge it with its free neighbours.
  Block* hole = place.hole;
  unmapped_[heap].erase(hole);
  if (place.map_start > hole->addr) {
    Block* left = hole;
    hole = core.SplitAt(left, place.map_start);
    unmapped_[heap].insert(left);
  }
  if (hole->addr + hole->size > place.map_end) {
    unmapped_[heap].insert(core.SplitAt(hole, place.map_end));
  }
  hole->state = BlockState::kFree;
  *block = core.MergeFreeNeighbours(hole);
  core.InsertFree(*block);
  *position = place.position;
  return UpstreamStatus::kOk;
}

// Unmaps whole free granules, largest free blocks first, until at least `want` bytes are gone
// (everything with want = max), leaving out the free neighbours of `keep`'s hole when given. One
// upstream call per free block.
std::size_t VmmLayout::UnmapFreeGranules(Core& core, std::size_t want, const Placement* keep) {
  const Block* left = keep != nullptr ? keep->hole->prev : nullptr;
  const Block* right = keep != nullptr ? keep->hole->next : nullptr;
  std::size_t released = 0;
  const std::size_t g = granularity_;
  while (released < want) {
    Block* batch[16];
    std::size_t n = 0;
    for (FreeIndex& heap : core.heaps_) {
      if (n == 16) break;
      heap.ForEachLargestFirst(g, [&](Block* b) {
        if (b != left && b != right && InteriorBytes(b) != 0) batch[n++] = b;
        return n < 16;
      });
    }
    if (n == 0) break;
    for (std::size_t i = 0; i < n && released < want; ++i) {
      if (!core.ReserveScratch()) return released;
      const std::size_t bytes = UnmapInterior(core, batch[i]);
      if (bytes == 0) return released;  // the upstream refused: stop, keep what we have
      released += bytes;
    }
  }
  return released;
}

std::size_t VmmLayout::UnmapInterior(Core& core, Block* b) {
  std::uintptr_t start = 0;
  std::uintptr_t end = 0;
  if (!ReleasableRange(b, &start, &end)) return 0;
  ++core.stats_.upstream_shrink_calls;
  if (core.upstream_->Unmap(start, end - start) != UpstreamStatus::kOk) return 0;
  core.reserved_ -= end - start;
  core.RemoveFree(b);
  Block* middle = b;
  if (start > b->addr) {
    middle = core.SplitAt(b, start);
    core.InsertFree(b);
  }
  if (middle->addr + middle->size > end) {
    Block* right = core.SplitAt(middle, end);
    core.InsertFree(right);
  }
  middle->state = BlockState::kUnmapped;
  if (middle->prev != nullptr && middle->prev->state == BlockState::kUnmapped) {
    Block* prev = middle->prev;
    unmapped_[prev->heap].erase(prev);
    core.Absorb(prev, middle);
    middle = prev;
  }
  if (middle->next != nullptr && middle->next->state == BlockState::kUnmapped) {
    unmapped_[middle->heap].erase(middle->next);
    core.Absorb(middle, middle->next);
  }
  unmapped_[middle->heap].insert(middle);
  return end - start;
}

// Chunk edges: bit k is set when a Map chunk starts or ends at granule k. Mapping [s, e)
// clears the bits strictly inside and sets both ends, so for every mapped chunk its edges are
// set and its inside clear (bits over unmapped granules are stale and never consulted).
void VmmLayout::MarkMapped(Region* region, std::uintptr_t start, std::uintptr_t end) const {
  std::uint64_t* edges = region->edges;
  const std::size_t first = (start - region->base) >> granule_shift_;
  const std::size_t last = (end - region->base) >> granule_shift_;
  for (std::size_t k = first + 1; k < last;) {
    if (k % 64 == 0 && k + 64 <= last) {
      edges[k / 64] = 0;
      k += 64;
    } else {
      edges[k / 64] &= ~(std::uint64_t{1} << (k % 64));
      ++k;
    }
  }
  edges[first / 64] |= std::uint64_t{1} << (first % 64);
  edges[last / 64] |= std::uint64_t{1} << (last % 64);
  // The upstream cut the Map at every multiple of its piece size (by address): each piece is a
  // chunk. Pieces are power-of-two multiples of the granularity (else: whole Maps).
  const std::size_t piece = partial_unmap_ ? 0 : upstream_->MapPieceBytes(end - start);
  if (piece >= granularity_ && piece % granularity_ == 0 && std::has_single_bit(piece)) {
    const std::size_t step = piece >> granule_shift_;
    const std::size_t base = region->base >> granule_shift_;
    const std::size_t offset = (base + first + 1) & (step - 1);
    for (std::size_t k = first + 1 + (offset == 0 ? 0 : step - offset); k < last; k += step) {
      edges[k / 64] |= std::uint64_t{1} << (k % 64);
    }
  }
}

}  // namespace vramscope::pool::internal
