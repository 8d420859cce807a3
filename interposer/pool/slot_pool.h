// Fixed-size slots carved from slabs, and an STL allocator over them.
//
// The pool's containers (the ordered free index, the region map) must not allocate from the
// heap on the hot path, and an allocation failure must not throw inside a CUDA hook. So every
// public Pool operation first calls Reserve(n) (which may take a new slab with new(std::nothrow)
// and reports failure as a status); the containers then take only reserved slots. Slabs are
// never given back before the SlotPool dies.
//
// Thread safety: none; the Pool's lock covers it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace vramscope::pool::internal {

class SlotPool {
 public:
  explicit SlotPool(std::size_t slot_size)
      : slot_size_((slot_size + kAlign - 1) / kAlign * kAlign) {}
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;
  ~SlotPool() {
    while (slabs_ != nullptr) {
      Slab* next = slabs_->next;
      ::operator delete (static_cast<void*>(slabs_), std::align_val_t{kAlign});
      slabs_ = next;
    }
  }

  // Ensures `count` slots can be taken without touching the heap. False when the heap is out.
  bool Reserve(std::size_t count) {
    while (free_count_ < count) {
      if (!AddSlab()) return false;
    }
    return true;
  }

  // A reserved slot; with none reserved, a slab is taken now (nullptr if the heap is out).
  void* Take() {
    if (free_ == nullptr && !AddSlab()) return nullptr;
    Slot* slot = free_;
    free_ = slot->next;
    --free_count_;
    return slot;
  }

  void Give(void* p) {
    Slot* slot = static_cast<Slot*>(p);
    slot->next = free_;
    free_ = slot;
    ++free_count_;
  }

  std::size_t slot_size() const { return slot_size_; }

 private:
  static constexpr std::size_t kAlign = 16;
  static constexpr std::size_t kSlotsPerSlab = 256;
  struct Slot {
    Slot* next;
  };
  struct alignas(kAlign) Slab {
    Slab* next;
  };

  bool AddSlab() {
    const std::size_t header = sizeof(Slab);
    void* raw = ::operator new (header + slot_size_ * kSlotsPerSlab, std::align_val_t{kAlign},
                                std::nothrow);
    if (raw == nullptr) return false;
    Slab* slab = static_cast<Slab*>(raw);
    slab->next = slabs_;
    slabs_ = slab;
    char* first = static_cast<char*>(raw) + header;
    for (std::size_t i = kSlotsPerSlab; i-- > 0;) Give(first + i * slot_size_);
    return true;
  }

  std::size_t slot_size_;
  Slot* free_ = nullptr;
  std::size_t free_count_ = 0;
  Slab* slabs_ = nullptr;
};

// Allocator for node-based containers (std::set, std::map): one node per allocate() call.
template <typename T>
class SlotAllocator {
 public:
  using value_type = T;

  explicit SlotAllocator(SlotPool* slots) : slots_(slots) {}
  template <typename U>
  SlotAllocator(const SlotAllocator<U>& other) : slots_(other.slots()) {}  // NOLINT

  T* allocate(std::size_t n) {
    void* p = (n == 1 && sizeof(T) <= slots_->slot_size()) ? slots_->Take() : nullptr;
    // Unreachable when the caller reserved as it must: the containers only allocate single
    // nodes that fit a slot. Crashing beats throwing through a CUDA hook.
    if (p == nullptr) std::abort();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t /*n*/) { slots_->Give(p); }

  SlotPool* slots() const { return slots_; }
  template <typename U>
  bool operator==(const SlotAllocator<U>& other) const {
    return slots_ == other.slots();
  }

 private:
  SlotPool* slots_;
};

}  // namespace vramscope::pool::internal
