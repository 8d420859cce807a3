// Address bookkeeping only: every check a driver would make, no memory behind the addresses.
#include "vramscope/pool/virtual_upstream.h"

#include <algorithm>
#include <iterator>

namespace vramscope::pool {
namespace {

std::size_t RoundUp(std::size_t bytes, std::size_t alignment) {
  return alignment == 0 ? bytes : (bytes + alignment - 1) / alignment * alignment;
}

}  // namespace

VirtualUpstream::VirtualUpstream(const VirtualUpstreamOptions& options)
    : options_(options), next_address_(options.base_address) {
  if (options_.alignment == 0) options_.alignment = 512;
}

std::uintptr_t VirtualUpstream::TakeAddress(std::size_t bytes) {
  // Addresses are never reused; a gap of one alignment unit between allocations makes an
  // off-by-one-past-the-end pointer unambiguous in tests.
  const std::uintptr_t address = RoundUp(next_address_, options_.alignment);
  next_address_ = address + RoundUp(bytes, options_.alignment) + options_.alignment;
  return address;
}

bool VirtualUpstream::Fits(std::size_t bytes) const {
  return options_.capacity_bytes == 0 ||
         (counters_.current_physical_bytes <= options_.capacity_bytes &&
          bytes <= options_.capacity_bytes - counters_.current_physical_bytes);
}

void VirtualUpstream::AddPhysical(std::size_t bytes) {
  counters_.current_physical_bytes += bytes;
  counters_.peak_physical_bytes =
      std::max(counters_.peak_physical_bytes, counters_.current_physical_bytes);
}

UpstreamStatus VirtualUpstream::Allocate(std::size_t bytes, std::uintptr_t* address) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.allocate_calls;
  if (bytes == 0 || address == nullptr) {
    ++counters_.invalid_calls;
    return UpstreamStatus::kInvalidArgument;
  }
  if (!Fits(bytes)) {
    ++counters_.oom_count;
    return UpstreamStatus::kOutOfMemory;
  }
  *address = TakeAddress(bytes);
  allocations_.emplace(*address, bytes);
  AddPhysical(bytes);
  return UpstreamStatus::kOk;
}

UpstreamStatus VirtualUpstream::Free(std::uintptr_t address, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.free_calls;
  auto it = allocations_.find(address);
  if (it == allocations_.end() || it->second != bytes) {
    ++counters_.invalid_calls;
    return UpstreamStatus::kInvalidArgument;
  }
  counters_.current_physical_bytes -= bytes;
  allocations_.erase(it);
  return UpstreamStatus::kOk;
}

UpstreamStatus VirtualUpstream::ReserveRange(std::size_t bytes, std::uintptr_t* address) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.reserve_calls;
  if (options_.granularity == 0) return UpstreamStatus::kNotSupported;
  if (bytes == 0 || address == nullptr || bytes % options_.granularity != 0) {
    ++counters_.invalid_calls;
    return UpstreamStatus::kInvalidArgument;
  }
  *address = TakeAddress(bytes);
  ranges_[*address].bytes = bytes;
  counters_.current_reserved_va_bytes += bytes;
  return UpstreamStatus::kOk;
}

UpstreamStatus VirtualUpstream::ReleaseRange(std::uintptr_t address, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.release_calls;
  if (options_.granularity == 0) return UpstreamStatus::kNotSupported;
  auto it = ranges_.find(address);
  // cuMemAddressFree of a range that still has mappings is an error.
  if (it == ranges_.end() || it->second.bytes != bytes || !it->second.mapped.empty()) {
    ++counters_.invalid_calls;
    return UpstreamStatus::kInvalidArgument;
  }
  counters_.current_reserved_va_bytes -= bytes;
  ranges_.erase(it);
  return UpstreamStatus::kOk;
}

