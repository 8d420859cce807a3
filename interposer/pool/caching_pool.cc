// The caching pool: one implementation, two layouts.
//
//  kVmm (default): one reserved address range; physical granules are mapped on demand exactly
//    where the best placement needs them, and free granules are unmapped lazily (soft cap on
//    mapped bytes relative to the peak allocated, ReleaseIdle, out-of-memory).
//  kSegments: PyTorch-like; small requests (<= 1 MiB) packed into 2 MiB segments, larger ones in
//    20 MiB segments (or exact 2 MiB-rounded segments above 10 MiB); whole free segments go back.
//
// Both share the blocks, the best-fit FreeIndex, the pending-fence FIFO and the statistics.
//
// Quick reuse (the hot path): a block freed with a fence goes, once the fence completed (at once
// for kSettledFence) and unmerged, into a bin of its exact size, and the next request of that size
// takes it back as it is: no merge, no best fit, no split. (A free with no fence merges at once, as
// before: what a replay measures.) A program that frees and allocates the same sizes over and over
// (thrust's temporaries, a training step) lives there. Bins are merged back into the free index
// before the pool would ask the upstream for more, before it gives memory back, and under pressure,
// so they never make it hold more than best fit over merged blocks would. Everything runs under one
// mutex; no operation touches the heap on the cached path (SlotPool and AddrMap reserve ahead with
// new(std::nothrow)), and nothing throws.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <new>

#include "addr_map.h"
#include "free_index.h"
#include "pool_internal.h"
#include "slot_pool.h"

namespace vramscope::pool::internal {
namespace {

constexpr std::size_t kMaxRequest = std::numeric_limits<std::size_t>::max() / 4;

std::size_t RoundUp(std::size_t bytes, std::size_t unit) {
  return (bytes + unit - 1) / unit * unit;
}
std::size_t RoundDown(std::size_t bytes, std::size_t unit) { return bytes / unit * unit; }

class CachingPool final : public Pool {
 public:
  CachingPool(Upstream* upstream, FenceTracker* fences, const PoolOptions& options, Layout layout,
              const Tuning& tuning)
      : upstream_(upstream),
        fences_(fences),
        in_order_(fences != nullptr && fences->CompletesInOrder()),
        retire_(fences == nullptr || fences->NeedsRetire()),
        layout_(layout),
        tuning_(tuning),
        capacity_(options.capacity_bytes),
        granularity_(layout == Layout::kVmm ? upstream->MapGranularity() : 0),
        partial_unmap_(layout == Layout::kVmm && upstream->UnmapsPartialMaps()),
        granule_shift_(granularity_ != 0 ? static_cast<unsigned>(std::countr_zero(granularity_))
                                         : 0),
        blocks_(sizeof(Block)),
        nodes_(64),
        heaps_{FreeIndex(&nodes_), FreeIndex(&nodes_)},
        regions_(std::less<>(), SlotAllocator<std::pair<const std::uintptr_t, Region*>>(&nodes_)),
        unmapped_{BlockSet(BySizeAddr{}, SlotAllocator<Block*>(&nodes_)),
                  BlockSet(BySizeAddr{}, SlotAllocator<Block*>(&nodes_))} {
    if (layout_ == Layout::kVmm) {
      std::size_t device = capacity_ != 0 ? capacity_ : upstream_->TotalBytes();
      // Twice the device: address space is free, and best fit over it never runs out of room
      // before physical memory does.
      va_bytes_ = device != 0 ? RoundUp(device, granularity_) * 2
                              : RoundUp(tuning_.vmm_default_va_bytes, granularity_);
    }
  }

  ~CachingPool() override {
    // Give everything back, live blocks included: the pool's memory dies with it.
    if (layout_ == Layout::kVmm) {
      for (Region* va : va_) {
        if (va == nullptr) continue;
        Block* b = FirstBlock(va);
        while (b != nullptr) {
          if (b->state == BlockState::kUnmapped) {
            b = b->next;
            continue;
          }
          const std::uintptr_t start = b->addr;
          while (b != nullptr && b->state != BlockState::kUnmapped) b = b->next;
          const std::uintptr_t end = b != nullptr ? b->addr : va->base + va->size;
          (void)upstream_->Unmap(start, end - start);
        }
        (void)upstream_->ReleaseRange(va->base, va->size);
      }
    } else {
      for (auto& [base, region] : regions_) (void)upstream_->Free(base, region->size);
    }
    for (auto& [base, region] : regions_) DeleteRegion(region);
  }

  PoolStatus Allocate(std::size_t size, std::uintptr_t* address) override {
    return AllocateSized(size, address, nullptr);
  }

  PoolStatus AllocateSized(std::size_t size, std::uintptr_t* address, BlockSizes* sizes) override {
    return AllocateImpl(size, address, sizes, /*may_grow=*/true);
  }

  PoolStatus AllocateCached(std::size_t size, std::uintptr_t* address, BlockSizes* sizes) override {
    return AllocateImpl(size, address, sizes, /*may_grow=*/false);
  }

