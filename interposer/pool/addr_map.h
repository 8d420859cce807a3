// An open-addressing hash map from a non-zero 64-bit key to a 64-bit value (linear probing,
// backward-shift deletion). Used for address -> live block and fence -> pending count: O(1) on
// the hot path, and it only touches the heap when it grows (Reserve, new(std::nothrow)).
//
// Thread safety: none; the Pool's lock covers it.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <new>

namespace vramscope::pool::internal {

class AddrMap {
 public:
  AddrMap() = default;
  AddrMap(const AddrMap&) = delete;
  AddrMap& operator=(const AddrMap&) = delete;
  ~AddrMap() { delete[] slots_; }

  // Ensures `extra` more keys fit at a load of at most 1/2. False when the heap is out.
  bool Reserve(std::size_t extra) {
    const std::size_t want = size_ + extra;
    if (slots_ != nullptr && want * 2 <= mask_ + 1) return true;
    return Grow(want);
  }

  // `key` must be absent and room reserved.
  void Insert(std::uint64_t key, std::uint64_t value) {
    std::size_t i = Hash(key) & mask_;
    while (slots_[i].key != 0) i = (i + 1) & mask_;
    slots_[i] = {key, value};
    ++size_;
  }

  std::uint64_t* Find(std::uint64_t key) {
    if (slots_ == nullptr || key == 0) return nullptr;
    for (std::size_t i = Hash(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i].value;
      if (slots_[i].key == 0) return nullptr;
    }
  }
  const std::uint64_t* Find(std::uint64_t key) const {
    return const_cast<AddrMap*>(this)->Find(key);
  }

  bool Erase(std::uint64_t key) {
    std::uint64_t value = 0;
    return Take(key, &value);
  }

  // Erase that hands back the value: one probe where Find then Erase would take two.
  bool Take(std::uint64_t key, std::uint64_t* value) {
    if (slots_ == nullptr || key == 0) return false;
    std::size_t i = Hash(key) & mask_;
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) return false;
      i = (i + 1) & mask_;
    }
    *value = slots_[i].value;
    // Backward shift: pull later entries of the probe run into the hole when their home slot
    // does not lie cyclically in (hole, j].
    for (std::size_t j = (i + 1) & mask_; slots_[j].key != 0; j = (j + 1) & mask_) {
      const std::size_t home = Hash(slots_[j].key) & mask_;
      const bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
      if (!stays) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = {0, 0};
    --size_;
    return true;
  }

  std::size_t size() const { return size_; }

 private:
  // Rehashes into a table where `want` keys fit (the rare part of Reserve, out of its way).
  bool Grow(std::size_t want) {
    std::size_t capacity = slots_ == nullptr ? 64 : (mask_ + 1);
    while (want * 2 > capacity) capacity *= 2;
    Slot* fresh = new (std::nothrow) Slot[capacity]();
    if (fresh == nullptr) return false;
    Slot* old = slots_;
    const std::size_t old_capacity = slots_ == nullptr ? 0 : mask_ + 1;
    slots_ = fresh;
    mask_ = capacity - 1;
    shift_ = 64 - static_cast<unsigned>(std::countr_zero(capacity));
    size_ = 0;
    for (std::size_t i = 0; i < old_capacity; ++i) {
      if (old[i].key != 0) Insert(old[i].key, old[i].value);
    }
    delete[] old;
    return true;
  }

  struct Slot {
    std::uint64_t key;
    std::uint64_t value;
  };
  // Fibonacci hashing, top bits: device addresses are strided (512 B .. 2 MiB apart) and
  // fences count up; a multiply keeping the low bits maps such keys onto a few slots and builds
  // long probe runs, the top bits of key * 2^64/phi spread them evenly.
  std::size_t Hash(std::uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_);
  }

  Slot* slots_ = nullptr;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  std::size_t size_ = 0;
};

}  // namespace vramscope::pool::internal
