// The segments layout: growing by whole segments, and giving idle ones back.
#include "segment_layout.h"

#include "caching_pool.h"

namespace vramscope::pool::internal {

UpstreamStatus SegmentLayout::Grow(Core& core, std::size_t rounded, bool /*retry*/, Block** block,
                                   std::uintptr_t* position) {
  const Tuning& tuning = core.tuning_;
  const std::uint8_t heap = HeapFor(rounded);
  std::size_t bytes = heap == 0 ? tuning.small_segment_bytes
                      : rounded <= tuning.large_exact_above_bytes
                          ? tuning.large_segment_bytes
                          : RoundUp(rounded, tuning.segment_round_bytes);
  if (core.OverCapacity(bytes)) {
    bytes = RoundUp(rounded, tuning.segment_round_bytes);  // the least that serves it
    if (core.OverCapacity(bytes)) return UpstreamStatus::kOutOfMemory;
  }
  Region* region = Core::NewRegion(bytes, heap);
  if (region == nullptr) return UpstreamStatus::kOutOfMemory;
  std::uintptr_t base = 0;
  ++core.stats_.upstream_grow_calls;
  const UpstreamStatus status = core.upstream_->Allocate(bytes, &base);
  if (status != UpstreamStatus::kOk) {
    Core::DeleteRegion(region);
    return status;
  }
  region->base = base;
  core.regions_.emplace(base, region);
  core.AddReserved(bytes);
  Block* b = core.NewBlock();
  b->addr = base;
  b->size = bytes;
  b->region = region;
  b->heap = heap;
  region->pages[0] = b;
  core.InsertFree(b);
  *block = b;
  *position = base;
  return UpstreamStatus::kOk;
}

std::size_t SegmentLayout::Release(Core& core, std::size_t /*want*/) {
  std::size_t released = 0;
  for (auto it = core.regions_.begin(); it != core.regions_.end();) {
    Region* region = it->second;
    if (region->busy_blocks != 0) {
      ++it;
      continue;
    }
    Block* b = region->pages[0];  // an idle segment is one free block
    ++core.stats_.upstream_shrink_calls;
    if (core.upstream_->Free(region->base, region->size) != UpstreamStatus::kOk) {
      ++it;
      continue;
    }
    core.RemoveFree(b);
    core.blocks_.Give(b);
    released += region->size;
    core.reserved_ -= region->size;
    it = core.regions_.erase(it);
    Core::DeleteRegion(region);
  }
  return released;
}

void SegmentLayout::GiveBack(Core& core) {
  for (auto& [base, region] : core.regions_) (void)core.upstream_->Free(base, region->size);
}

}  // namespace vramscope::pool::internal
