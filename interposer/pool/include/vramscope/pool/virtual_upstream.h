// An Upstream that only does address bookkeeping: no memory behind the addresses it hands out.
//
// Used by the unit tests and `vramscope replay` to run the pool without a GPU. It enforces the
// rules a driver would (Free only what Allocate returned, Map only granule-aligned unmapped ranges
// inside a reserved range, ...) and reports violations as kInvalidArgument, so tests catch a pool
// that would misuse the driver. Physical bytes (Allocate + Map) are limited by `capacity_bytes`;
// exceeding it is kOutOfMemory, like the device running out.
//
// Thread safety: all methods may be called concurrently (one internal mutex).
// Errors: UpstreamStatus, never exceptions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "vramscope/pool/upstream.h"

namespace vramscope::pool {

struct VirtualUpstreamOptions {
  // Physical bytes available (Allocate + Map together); 0 = unlimited.
  std::size_t capacity_bytes = 0;
  // Map granularity; 0 = an upstream without virtual-memory support (Map etc. are kNotSupported).
  std::size_t granularity = std::size_t{2} << 20;
  // Alignment of the addresses Allocate and ReserveRange return (cudaMalloc gives 512 at least).
  std::size_t alignment = std::size_t{2} << 20;
  // UnmapsPartialMaps(): Unmap may cut a Map in parts (a driver upstream with one handle per
  // granule). False: only whole Maps, adjacent ones together, anything else is kInvalidArgument.
  bool allow_partial_unmap = true;
  // The smallest piece (without allow_partial_unmap; a power of two): each Map is recorded as
  // pieces cut at the multiples of PieceBytesFor(this, its size), as the shim's driver upstream
  // creates one handle per piece; 0: whole Maps.
  std::size_t map_piece_bytes = 0;
  // First address handed out; addresses are never reused, so stale pointers are always detected.
  std::uintptr_t base_address = std::uintptr_t{0x7f0000000000};
};

// Call counters; every call is counted, failed ones included.
struct VirtualUpstreamCounters {
  std::uint64_t allocate_calls = 0;
  std::uint64_t free_calls = 0;
  std::uint64_t reserve_calls = 0;
  std::uint64_t release_calls = 0;
  std::uint64_t map_calls = 0;
  // Physical handles the Maps made (one per piece; one per Map without pieces): the driver's
  // cuMemCreate + cuMemMap pairs a driver upstream would make.
  std::uint64_t mapped_pieces = 0;
  std::uint64_t unmap_calls = 0;
  std::uint64_t oom_count = 0;               // calls answered kOutOfMemory
  std::uint64_t invalid_calls = 0;           // calls answered kInvalidArgument (a pool bug)
  std::uint64_t current_physical_bytes = 0;  // allocated + mapped
  std::uint64_t peak_physical_bytes = 0;
  std::uint64_t current_reserved_va_bytes = 0;

  std::uint64_t GrowCalls() const { return allocate_calls + reserve_calls + map_calls; }
  std::uint64_t ShrinkCalls() const { return free_calls + release_calls + unmap_calls; }
};

class VirtualUpstream final : public Upstream {
 public:
  explicit VirtualUpstream(const VirtualUpstreamOptions& options = {});

  UpstreamStatus Allocate(std::size_t bytes, std::uintptr_t* address) override;
  UpstreamStatus Free(std::uintptr_t address, std::size_t bytes) override;
  std::size_t MapGranularity() const override { return options_.granularity; }
  std::size_t TotalBytes() const override { return options_.capacity_bytes; }
  UpstreamStatus ReserveRange(std::size_t bytes, std::uintptr_t* address) override;
  UpstreamStatus ReleaseRange(std::uintptr_t address, std::size_t bytes) override;
  bool UnmapsPartialMaps() const override { return options_.allow_partial_unmap; }
  std::size_t MapPieceBytes(std::size_t map_bytes) const override {
    return options_.allow_partial_unmap ? 0 : PieceBytesFor(options_.map_piece_bytes, map_bytes);
  }
  // Unmap must cover whole Maps (adjacent ones together) unless allow_partial_unmap.
  UpstreamStatus Map(std::uintptr_t address, std::size_t bytes) override;
  UpstreamStatus Unmap(std::uintptr_t address, std::size_t bytes) override;

  VirtualUpstreamCounters Counters() const;
  // Changes the capacity (tests use it to simulate memory taken by someone else).
  void SetCapacity(std::size_t capacity_bytes);

 private:
  struct Range {
    std::size_t bytes = 0;
    std::map<std::uintptr_t, std::size_t> mapped;  // disjoint, granule-aligned, not coalesced
  };

  std::uintptr_t TakeAddress(std::size_t bytes);
  bool Fits(std::size_t bytes) const;
  void AddPhysical(std::size_t bytes);
  Range* FindRange(std::uintptr_t address, std::size_t bytes);

  mutable std::mutex mu_;
  VirtualUpstreamOptions options_;
  std::uintptr_t next_address_;
  std::map<std::uintptr_t, std::size_t> allocations_;
  std::map<std::uintptr_t, Range> ranges_;
  VirtualUpstreamCounters counters_;
};

}  // namespace vramscope::pool
