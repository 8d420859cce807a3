// The caching pool's core (caching_pool.h): allocation, fences, quick bins, blocks and
// statistics, the same for both layouts; the layouts are vmm_layout.cc and segment_layout.cc.
// MakeCachingPool, at the end, instantiates the core for both layouts.
#include "caching_pool.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <limits>
#include <new>

#include "segment_layout.h"
#include "vmm_layout.h"

namespace vramscope::pool::internal {
namespace {

constexpr std::size_t kMaxRequest = std::numeric_limits<std::size_t>::max() / 4;

}  // namespace

template <typename L>
CachingPool<L>::CachingPool(Upstream* upstream, FenceTracker* fences, const PoolOptions& options,
                            const Tuning& tuning)
    : upstream_(upstream),
      fences_(fences),
      in_order_(fences != nullptr && fences->CompletesInOrder()),
      retire_(fences == nullptr || fences->NeedsRetire()),
      tuning_(tuning),
      capacity_(options.capacity_bytes),
      blocks_(sizeof(Block)),
      nodes_(64),
      heaps_{FreeIndex(&nodes_), FreeIndex(&nodes_)},
      regions_(std::less<>(), SlotAllocator<std::pair<const std::uintptr_t, Region*>>(&nodes_)),
      layout_(upstream, options.capacity_bytes, tuning_, &nodes_) {}

template <typename L>
CachingPool<L>::~CachingPool() {
  // Give everything back, live blocks included: the pool's memory dies with it.
  layout_.GiveBack(*this);
  for (auto& [base, region] : regions_) DeleteRegion(region);
}

// --- Allocation path -----------------------------------------------------------------------

template <typename L>
PoolStatus CachingPool<L>::AllocateImpl(std::size_t size, std::uintptr_t* address,
                                        BlockSizes* sizes, bool may_grow) {
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
    if (!FindCached(rounded, &block, &position)) {
      // Not recorded when the caller may not grow: it goes on to AllocateSized.
      if (!may_grow) return PoolStatus::kOutOfMemory;
      const PoolStatus status = Grow(rounded, &block, &position);
      if (status != PoolStatus::kOk) return status;
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

template <typename L>
PoolStatus CachingPool<L>::FreeSized(std::uintptr_t address, std::uint64_t fence,
                                     BlockSizes* sizes) {
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

template <typename L>
PoolStatus CachingPool<L>::Lookup(std::uintptr_t address, BlockInfo* info) const {
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
  layout_.Segment(region, b, info);
  return PoolStatus::kOk;
}

template <typename L>
std::size_t CachingPool<L>::ReleaseIdle() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ReserveScratch()) return 0;
  if (pending_head_ != nullptr) {
    PollPending(std::numeric_limits<std::size_t>::max(), /*to_quick=*/false);
  }
  return ReleaseIdleLocked(std::numeric_limits<std::size_t>::max());
}

template <typename L>
void CachingPool<L>::DrainPending() {
  std::lock_guard<std::mutex> lock(mu_);
  (void)ReserveScratch();
  while (pending_head_ != nullptr) WaitOldest();
}

template <typename L>
PoolStats CachingPool<L>::Stats() const {
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

// A free block for `rounded` bytes among what the pool holds; no upstream call. The caller
// polled the oldest fences and tried the quick bin of the size.
template <typename L>
bool CachingPool<L>::FindCached(std::size_t rounded, Block** block, std::uintptr_t* position) {
  FreeIndex& heap = heaps_[layout_.HeapFor(rounded)];
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

// After FindCached found nothing: a free block for `rounded` bytes at `*position` from the
// layout's upstream, releasing and waiting as needed; on failure records the OOM.
template <typename L>
PoolStatus CachingPool<L>::Grow(std::size_t rounded, Block** block, std::uintptr_t* position) {
  FreeIndex& heap = heaps_[layout_.HeapFor(rounded)];
  UpstreamStatus status = layout_.Grow(*this, rounded, /*retry=*/false, block, position);
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
    status = layout_.Grow(*this, rounded, /*retry=*/true, block, position);
  }
  if (status == UpstreamStatus::kOk) return PoolStatus::kOk;
  if (status == UpstreamStatus::kOutOfMemory) return FailOom(rounded);
  return PoolStatus::kUpstreamError;
}

template <typename L>
PoolStatus CachingPool<L>::FailOom(std::size_t rounded) {
  ++stats_.oom_count;
  const std::size_t free = reserved_ - stats_.current_allocated_bytes;
  stats_.last_oom_verdict = free >= rounded ? OomVerdict::kFragmentation : OomVerdict::kCapacity;
  return PoolStatus::kOutOfMemory;
}

// Splits the free `block` so that [position, position + size) becomes its own block, which is
// returned out of the index; the remainders go back in.
template <typename L>
Block* CachingPool<L>::Carve(Block* block, std::uintptr_t position, std::size_t size) {
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

template <typename L>
std::size_t CachingPool<L>::ReleaseIdleLocked(std::size_t want) {
  FlushQuick();
  return layout_.Release(*this, want);
}

// --- Quick bins ----------------------------------------------------------------------------

// Direct-mapped by size: a size that finds its bin taken by another goes the merged way.
template <typename L>
std::size_t CachingPool<L>::QuickIndex(std::size_t rounded) {
  return static_cast<std::size_t>(((rounded / kRoundBytes) * 0x9E3779B97F4A7C15ull) >>
                                  (64 - kQuickBinBits));
}

// A block whose fence completed: into the bin of its size if there is room, else merged.
template <typename L>
void CachingPool<L>::ReleaseToQuick(Block* b) {
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
template <typename L>
Block* CachingPool<L>::TakeQuick(std::size_t rounded) {
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
template <typename L>
void CachingPool<L>::FlushQuick() {
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
template <typename L>
void CachingPool<L>::PollPending(std::size_t max_fences, bool to_quick) {
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

template <typename L>
void CachingPool<L>::WaitOldest() {
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
template <typename L>
void CachingPool<L>::AddPending(std::ptrdiff_t delta) {
  pending_bytes_.store(
      pending_bytes_.load(std::memory_order_relaxed) + static_cast<std::size_t>(delta),
      std::memory_order_relaxed);
}

template <typename L>
void CachingPool<L>::ReleasePending(Block* b, bool to_quick) {
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

// A live or pending block becomes reusable: merge with free neighbours, index.
// Neighbours already free grow in place over it (no index insert in the common case).
template <typename L>
void CachingPool<L>::MakeFree(Block* b) {
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

template <typename L>
void CachingPool<L>::BusyInc(Region* region) {
  if constexpr (L::kBusyPinsRegion) {
    if (region->busy_blocks++ == 0) unreleasable_ += region->free_bytes;
  } else {
    ++region->busy_blocks;
  }
}

template <typename L>
void CachingPool<L>::BusyDec(Region* region) {
  if constexpr (L::kBusyPinsRegion) {
    if (--region->busy_blocks == 0) unreleasable_ -= region->free_bytes;
  } else {
    --region->busy_blocks;
  }
}

// The largest request served with no upstream call: the largest indexed block, or a run of
// binned and free neighbours that merging the bins (FindCached does) would make.
template <typename L>
std::size_t CachingPool<L>::LargestFree() const {
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
      largest = std::max(largest, layout_.LargestRequest(b->heap, run));
    }
  }
  return largest;
}

std::unique_ptr<Pool> MakeCachingPool(Upstream* upstream, FenceTracker* fences,
                                      const PoolOptions& options, Layout layout,
                                      const Tuning& tuning) {
  if (upstream == nullptr || fences == nullptr) return nullptr;
  // Granularities are powers of two (cuMemGetAllocationGranularity); anything else is treated
  // as an upstream without virtual memory.
  if (layout == Layout::kVmm && std::has_single_bit(upstream->MapGranularity())) {
    return std::unique_ptr<Pool>(new (std::nothrow)
                                     CachingPool<VmmLayout>(upstream, fences, options, tuning));
  }
  return std::unique_ptr<Pool>(new (std::nothrow)
                                   CachingPool<SegmentLayout>(upstream, fences, options, tuning));
}

}  // namespace vramscope::pool::internal
