// The caching pool's core, templated on its layout (internal; reached through MakePool).
//
// The core owns what both layouts share: the blocks and their regions, the best-fit FreeIndex,
// the quick bins, the pending-fence FIFO, the lock and the statistics. Where memory comes from,
// where a request goes and what goes back is the layout's (vmm_layout.h, segment_layout.h). The
// layout is fixed when the pool is made, so it is a template argument: its hot-path hooks inline
// into the core and no call is virtual but the Pool interface itself.
//
// A layout L provides (both do; the core calls nothing else, Core = CachingPool<L>):
//   static constexpr std::string_view kName;     // Pool::policy()
//   static constexpr bool kBusyPinsRegion;       // a busy block pins its region's free bytes
//   L(Upstream*, std::size_t capacity, const Tuning&, SlotPool* nodes);
//   std::uint8_t HeapFor(std::size_t rounded) const;                  // hot: which FreeIndex
//   std::size_t Unreleasable(const Block*) const;                     // hot: free, kept bytes
//   std::size_t LargestRequest(std::uint8_t heap, std::size_t run) const;  // of a free run
//   void Segment(const Region*, const Block*, BlockInfo*) const;      // Lookup's segment
//   UpstreamStatus Grow(Core&, rounded, retry, Block**, std::uintptr_t*);  // mu_ held
//   std::size_t Release(Core&, std::size_t want);                     // mu_ held, bins merged
//   void GiveBack(Core&);                                             // the destructor's
// The layouts are friends: they grow and shrink regions through the core's block helpers.
//
// Quick reuse (the hot path): a block freed with a fence goes, once the fence completed (at once
// for kSettledFence) and unmerged, into a bin of its exact size, and the next request of that size
// takes it back as it is: no merge, no best fit, no split. (A free with no fence merges at once:
// what a replay measures.) Bins are merged back into the free index before the pool would ask the
// upstream for more, before it gives memory back, and under pressure, so they never make it hold
// more than best fit over merged blocks would.
//
// Thread safety: every Pool operation takes one mutex; PendingBytesRelaxed reads an atomic.
// Errors: PoolStatus; no operation throws, and none touches the heap on the cached path
// (SlotPool and AddrMap reserve ahead with new(std::nothrow)).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <string_view>

#include "addr_map.h"
#include "free_index.h"
#include "pool_internal.h"
#include "slot_pool.h"
#include "vramscope/pool/pool.h"

namespace vramscope::pool::internal {

inline std::size_t RoundUp(std::size_t bytes, std::size_t unit) {
  return (bytes + unit - 1) / unit * unit;
}
inline std::size_t RoundDown(std::size_t bytes, std::size_t unit) { return bytes / unit * unit; }

// L: VmmLayout or SegmentLayout (the layout interface above).
template <typename L>
class CachingPool final : public Pool {
 public:
  inline CachingPool(Upstream* upstream, FenceTracker* fences, const PoolOptions& options,
                     const Tuning& tuning);
  inline ~CachingPool() override;

  PoolStatus Allocate(std::size_t size, std::uintptr_t* address) override {
    return AllocateSized(size, address, nullptr);
  }
  PoolStatus AllocateSized(std::size_t size, std::uintptr_t* address, BlockSizes* sizes) override {
    return AllocateImpl(size, address, sizes, /*may_grow=*/true);
  }
  PoolStatus AllocateCached(std::size_t size, std::uintptr_t* address, BlockSizes* sizes) override {
    return AllocateImpl(size, address, sizes, /*may_grow=*/false);
  }
  PoolStatus Free(std::uintptr_t address, std::uint64_t fence) override {
    return FreeSized(address, fence, nullptr);
  }
  inline PoolStatus FreeSized(std::uintptr_t address, std::uint64_t fence,
                              BlockSizes* sizes) override;
  inline PoolStatus Lookup(std::uintptr_t address, BlockInfo* info) const override;
  inline std::size_t ReleaseIdle() override;
  inline void DrainPending() override;
  inline PoolStats Stats() const override;
  std::size_t PendingBytesRelaxed() const override {
    return pending_bytes_.load(std::memory_order_relaxed);
  }
  std::string_view policy() const override { return L::kName; }

 private:
  // Members are inline, Grow noinline, so that GCC's inliner folds the cached path into
  // Allocate and Free (without `inline`, the -fPIC build kept FindCached, Carve and
  // ReserveScratch as calls). Those the layouts use are defined below the class; the rest in
  // caching_pool.cc, which alone uses them.
  friend L;
  struct QuickBin {
    std::size_t size = 0;   // of every block in the bin (when count != 0)
    Block* head = nullptr;  // last in, first out, through link_next
    std::uint32_t count = 0;
  };
  static constexpr unsigned kQuickBinBits = 6;

  // --- Allocation path (caching_pool.cc) ---
  inline PoolStatus AllocateImpl(std::size_t size, std::uintptr_t* address, BlockSizes* sizes,
                                 bool may_grow);
  inline bool FindCached(std::size_t rounded, Block** block, std::uintptr_t* position);
  // Cold (the upstream, pressure): kept out of AllocateImpl so that its hot steps inline.
  __attribute__((noinline)) PoolStatus Grow(std::size_t rounded, Block** block,
                                            std::uintptr_t* position);
  inline PoolStatus FailOom(std::size_t rounded);
  inline Block* Carve(Block* block, std::uintptr_t position, std::size_t size);
  inline std::size_t ReleaseIdleLocked(std::size_t want);

