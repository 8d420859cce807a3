// Blocks, regions and the best-fit index of free blocks.
//
// A Region is one contiguous range the pool holds: a segment from Upstream::Allocate, or the
// whole reserved address range of the virtual-memory policy. Its Blocks tile it in address order
// (prev/next), each live, pending (freed, fence not complete), free (mapped, reusable) or
// unmapped (address space only, virtual-memory policy).
//
// FreeIndex finds the best fit (the smallest free block >= the request, lowest address among
// equals in the ordered part) without scanning blocks: sizes are multiples of 512, so requests up
// to kMaxBinBytes have one exact bin each, found through a two-level bitmap in O(1); larger free
// blocks live in a std::set ordered by (size, address) whose nodes come from a SlotPool.
// Cost on the cached hot path: one bitmap probe and a list unlink, about a dozen instructions.
//
// Thread safety: none; the Pool's lock covers it.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <set>

#include "slot_pool.h"

namespace vramscope::pool::internal {

inline constexpr std::size_t kRoundBytes = 512;
inline constexpr std::size_t kBinCount = 2048;  // exact bins for 512 B .. 1 MiB
inline constexpr std::size_t kMaxBinBytes = kBinCount * kRoundBytes;

// kQuick: freed, fence complete, waiting unmerged in an exact-size bin of the caching pool.
enum class BlockState : std::uint8_t { kFree, kLive, kPending, kUnmapped, kQuick };

struct Block;
struct Region;

struct SizeKey {
  std::size_t size;
  std::uintptr_t addr;
};

struct BySizeAddr {
  using is_transparent = void;
  bool operator()(const Block* a, const Block* b) const;
  bool operator()(const Block* a, const SizeKey& b) const;
  bool operator()(const SizeKey& a, const Block* b) const;
};

using BlockSet = std::set<Block*, BySizeAddr, SlotAllocator<Block*>>;

struct Block {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  Block* prev = nullptr;  // address neighbours inside the region
  Block* next = nullptr;
  Block* link_prev = nullptr;  // bin list, pending FIFO or quick bin
  Block* link_next = nullptr;
  BlockSet::iterator where{};  // free and large: its node in the ordered index
  Region* region = nullptr;
  std::size_t requested = 0;  // live: the caller's size
  std::uint64_t fence = 0;    // pending: what must complete first
  BlockState state = BlockState::kFree;
  std::uint8_t heap = 0;
};

inline bool BySizeAddr::operator()(const Block* a, const Block* b) const {
  return a->size != b->size ? a->size < b->size : a->addr < b->addr;
}
inline bool BySizeAddr::operator()(const Block* a, const SizeKey& b) const {
  return a->size != b.size ? a->size < b.size : a->addr < b.addr;
}
inline bool BySizeAddr::operator()(const SizeKey& a, const Block* b) const {
  return a.size != b->size ? a.size < b->size : a.addr < b->addr;
}

struct Region {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  std::size_t busy_blocks = 0;  // live + pending
  std::size_t free_bytes = 0;   // in kFree blocks
  Block** pages = nullptr;      // per page: the lowest block starting in it (Lookup only)
  std::size_t page_count = 0;
  unsigned page_shift = 0;
  std::uint8_t heap = 0;
  std::uint64_t* edges = nullptr;  // virtual memory: Map chunk edges, one bit per granule
};

class FreeIndex {
 public:
  explicit FreeIndex(SlotPool* nodes) : large_(BySizeAddr{}, SlotAllocator<Block*>(nodes)) {}

  // `block->size` is a non-zero multiple of kRoundBytes. Inserting a large block takes one node.
  void Insert(Block* block) {
    ++count_;
    bytes_ += block->size;
    if (block->size > kMaxBinBytes) {
      block->where = large_.insert(block).first;
      return;
    }
    const std::size_t bin = block->size / kRoundBytes - 1;
    Block* head = heads_[bin];
    block->link_prev = nullptr;
    block->link_next = head;
    if (head != nullptr) head->link_prev = block;
    heads_[bin] = block;
    words_[bin / 64] |= std::uint64_t{1} << (bin % 64);
    summary_ |= std::uint64_t{1} << (bin / 64);
  }