VirtualUpstream::Range* VirtualUpstream::FindRange(std::uintptr_t address, std::size_t bytes) {
  if (bytes == 0 || address % options_.granularity != 0 || bytes % options_.granularity != 0) {
    return nullptr;
  }
  auto it = ranges_.upper_bound(address);
  if (it == ranges_.begin()) return nullptr;
  --it;
  if (address + bytes > it->first + it->second.bytes) return nullptr;
  return &it->second;
}

UpstreamStatus VirtualUpstream::Map(std::uintptr_t address, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.map_calls;
  if (options_.granularity == 0) return UpstreamStatus::kNotSupported;
  Range* range = FindRange(address, bytes);
  if (range == nullptr) {
    ++counters_.invalid_calls;
    return UpstreamStatus::kInvalidArgument;
  }
  // No overlap with an existing mapping.
  auto next = range->mapped.lower_bound(address);
  if (next != range->mapped.end() && next->first < address + bytes) {
    ++counters_.invalid_calls;
    return UpstreamStatus::kInvalidArgument;
  }
  if (next != range->mapped.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > address) {
      ++counters_.invalid_calls;
      return UpstreamStatus::kInvalidArgument;
    }
  }
  if (!Fits(bytes)) {
    ++counters_.oom_count;
    return UpstreamStatus::kOutOfMemory;
  }
  const std::size_t piece = MapPieceBytes(bytes);
  for (std::uintptr_t at = address; at < address + bytes;) {
    const std::uintptr_t stop = PieceEnd(at, address + bytes, piece);  // one mapping per piece
    range->mapped.emplace(at, stop - at);
    ++counters_.mapped_pieces;
    at = stop;
  }
  AddPhysical(bytes);
  return UpstreamStatus::kOk;
}

UpstreamStatus VirtualUpstream::Unmap(std::uintptr_t address, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.unmap_calls;
  if (options_.granularity == 0) return UpstreamStatus::kNotSupported;
  Range* range = FindRange(address, bytes);
  if (range == nullptr) {
    ++counters_.invalid_calls;
    return UpstreamStatus::kInvalidArgument;
  }
  // Every byte of [address, end) must be mapped: walk the mappings that overlap it.
  const std::uintptr_t end = address + bytes;
  auto it = range->mapped.upper_bound(address);
  if (it != range->mapped.begin()) --it;
  std::uintptr_t covered = address;
  for (auto scan = it; scan != range->mapped.end() && scan->first < end; ++scan) {
    if (scan->first + scan->second <= covered) continue;
    if (scan->first > covered) break;
    covered = scan->first + scan->second;
  }
  if (covered < end) {
    ++counters_.invalid_calls;
    return UpstreamStatus::kInvalidArgument;
  }
  if (!options_.allow_partial_unmap) {
    // cuMemUnmap: "the range must be the entire contiguous address range that was mapped".
    for (auto scan = it; scan != range->mapped.end() && scan->first < end; ++scan) {
      const std::uintptr_t stop = scan->first + scan->second;
      if (stop <= address) continue;
      if (scan->first < address || stop > end) {
        ++counters_.invalid_calls;
        return UpstreamStatus::kInvalidArgument;
      }
    }
  }
  // Cut the overlapping mappings, keeping the parts outside [address, end).
  while (it != range->mapped.end() && it->first < end) {
    const std::uintptr_t start = it->first;
    const std::uintptr_t stop = start + it->second;
    if (stop <= address) {
      ++it;
      continue;
    }
    it = range->mapped.erase(it);
    if (start < address) range->mapped.emplace(start, address - start);
    if (stop > end) it = range->mapped.emplace(end, stop - end).first;
  }
  counters_.current_physical_bytes -= bytes;
  return UpstreamStatus::kOk;
}

VirtualUpstreamCounters VirtualUpstream::Counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

void VirtualUpstream::SetCapacity(std::size_t capacity_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  options_.capacity_bytes = capacity_bytes;
}

}  // namespace vramscope::pool