  PoolStatus AllocateImpl(std::size_t size, std::uintptr_t* address, BlockSizes* sizes,
                          bool may_grow) {
    if (address == nullptr || size == 0 || size > kMaxRequest ||
        (capacity_ != 0 && size > capacity_)) {
      return PoolStatus::kInvalidArgument;
    }
    const std::size_t rounded = RoundUp(size, kRoundBytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (!live_.Reserve(1)) return FailOom(rounded);
    if (pending_head_ != nullptr) PollPending(tuning_.poll_fences_per_allocate);
    Block* block = quick_blocks_ != 0 ? TakeQuick(rounded) : nullptr;
    if (block == nullptr) {
      if (!ReserveScratch()) return FailOom(rounded);
      std::uintptr_t position = 0;
      if (may_grow) {
        const PoolStatus status = FindOrGrow(rounded, &block, &position);
        if (status != PoolStatus::kOk) return status;
      } else if (!FindCached(rounded, &block, &position)) {
        return PoolStatus::kOutOfMemory;  // not recorded: the caller goes on to AllocateSized
      }
      block = Carve(block, position, rounded);
      BusyInc(block->region);
    }
    block->state = BlockState::kLive;
    block->requested = size;
    live_.Insert(block->addr, reinterpret_cast<std::uintptr_t>(block));
    ++stats_.alloc_count;
    ++stats_.live_blocks;
    stats_.current_requested_bytes += size;
    stats_.current_allocated_bytes += rounded;
    stats_.peak_requested_bytes =
        std::max(stats_.peak_requested_bytes, stats_.current_requested_bytes);
    stats_.peak_allocated_bytes =
        std::max(stats_.peak_allocated_bytes, stats_.current_allocated_bytes);
    *address = block->addr;
    if (sizes != nullptr) *sizes = {size, rounded};
    return PoolStatus::kOk;
  }

  PoolStatus Free(std::uintptr_t address, std::uint64_t fence) override {
    return FreeSized(address, fence, nullptr);
  }

  PoolStatus FreeSized(std::uintptr_t address, std::uint64_t fence, BlockSizes* sizes) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::uint64_t found = 0;
    if (!live_.Take(address, &found)) return PoolStatus::kInvalidAddress;
    Block* block = reinterpret_cast<Block*>(static_cast<std::uintptr_t>(found));
    if (sizes != nullptr) *sizes = {block->requested, block->size};
    ++stats_.free_count;
    --stats_.live_blocks;
    stats_.current_requested_bytes -= block->requested;
    stats_.current_allocated_bytes -= block->size;
    block->requested = 0;
    // Merging may insert into the ordered index; a failed reservation here only means the host
    // heap is gone, and SlotAllocator then stops the process rather than throw.
    (void)ReserveScratch();
    if (fence == kSettledFence) {
      // Completed already: kept whole for the next request of its size, as ReleasePending does.
      block->fence = 0;
      ReleaseToQuick(block);
      return PoolStatus::kOk;
    }
    if (fence != 0 && (!retire_ || fence_refs_.Reserve(1))) {
      block->state = BlockState::kPending;
      block->fence = fence;
      block->link_next = nullptr;
      block->link_prev = pending_tail_;
      if (pending_tail_ != nullptr) {
        pending_tail_->link_next = block;
      } else {
        pending_head_ = block;
      }
      pending_tail_ = block;
      AddPending(static_cast<std::ptrdiff_t>(block->size));
      if (!retire_) return PoolStatus::kOk;
      if (std::uint64_t* refs = fence_refs_.Find(fence)) {
        ++*refs;
      } else {
        fence_refs_.Insert(fence, 1);
      }
      return PoolStatus::kOk;
    }
    if (fence != 0) {
      // No room to remember the fence: honour it now instead.
      fences_->Wait(fence);
      ++stats_.fence_waits;
      if (retire_) fences_->Retire(fence);
    }
    BusyDec(block->region);
    MakeFree(block);
    return PoolStatus::kOk;
  }

  PoolStatus Lookup(std::uintptr_t address, BlockInfo* info) const override {
    if (info == nullptr) return PoolStatus::kInvalidArgument;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.upper_bound(address);
    if (it == regions_.begin()) return PoolStatus::kInvalidAddress;
    --it;
    const Region* region = it->second;
    if (address >= region->base + region->size) return PoolStatus::kInvalidAddress;
    // The lowest block starting in this page or an earlier one, then forward to `address`.
    std::size_t page = (address - region->base) >> region->page_shift;
    while (region->pages[page] == nullptr || region->pages[page]->addr > address) {
      if (page == 0) return PoolStatus::kInvalidAddress;  // unreachable: block 0 starts at base
      --page;
    }
    const Block* b = region->pages[page];
    while (b->next != nullptr && b->next->addr <= address) b = b->next;
    if (b->state != BlockState::kLive || address >= b->addr + b->size) {
      return PoolStatus::kInvalidAddress;
    }
    info->address = b->addr;
    info->requested = b->requested;
    info->allocated = b->size;
    if (layout_ == Layout::kVmm) {
      // The mapped granules that hold the block.
      info->segment_base = RoundDown(b->addr - region->base, granularity_) + region->base;
      info->segment_size = RoundUp(b->addr + b->size - region->base, granularity_) + region->base -
                           info->segment_base;
    } else {
      info->segment_base = region->base;
      info->segment_size = region->size;
    }
    return PoolStatus::kOk;
  }

  std::size_t ReleaseIdle() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ReserveScratch()) return 0;
    if (pending_head_ != nullptr) {
      PollPending(std::numeric_limits<std::size_t>::max(), /*to_quick=*/false);
    }
    return ReleaseIdleLocked(std::numeric_limits<std::size_t>::max());
  }