  // --- Quick bins ---
  static inline std::size_t QuickIndex(std::size_t rounded);
  inline void ReleaseToQuick(Block* b);
  inline Block* TakeQuick(std::size_t rounded);
  inline void FlushQuick();

  // --- Fences ---
  inline void PollPending(std::size_t max_fences, bool to_quick = true);
  inline void WaitOldest();
  inline void AddPending(std::ptrdiff_t delta);
  inline void ReleasePending(Block* b, bool to_quick);

  // --- Blocks, regions, accounting (also the layouts' tools) ---
  bool ReserveScratch();
  Block* NewBlock();
  Block* SplitAt(Block* b, std::uintptr_t at);
  static Block*& PageOf(std::uintptr_t addr, Region* region) {
    return region->pages[(addr - region->base) >> region->page_shift];
  }
  void Unlink(Block* b);
  void Absorb(Block* b, Block* upper);
  Block* MergeFreeNeighbours(Block* b);
  inline void MakeFree(Block* b);
  void InsertFree(Block* b);
  void UpdateFree(Block* b, std::uintptr_t addr, std::size_t size);
  void RemoveFree(Block* b);
  inline void BusyInc(Region* region);
  inline void BusyDec(Region* region);
  void AddReserved(std::size_t bytes);
  bool OverCapacity(std::size_t more) const {
    return capacity_ != 0 && (reserved_ > capacity_ || more > capacity_ - reserved_);
  }
  inline std::size_t LargestFree() const;
  static Region* NewRegion(std::size_t bytes, std::uint8_t heap);
  static void DeleteRegion(Region* region);

  Upstream* const upstream_;
  FenceTracker* const fences_;
  const bool in_order_;  // fences_->CompletesInOrder()
  const bool retire_;    // fences_->NeedsRetire(): fence_refs_ is kept
  const Tuning tuning_;
  const std::size_t capacity_;

  mutable std::mutex mu_;
  SlotPool blocks_;
  SlotPool nodes_;
  FreeIndex heaps_[2];  // L::HeapFor picks one
  std::map<std::uintptr_t, Region*, std::less<>,
           SlotAllocator<std::pair<const std::uintptr_t, Region*>>>
      regions_;
  L layout_;            // after nodes_: its containers take nodes from it
  AddrMap live_;        // address -> Block*
  AddrMap fence_refs_;  // fence -> pending blocks waiting on it
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

// --- Blocks and regions: the layouts' tools, here so that they inline everywhere ---

template <typename L>
inline bool CachingPool<L>::ReserveScratch() {
  // Worst single step: two remainders into the ordered index, one region node, a few blocks.
  return nodes_.Reserve(8) && blocks_.Reserve(8);
}

template <typename L>
inline Block* CachingPool<L>::NewBlock() {
  // Reserved by ReserveScratch; a null here means the host heap is gone.
  void* raw = blocks_.Take();
  if (raw == nullptr) std::abort();
  return new (raw) Block();
}

// Splits `b` at `at`; returns the new upper block (same state, heap and region).
template <typename L>
inline Block* CachingPool<L>::SplitAt(Block* b, std::uintptr_t at) {
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

// Takes `b` out of the address list and the page map and drops it (its bytes now belong to
// a neighbour).
template <typename L>
inline void CachingPool<L>::Unlink(Block* b) {
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
template <typename L>
inline void CachingPool<L>::Absorb(Block* b, Block* upper) {
  b->size += upper->size;
  Unlink(upper);
}

template <typename L>
inline Block* CachingPool<L>::MergeFreeNeighbours(Block* b) {
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

template <typename L>
inline void CachingPool<L>::InsertFree(Block* b) {
  b->state = BlockState::kFree;
  heaps_[b->heap].Insert(b);
  b->region->free_bytes += b->size;
  unreleasable_ += layout_.Unreleasable(b);
}

// Moves or resizes a free block that stays free and indexed.
template <typename L>
inline void CachingPool<L>::UpdateFree(Block* b, std::uintptr_t addr, std::size_t size) {
  unreleasable_ -= layout_.Unreleasable(b);
  b->region->free_bytes = b->region->free_bytes - b->size + size;
  heaps_[b->heap].Update(b, addr, size);
  unreleasable_ += layout_.Unreleasable(b);
}

template <typename L>
inline void CachingPool<L>::RemoveFree(Block* b) {
  heaps_[b->heap].Remove(b);
  b->region->free_bytes -= b->size;
  unreleasable_ -= layout_.Unreleasable(b);
}

template <typename L>
inline void CachingPool<L>::AddReserved(std::size_t bytes) {
  reserved_ += bytes;
  peak_reserved_ = std::max(peak_reserved_, reserved_);
}

template <typename L>
inline Region* CachingPool<L>::NewRegion(std::size_t bytes, std::uint8_t heap) {
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

template <typename L>
inline void CachingPool<L>::DeleteRegion(Region* region) {
  std::free(region->pages);
  std::free(region->edges);
  delete region;
}

}  // namespace vramscope::pool::internal