  void Remove(Block* block) {
    --count_;
    bytes_ -= block->size;
    if (block->size > kMaxBinBytes) {
      large_.erase(block->where);
      return;
    }
    const std::size_t bin = block->size / kRoundBytes - 1;
    if (block->link_prev != nullptr) {
      block->link_prev->link_next = block->link_next;
    } else {
      heads_[bin] = block->link_next;
    }
    if (block->link_next != nullptr) block->link_next->link_prev = block->link_prev;
    if (heads_[bin] == nullptr) {
      words_[bin / 64] &= ~(std::uint64_t{1} << (bin % 64));
      if (words_[bin / 64] == 0) summary_ &= ~(std::uint64_t{1} << (bin / 64));
    }
  }

  // Moves or resizes an indexed block. The common cases (a large block that keeps its rank, a
  // small one that stays in its bin) touch no tree node: the hot path of carving the front off a
  // large free block, and of merging a freed block back into it, costs a few compares.
  void Update(Block* block, std::uintptr_t addr, std::size_t size) {
    const bool was_large = block->size > kMaxBinBytes;
    const bool now_large = size > kMaxBinBytes;
    if (was_large && now_large) {
      // Only the side it moves towards can break the order: down when it shrinks (or moves
      // down at equal size), up when it grows.
      const bool down = size < block->size || (size == block->size && addr < block->addr);
      bytes_ = bytes_ - block->size + size;
      block->addr = addr;
      block->size = size;
      const auto it = block->where;
      bool ordered;
      if (down) {
        ordered = it == large_.begin() || BySizeAddr{}(*std::prev(it), block);
      } else {
        const auto after = std::next(it);
        ordered = after == large_.end() || BySizeAddr{}(block, *after);
      }
      if (!ordered) {
        // Erasing by iterator compares nothing, so the changed key is harmless here.
        large_.erase(it);
        block->where = large_.insert(block).first;
      }
      return;
    }
    if (!was_large && !now_large && block->size == size) {
      block->addr = addr;
      return;
    }
    Remove(block);
    block->addr = addr;
    block->size = size;
    Insert(block);
  }

  // The smallest free block of at least `size` bytes (a multiple of kRoundBytes), or nullptr.
  Block* BestFit(std::size_t size) const {
    if (size <= kMaxBinBytes) {
      const std::size_t bin = size / kRoundBytes - 1;
      std::size_t word = bin / 64;
      std::uint64_t bits = words_[word] & (~std::uint64_t{0} << (bin % 64));
      if (bits == 0) {
        const std::uint64_t later =
            word + 1 < kWords ? summary_ & (~std::uint64_t{0} << (word + 1)) : 0;
        if (later != 0) {
          word = static_cast<std::size_t>(std::countr_zero(later));
          bits = words_[word];
        }
      }
      if (bits != 0) return heads_[word * 64 + static_cast<std::size_t>(std::countr_zero(bits))];
    }
    auto it = large_.lower_bound(SizeKey{size, 0});
    return it == large_.end() ? nullptr : *it;
  }

  std::size_t Largest() const {
    if (!large_.empty()) return (*large_.rbegin())->size;
    if (summary_ == 0) return 0;
    const std::size_t word = 63 - static_cast<std::size_t>(std::countl_zero(summary_));
    const std::size_t bit = 63 - static_cast<std::size_t>(std::countl_zero(words_[word]));
    return (word * 64 + bit + 1) * kRoundBytes;
  }

  // Visits free blocks of at least `min_size` bytes, largest first, until `visit` returns false.
  // `visit` must not change the index; callers collect, then act.
  template <typename Visit>
  void ForEachLargestFirst(std::size_t min_size, Visit&& visit) const {
    for (auto it = large_.rbegin(); it != large_.rend(); ++it) {
      if ((*it)->size < min_size || !visit(*it)) return;
    }
    for (std::size_t bin = kBinCount; bin-- > 0;) {
      if ((bin + 1) * kRoundBytes < min_size) return;
      for (Block* b = heads_[bin]; b != nullptr; b = b->link_next) {
        if (!visit(b)) return;
      }
    }
  }

  std::size_t count() const { return count_; }
  std::size_t bytes() const { return bytes_; }

 private:
  static constexpr std::size_t kWords = kBinCount / 64;
  static_assert(kWords <= 64, "one summary word");

  Block* heads_[kBinCount] = {};
  std::uint64_t words_[kWords] = {};
  std::uint64_t summary_ = 0;
  BlockSet large_;
  std::size_t count_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace vramscope::pool::internal