  void DrainPending() override {
    std::lock_guard<std::mutex> lock(mu_);
    (void)ReserveScratch();
    while (pending_head_ != nullptr) WaitOldest();
  }

  PoolStats Stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    PoolStats s = stats_;
    s.current_reserved_bytes = reserved_;
    s.peak_reserved_bytes = peak_reserved_;
    s.free_bytes = reserved_ - s.current_allocated_bytes;
    s.pending_bytes = pending_bytes_.load(std::memory_order_relaxed);
    // Binned blocks cannot go back to the upstream before they are merged.
    s.unreleasable_free_bytes = unreleasable_ + quick_bytes_;
    s.largest_free_block_bytes = LargestFree();
    return s;
  }

  std::size_t PendingBytesRelaxed() const override {
    return pending_bytes_.load(std::memory_order_relaxed);
  }

  std::string_view policy() const override { return layout_ == Layout::kVmm ? "vmm" : "segments"; }

 private:
  // --- Allocation path ---------------------------------------------------------------------

  std::uint8_t HeapFor(std::size_t rounded) const {
    const bool split = layout_ == Layout::kSegments || tuning_.vmm_separate_small;
    return split && rounded <= tuning_.small_max_bytes ? 0 : 1;
  }

  // A free block for `rounded` bytes among what the pool holds; no upstream call. The caller
  // polled the oldest fences and tried the quick bin of the size.
  bool FindCached(std::size_t rounded, Block** block, std::uintptr_t* position) {
    FreeIndex& heap = heaps_[HeapFor(rounded)];
    *block = heap.BestFit(rounded);
    // Binned blocks only ever serve their own size. Any other request sees them merged, as if
    // there were no bins: unless an indexed block fits exactly, the bins are merged first (so a
    // request never splits a larger block, or grows the pool, that merged bins would spare).
    if (quick_blocks_ != 0 && (*block == nullptr || (*block)->size != rounded)) {
      FlushQuick();
      *block = heap.BestFit(rounded);
    }
    if (*block == nullptr && pending_head_ != nullptr) {
      // Before growing: every completed fence polled, its blocks merged and indexed.
      PollPending(std::numeric_limits<std::size_t>::max(), /*to_quick=*/false);
      *block = heap.BestFit(rounded);
    }
    if (*block == nullptr) return false;
    *position = (*block)->addr;
    return true;
  }

  // Finds a free block for `rounded` bytes at `*position`, growing, releasing and waiting as
  // needed; on failure records the OOM.
  PoolStatus FindOrGrow(std::size_t rounded, Block** block, std::uintptr_t* position) {
    FreeIndex& heap = heaps_[HeapFor(rounded)];
    if (FindCached(rounded, block, position)) return PoolStatus::kOk;
    UpstreamStatus status = Grow(rounded, /*retry=*/false, block, position);
    if (status == UpstreamStatus::kOutOfMemory) {
      // Pressure: give idle memory back, wait on the oldest fences (a completed one may free a
      // block that fits), then ask the upstream once more.
      ++stats_.upstream_retries;
      ReleaseIdleLocked(std::numeric_limits<std::size_t>::max());
      while (*block == nullptr && pending_head_ != nullptr) {
        WaitOldest();
        *block = heap.BestFit(rounded);
      }
      if (*block != nullptr) {
        *position = (*block)->addr;
        return PoolStatus::kOk;
      }
      ReleaseIdleLocked(std::numeric_limits<std::size_t>::max());
      status = Grow(rounded, /*retry=*/true, block, position);
    }
    if (status == UpstreamStatus::kOk) return PoolStatus::kOk;
    if (status == UpstreamStatus::kOutOfMemory) return FailOom(rounded);
    return PoolStatus::kUpstreamError;
  }

  PoolStatus FailOom(std::size_t rounded) {
    ++stats_.oom_count;
    const std::size_t free = reserved_ - stats_.current_allocated_bytes;
    stats_.last_oom_verdict = free >= rounded ? OomVerdict::kFragmentation : OomVerdict::kCapacity;
    return PoolStatus::kOutOfMemory;
  }

  bool OverCapacity(std::size_t more) const {
    return capacity_ != 0 && (reserved_ > capacity_ || more > capacity_ - reserved_);
  }

  // `retry`: the second attempt after an upstream OOM asks for no more than the request needs.
  UpstreamStatus Grow(std::size_t rounded, bool retry, Block** block, std::uintptr_t* position) {
    return layout_ == Layout::kVmm ? GrowMapped(rounded, !retry, block, position)
                                   : GrowSegment(rounded, block, position);
  }

  // Splits the free `block` so that [position, position + size) becomes its own block, which is
  // returned out of the index; the remainders go back in.
  Block* Carve(Block* block, std::uintptr_t position, std::size_t size) {
    if (position == block->addr && block->size > size) {
      // Hot path: a new block takes the front; the free block keeps the rest and usually its
      // place in the index.
      Block* front = NewBlock();
      front->addr = block->addr;
      front->size = size;
      front->region = block->region;
      front->heap = block->heap;
      front->prev = block->prev;
      front->next = block;
      if (block->prev != nullptr) block->prev->next = front;
      block->prev = front;
      Block*& page = PageOf(front->addr, front->region);
      if (page == block) page = front;
      UpdateFree(block, block->addr + size, block->size - size);
      Block*& rest_page = PageOf(block->addr, block->region);
      if (rest_page == nullptr || rest_page->addr > block->addr) rest_page = block;
      return front;
    }
    RemoveFree(block);
    if (position > block->addr) {
      Block* left = block;
      block = SplitAt(left, position);
      InsertFree(left);
    }
    if (block->size > size) InsertFree(SplitAt(block, block->addr + size));
    return block;
  }

  // --- Segments ------------------------------------------------------------------------------

  UpstreamStatus GrowSegment(std::size_t rounded, Block** block, std::uintptr_t* position) {
    const std::uint8_t heap = HeapFor(rounded);
    std::size_t bytes = heap == 0 ? tuning_.small_segment_bytes
                        : rounded <= tuning_.large_exact_above_bytes
                            ? tuning_.large_segment_bytes
                            : RoundUp(rounded, tuning_.segment_round_bytes);
    if (OverCapacity(bytes)) {
      bytes = RoundUp(rounded, tuning_.segment_round_bytes);  // the least that serves it
      if (OverCapacity(bytes)) return UpstreamStatus::kOutOfMemory;
    }
    Region* region = NewRegion(bytes, heap);
    if (region == nullptr) return UpstreamStatus::kOutOfMemory;
    std::uintptr_t base = 0;
    ++stats_.upstream_grow_calls;
    const UpstreamStatus status = upstream_->Allocate(bytes, &base);
    if (status != UpstreamStatus::kOk) {
      DeleteRegion(region);
      return status;
    }
    region->base = base;
    regions_.emplace(base, region);
    AddReserved(bytes);
    Block* b = NewBlock();
    b->addr = base;
    b->size = bytes;
    b->region = region;
    b->heap = heap;
    region->pages[0] = b;
    InsertFree(b);
    *block = b;
    *position = base;
    return UpstreamStatus::kOk;
  }

  std::size_t ReleaseSegments() {
    std::size_t released = 0;
    for (auto it = regions_.begin(); it != regions_.end();) {
      Region* region = it->second;
      if (region->busy_blocks != 0) {
        ++it;
        continue;
      }
      Block* b = region->pages[0];  // an idle segment is one free block
      ++stats_.upstream_shrink_calls;
      if (upstream_->Free(region->base, region->size) != UpstreamStatus::kOk) {
        ++it;
        continue;
      }
      RemoveFree(b);
      blocks_.Give(b);
      released += region->size;
      reserved_ -= region->size;
      it = regions_.erase(it);
      DeleteRegion(region);
    }
    return released;
  }

  // --- Virtual memory ------------------------------------------------------------------------

  // Small requests get an address range of their own (like PyTorch's small pool), so the small
  // long-lived blocks cannot pin the large mapped chunks.
  bool EnsureAddressSpace(std::uint8_t heap) {
    if (va_[heap] != nullptr) return true;
    Region* region = NewRegion(va_bytes_, heap);
    if (region == nullptr) return false;
    region->edges = static_cast<std::uint64_t*>(
        std::calloc(va_bytes_ / granularity_ / 64 + 1, sizeof(std::uint64_t)));
    if (region->edges == nullptr) {
      DeleteRegion(region);
      return false;
    }
    std::uintptr_t base = 0;
    ++stats_.upstream_grow_calls;
    if (upstream_->ReserveRange(va_bytes_, &base) != UpstreamStatus::kOk) {
      DeleteRegion(region);
      return false;
    }
    if (base % granularity_ != 0) {
      ++stats_.upstream_shrink_calls;
      (void)upstream_->ReleaseRange(base, va_bytes_);
      DeleteRegion(region);
      return false;
    }
    region->base = base;
    regions_.emplace(base, region);
    va_[heap] = region;
    Block* b = NewBlock();
    b->addr = base;
    b->size = va_bytes_;
    b->region = region;
    b->heap = heap;
    b->state = BlockState::kUnmapped;
    region->pages[0] = b;
    unmapped_[heap].insert(b);
    return true;
  }

  struct Placement {
    Block* hole = nullptr;  // the unmapped block to map part of
    std::uintptr_t position = 0;
    std::uintptr_t map_start = 0;
    std::uintptr_t map_end = 0;
    std::size_t run = 0;
  };

  // Where to put `rounded` bytes so the fewest new granules are mapped: for every unmapped hole,
  // the run it forms with its free mapped neighbours, placed against either end of the run.
  // Holes only appear where granules were unmapped, so there are few of them.
  bool PlaceMapped(std::size_t rounded, std::uint8_t heap, Placement* best) const {
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

  UpstreamStatus GrowMapped(std::size_t rounded, bool map_ahead, Block** block,
                            std::uintptr_t* position) {
    const std::uint8_t heap = HeapFor(rounded);
    if (!EnsureAddressSpace(heap)) return UpstreamStatus::kError;
    Placement place;
    if (!PlaceMapped(rounded, heap, &place)) return UpstreamStatus::kOutOfMemory;
    std::size_t cost = place.map_end - place.map_start;
    // Soft cap: keep mapped bytes near the peak of allocated bytes by unmapping free granules
    // elsewhere before mapping new ones. Peak reserved is what the ratio goal measures.
    // Pending bytes (freed, fence not complete) count as in use: they can be neither reused nor
    // unmapped yet. Without them, a pool whose frees wait for fences sits above the cap for good,
    // unmaps what just became free at every growth and maps exactly the request each time.
    const std::size_t in_use = stats_.current_allocated_bytes + rounded +
                               (tuning_.vmm_cap_counts_pending ? PendingBytesRelaxed() : 0);
    const double peak = static_cast<double>(std::max(stats_.peak_allocated_bytes, in_use));
    const std::size_t budget = static_cast<std::size_t>(peak * (1.0 + tuning_.vmm_slack)) +
                               tuning_.vmm_slack_granules * granularity_;
    // Unmapping can move the best placement (a neighbour it relied on may be gone), so repeat
    // while over the cap and something was still unmapped.
    for (int round = 0; round < 4 && (reserved_ + cost > budget || OverCapacity(cost)); ++round) {
      std::size_t want = reserved_ + cost > budget ? reserved_ + cost - budget : 0;
      if (OverCapacity(cost)) want = std::max(want, reserved_ + cost - capacity_);
      if (UnmapFreeGranules(want) == 0) break;
      if (!PlaceMapped(rounded, heap, &place)) return UpstreamStatus::kOutOfMemory;
      cost = place.map_end - place.map_start;
    }
    if (OverCapacity(cost)) return UpstreamStatus::kOutOfMemory;
    std::size_t ahead = 0;
    if (cost != 0 && map_ahead) {
      // Map ahead while memory grows: a share of what is allocated, within the soft cap, so a
      // build-up phase takes geometrically fewer calls and overshoots the peak by at most that
      // share.
      const std::uintptr_t hole_end = place.hole->addr + place.hole->size;
      ahead = static_cast<std::size_t>(
          tuning_.vmm_map_ahead * static_cast<double>(stats_.current_allocated_bytes + rounded));
      const std::size_t room = budget > reserved_ + cost ? budget - reserved_ - cost : 0;
      ahead = std::min({ahead, room, hole_end - place.map_end});
      const std::size_t device = capacity_ != 0 ? capacity_ : upstream_->TotalBytes();
      if (device != 0)
        ahead = std::min(ahead, device > reserved_ + cost ? device - reserved_ - cost : 0);
      ahead = RoundDown(ahead, granularity_);
      place.map_end += ahead;
      cost += ahead;
    }
    if (cost == 0) {
      // The run is already mapped (free neighbours fit together): nothing to ask for.
      *block = place.position < place.hole->addr ? place.hole->prev : place.hole->next;
      *position = place.position;
      return UpstreamStatus::kOk;
    }
    ++stats_.upstream_grow_calls;
    const UpstreamStatus status = upstream_->Map(place.map_start, cost);
    if (status != UpstreamStatus::kOk) return status;
    MarkMapped(place.hole->region, place.map_start, place.map_end);
    AddReserved(cost);
    // Cut the mapped part out of the hole and merge it with its free neighbours.
    Block* hole = place.hole;
    unmapped_[heap].erase(hole);
    if (place.map_start > hole->addr) {
      Block* left = hole;
      hole = SplitAt(left, place.map_start);
      unmapped_[heap].insert(left);
    }
    if (hole->addr + hole->size > place.map_end)
      unmapped_[heap].insert(SplitAt(hole, place.map_end));
    hole->state = BlockState::kFree;
    *block = MergeFreeNeighbours(hole);
    InsertFree(*block);
    *position = place.position;
    return UpstreamStatus::kOk;
  }

  // Unmaps whole free granules, largest free blocks first, until at least `want` bytes are gone
  // (everything with want = max). One upstream call per free block.
  std::size_t UnmapFreeGranules(std::size_t want) {
    std::size_t released = 0;
    const std::size_t g = granularity_;
    while (released < want) {
      Block* batch[16];
      std::size_t n = 0;
      for (FreeIndex& heap : heaps_) {
        if (n == 16) break;
        heap.ForEachLargestFirst(g, [&](Block* b) {
          if (InteriorBytes(b) != 0) batch[n++] = b;
          return n < 16;
        });
      }
      if (n == 0) break;
      for (std::size_t i = 0; i < n && released < want; ++i) {
        if (!ReserveScratch()) return released;
        const std::size_t bytes = UnmapInterior(batch[i]);
        if (bytes == 0) return released;  // the upstream refused: stop, keep what we have
        released += bytes;
      }
    }
    return released;
  }

  std::size_t UnmapInterior(Block* b) {
    std::uintptr_t start = 0;
    std::uintptr_t end = 0;
    if (!ReleasableRange(b, &start, &end)) return 0;
    ++stats_.upstream_shrink_calls;
    if (upstream_->Unmap(start, end - start) != UpstreamStatus::kOk) return 0;
    reserved_ -= end - start;
    RemoveFree(b);
    Block* middle = b;
    if (start > b->addr) {
      middle = SplitAt(b, start);
      InsertFree(b);
    }
    if (middle->addr + middle->size > end) {
      Block* right = SplitAt(middle, end);
      InsertFree(right);
    }
    middle->state = BlockState::kUnmapped;
    if (middle->prev != nullptr && middle->prev->state == BlockState::kUnmapped) {
      Block* prev = middle->prev;
      unmapped_[prev->heap].erase(prev);
      Absorb(prev, middle);
      middle = prev;
    }
    if (middle->next != nullptr && middle->next->state == BlockState::kUnmapped) {
      unmapped_[middle->heap].erase(middle->next);
      Absorb(middle, middle->next);
    }
    unmapped_[middle->heap].insert(middle);
    return end - start;
  }

  // What unmapping a free block could give back (virtual-memory layout): the whole granules
  // inside it, or, when the upstream unmaps whole Maps only, the whole Map chunks inside it (a
  // chunk that is partly live then stays).
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

  // Chunk edges: bit k is set when a Map chunk starts or ends at granule k. Mapping [s, e)
  // clears the bits strictly inside and sets both ends, so for every mapped chunk its edges are
  // set and its inside clear (bits over unmapped granules are stale and never consulted).
  void MarkMapped(Region* region, std::uintptr_t start, std::uintptr_t end) {
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

  std::size_t ReleaseIdleLocked(std::size_t want) {
    FlushQuick();
    return layout_ == Layout::kVmm ? UnmapFreeGranules(want) : ReleaseSegments();
  }

  // --- Quick bins ----------------------------------------------------------------------------

  // Direct-mapped by size: a size that finds its bin taken by another goes the merged way.
  static std::size_t QuickIndex(std::size_t rounded) {
    return static_cast<std::size_t>(((rounded / kRoundBytes) * 0x9E3779B97F4A7C15ull) >>
                                    (64 - kQuickBinBits));
  }

  // A block whose fence completed: into the bin of its size if there is room, else merged.
  void ReleaseToQuick(Block* b) {
    QuickBin& bin = quick_[QuickIndex(b->size)];
    if (bin.count >= tuning_.quick_depth || (bin.count != 0 && bin.size != b->size)) {
      BusyDec(b->region);
      MakeFree(b);
      return;
    }
    bin.size = b->size;
    b->state = BlockState::kQuick;
    b->link_next = bin.head;
    bin.head = b;
    ++bin.count;
    ++quick_blocks_;
    quick_bytes_ += b->size;
  }

  // The most recently binned block of exactly `rounded` bytes, out of its bin; null if none.
  // It keeps its region's busy count (see ReleaseToQuick), so the caller does not add one.
  Block* TakeQuick(std::size_t rounded) {
    QuickBin& bin = quick_[QuickIndex(rounded)];
    if (bin.count == 0 || bin.size != rounded) return nullptr;
    Block* b = bin.head;
    bin.head = b->link_next;
    b->link_next = nullptr;
    --bin.count;
    --quick_blocks_;
    quick_bytes_ -= b->size;
    return b;
  }

  // Every binned block merged with its free neighbours and indexed.
  void FlushQuick() {
    if (quick_blocks_ == 0) return;
    for (QuickBin& bin : quick_) {
      while (bin.head != nullptr) {
        Block* b = bin.head;
        bin.head = b->link_next;
        b->link_next = nullptr;
        (void)ReserveScratch();
        BusyDec(b->region);
        MakeFree(b);
      }
      bin.count = 0;
    }
    quick_blocks_ = 0;
    quick_bytes_ = 0;
  }

  // --- Fences --------------------------------------------------------------------------------

  // Asks the tracker about at most `max_fences` fences, oldest first, and frees every pending
  // block whose fence completed. Consecutive frees usually share a fence: asked once.
  // `to_quick`: completed blocks go to the quick bins (the allocation path), or merged straight
  // into the index (before growing or releasing).
  void PollPending(std::size_t max_fences, bool to_quick = true) {
    std::uint64_t fence = 0;
    bool complete = false;
    std::size_t asked = 0;
    std::size_t walked = 0;
    const bool bounded = max_fences != std::numeric_limits<std::size_t>::max();
    for (Block* b = pending_head_; b != nullptr;) {
      if (bounded && walked++ == tuning_.poll_blocks_per_allocate) break;
      Block* next = b->link_next;
      if (b->fence != fence) {
        if (asked == max_fences) break;
        fence = b->fence;
        complete = fences_->IsComplete(fence);
        ++asked;
        // In-order fences: nothing after an incomplete one can be complete. Stop, rather than
        // walk the rest of a batch that shares it (the hot path's bounded poll).
        if (!complete && bounded && in_order_) break;
      }
      if (complete) ReleasePending(b, to_quick);
      b = next;
    }
  }

  void WaitOldest() {
    const std::uint64_t fence = pending_head_->fence;
    fences_->Wait(fence);
    ++stats_.fence_waits;
    for (Block* b = pending_head_; b != nullptr;) {
      Block* next = b->link_next;
      if (b->fence == fence) ReleasePending(b, /*to_quick=*/false);
      b = next;
    }
  }

  // mu_ held: the only writer, so a plain load and store suffice.
  void AddPending(std::ptrdiff_t delta) {
    pending_bytes_.store(
        pending_bytes_.load(std::memory_order_relaxed) + static_cast<std::size_t>(delta),
        std::memory_order_relaxed);
  }

  void ReleasePending(Block* b, bool to_quick) {
    if (b->link_prev != nullptr) {
      b->link_prev->link_next = b->link_next;
    } else {
      pending_head_ = b->link_next;
    }
    if (b->link_next != nullptr) {
      b->link_next->link_prev = b->link_prev;
    } else {
      pending_tail_ = b->link_prev;
    }
    AddPending(-static_cast<std::ptrdiff_t>(b->size));
    if (retire_) {
      std::uint64_t* refs = fence_refs_.Find(b->fence);
      if (refs != nullptr && --*refs == 0) {
        (void)fence_refs_.Erase(b->fence);
        fences_->Retire(b->fence);
      }
    }
    b->fence = 0;
    if (to_quick) {
      ReleaseToQuick(b);
      return;
    }
    BusyDec(b->region);
    MakeFree(b);
  }

  // --- Blocks --------------------------------------------------------------------------------

  bool ReserveScratch() {
    // Worst single step: two remainders into the ordered index, one region node, a few blocks.
    return nodes_.Reserve(8) && blocks_.Reserve(8);
  }

  Block* NewBlock() {
    // Reserved by ReserveScratch; a null here means the host heap is gone.
    void* raw = blocks_.Take();
    if (raw == nullptr) std::abort();
    return new (raw) Block();
  }

  // Splits `b` at `at`; returns the new upper block (same state, heap and region).
  Block* SplitAt(Block* b, std::uintptr_t at) {
    Block* upper = NewBlock();
    upper->addr = at;
    upper->size = b->addr + b->size - at;
    upper->region = b->region;
    upper->heap = b->heap;
    upper->state = b->state;
    b->size = at - b->addr;
    upper->prev = b;
    upper->next = b->next;
    if (b->next != nullptr) b->next->prev = upper;
    b->next = upper;
    Region* region = b->region;
    Block*& page = region->pages[(at - region->base) >> region->page_shift];
    if (page == nullptr || page->addr > at) page = upper;
    return upper;
  }

  // Appends `upper` (the next block) to `b` and drops it.
  static Block*& PageOf(std::uintptr_t addr, Region* region) {
    return region->pages[(addr - region->base) >> region->page_shift];
  }

  // Takes `b` out of the address list and the page map and drops it (its bytes now belong to
  // a neighbour).
  void Unlink(Block* b) {
    Region* region = b->region;
    Block*& page = PageOf(b->addr, region);
    if (page == b) {
      Block* after = b->next;
      page = after != nullptr && &PageOf(after->addr, region) == &page ? after : nullptr;
    }
    if (b->prev != nullptr) b->prev->next = b->next;
    if (b->next != nullptr) b->next->prev = b->prev;
    b->~Block();
    blocks_.Give(b);
  }

  // Appends `upper` (the next block) to `b` and drops it.
  void Absorb(Block* b, Block* upper) {
    b->size += upper->size;
    Unlink(upper);
  }

  Block* MergeFreeNeighbours(Block* b) {
    if (b->prev != nullptr && b->prev->state == BlockState::kFree) {
      Block* prev = b->prev;
      RemoveFree(prev);
      Absorb(prev, b);
      b = prev;
    }
    if (b->next != nullptr && b->next->state == BlockState::kFree) {
      Block* next = b->next;
      RemoveFree(next);
      Absorb(b, next);
    }
    return b;
  }

  // A live or pending block becomes reusable: merge with free neighbours, index.
  // Neighbours already free grow in place over it (no index insert in the common case).
  void MakeFree(Block* b) {
    b->state = BlockState::kFree;
    Block* prev = b->prev != nullptr && b->prev->state == BlockState::kFree ? b->prev : nullptr;
    Block* next = b->next != nullptr && b->next->state == BlockState::kFree ? b->next : nullptr;
    if (prev != nullptr && next != nullptr) {
      const std::size_t size = prev->size + b->size + next->size;
      RemoveFree(next);
      Unlink(b);
      Unlink(next);
      UpdateFree(prev, prev->addr, size);
    } else if (prev != nullptr) {
      const std::size_t size = prev->size + b->size;
      Unlink(b);
      UpdateFree(prev, prev->addr, size);
    } else if (next != nullptr) {
      const std::uintptr_t addr = b->addr;
      const std::uintptr_t old_addr = next->addr;
      const std::size_t size = b->size + next->size;
      Unlink(b);
      UpdateFree(next, addr, size);
      Region* region = next->region;
      Block*& page = PageOf(addr, region);
      if (page == nullptr || page->addr > addr) page = next;
      Block*& old_page = PageOf(old_addr, region);
      if (&old_page != &page && old_page == next) {
        Block* after = next->next;
        old_page = after != nullptr && &PageOf(after->addr, region) == &old_page ? after : nullptr;
      }
    } else {
      InsertFree(b);
    }
  }

  // Free bytes of `b` that cannot go back to the upstream while its neighbours stay.
  std::size_t Unreleasable(const Block* b) const {
    if (layout_ == Layout::kVmm) return b->size - InteriorBytes(b);
    return b->region->busy_blocks != 0 ? b->size : 0;
  }

  void InsertFree(Block* b) {
    b->state = BlockState::kFree;
    heaps_[b->heap].Insert(b);
    b->region->free_bytes += b->size;
    unreleasable_ += Unreleasable(b);
  }

  // Moves or resizes a free block that stays free and indexed.
  void UpdateFree(Block* b, std::uintptr_t addr, std::size_t size) {
    unreleasable_ -= Unreleasable(b);
    b->region->free_bytes = b->region->free_bytes - b->size + size;
    heaps_[b->heap].Update(b, addr, size);
    unreleasable_ += Unreleasable(b);
  }

  void RemoveFree(Block* b) {
    heaps_[b->heap].Remove(b);
    b->region->free_bytes -= b->size;
    unreleasable_ -= Unreleasable(b);
  }

  void BusyInc(Region* region) {
    if (region->busy_blocks++ == 0 && layout_ == Layout::kSegments) {
      unreleasable_ += region->free_bytes;
    }
  }

  void BusyDec(Region* region) {
    if (--region->busy_blocks == 0 && layout_ == Layout::kSegments) {
      unreleasable_ -= region->free_bytes;
    }
  }

  void AddReserved(std::size_t bytes) {
    reserved_ += bytes;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
  }

  // The largest request served with no upstream call: the largest indexed block, or a run of
  // binned and free neighbours that merging the bins (FindCached does) would make.
  std::size_t LargestFree() const {
    const std::size_t small = std::min(heaps_[0].Largest(), tuning_.small_max_bytes);
    std::size_t largest = std::max(small, heaps_[1].Largest());
    if (quick_blocks_ == 0) return largest;
    for (const QuickBin& bin : quick_) {
      for (const Block* b = bin.head; b != nullptr; b = b->link_next) {
        // Counted once, from the run's first binned block.
        if (b->prev != nullptr && b->prev->state == BlockState::kQuick) continue;
        const Block* first = b;
        while (first->prev != nullptr && first->prev->state == BlockState::kFree) {
          first = first->prev;
        }
        std::size_t run = 0;
        const Block* x = first;
        for (; x != nullptr && (x->state == BlockState::kFree || x->state == BlockState::kQuick);
             x = x->next) {
          run += x->size;
        }
        const std::size_t usable = (layout_ == Layout::kSegments && b->heap == 0)
                                       ? std::min(run, tuning_.small_max_bytes)
                                       : run;
        largest = std::max(largest, usable);
      }
    }
    return largest;
  }

  static Block* FirstBlock(Region* region) { return region->pages[0]; }

  Region* NewRegion(std::size_t bytes, std::uint8_t heap) {
    Region* region = new (std::nothrow) Region();
    if (region == nullptr) return nullptr;
    // Lookup pages: at most 2^20 per region (8 MiB for a 1 TiB range), at least 64 KiB each.
    unsigned shift = 16;
    while ((bytes >> shift) >= (std::size_t{1} << 20)) ++shift;
    region->page_shift = shift;
    region->page_count = ((bytes - 1) >> shift) + 1;
    // calloc: the page map of a large reserved range is mostly never touched, and fresh pages
    // from the kernel are zero already.
    region->pages = static_cast<Block**>(std::calloc(region->page_count, sizeof(Block*)));
    if (region->pages == nullptr) {
      delete region;
      return nullptr;
    }
    region->size = bytes;
    region->heap = heap;
    return region;
  }

  static void DeleteRegion(Region* region) {
    std::free(region->pages);
    std::free(region->edges);
    delete region;
  }

  Upstream* const upstream_;
  FenceTracker* const fences_;
  const bool in_order_;  // fences_->CompletesInOrder()
  const bool retire_;    // fences_->NeedsRetire(): fence_refs_ is kept
  const Layout layout_;
  const Tuning tuning_;
  const std::size_t capacity_;
  const std::size_t granularity_;
  const bool partial_unmap_;      // the upstream unmaps any granules, not only whole Maps
  const unsigned granule_shift_;  // granularity_ is a power of two (MakeCachingPool checks)
  std::size_t va_bytes_ = 0;

  mutable std::mutex mu_;
  SlotPool blocks_;
  SlotPool nodes_;
  FreeIndex heaps_[2];  // segments: 0 small, 1 large; virtual memory: 1 only
  std::map<std::uintptr_t, Region*, std::less<>,
           SlotAllocator<std::pair<const std::uintptr_t, Region*>>>
      regions_;
  Region* va_[2] = {nullptr, nullptr};  // virtual memory: one reserved range per heap
  BlockSet unmapped_[2];                // virtual memory: unmapped holes by (size, address)
  AddrMap live_;                        // address -> Block*
  AddrMap fence_refs_;                  // fence -> pending blocks waiting on it
  struct QuickBin {
    std::size_t size = 0;   // of every block in the bin (when count != 0)
    Block* head = nullptr;  // last in, first out, through link_next
    std::uint32_t count = 0;
  };
  static constexpr unsigned kQuickBinBits = 6;
  QuickBin quick_[std::size_t{1} << kQuickBinBits];
  std::size_t quick_blocks_ = 0;
  std::size_t quick_bytes_ = 0;
  Block* pending_head_ = nullptr;  // FIFO, oldest first
  Block* pending_tail_ = nullptr;
  // Written under mu_ only; atomic so that PendingBytesRelaxed may read it without the lock.
  std::atomic<std::size_t> pending_bytes_{0};
  std::size_t reserved_ = 0;
  std::size_t peak_reserved_ = 0;
  std::size_t unreleasable_ = 0;
  PoolStats stats_;
};

}  // namespace

std::unique_ptr<Pool> MakeCachingPool(Upstream* upstream, FenceTracker* fences,
                                      const PoolOptions& options, Layout layout,
                                      const Tuning& tuning) {
  if (upstream == nullptr || fences == nullptr) return nullptr;
  // Granularities are powers of two (cuMemGetAllocationGranularity); anything else is treated
  // as an upstream without virtual memory.
  if (layout == Layout::kVmm && !std::has_single_bit(upstream->MapGranularity())) {
    layout = Layout::kSegments;
  }
  return std::unique_ptr<Pool>(new (std::nothrow)
                                   CachingPool(upstream, fences, options, layout, tuning));
}

}  // namespace vramscope::pool::internal
