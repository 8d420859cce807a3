// The pool's view of where device memory comes from.
//
// The pool never calls CUDA: the shim gives it an Upstream backed by the driver
// (cuMemAlloc/cuMemFree, or cuMemAddressReserve/cuMemCreate/cuMemMap for the virtual-memory
// design), tests and `vramscope replay` give it a virtual one that only does address bookkeeping.
//
// Error convention: every call returns an UpstreamStatus; kOutOfMemory is the only failure the
// pool treats as recoverable (it releases idle memory and retries once). Implementations must be
// callable from any thread; the pool serialises its own calls per Pool instance.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vramscope::pool {

// The smallest piece of the shim's driver upstream by default (Upstream::MapPieceBytes(),
// VRAMSCOPE_VMM_PIECE), which `vramscope replay` models, and the most pieces one Map is cut into.
inline constexpr std::size_t kDefaultMapPieceBytes = std::size_t{64} << 20;
inline constexpr std::size_t kMaxPiecesPerMap = 64;

// The piece size of a Map of `map_bytes` for an upstream whose smallest piece is `least` (a
// power of two; 0: none): `least`, doubled until the Map holds at most kMaxPiecesPerMap of them,
// so a block inside one Map spans at most kMaxPiecesPerMap + 2 pieces (its IPC export sends one
// handle per piece) while small Maps give memory back granule by granule.
inline std::size_t PieceBytesFor(std::size_t least, std::size_t map_bytes) {
  if (least == 0) return 0;
  std::size_t piece = least;
  while (map_bytes / piece > kMaxPiecesPerMap) piece *= 2;
  return piece;
}

// The end of the piece of a Map ending at `end` that starts at `at`: the next multiple of `piece`
// after `at`, or `end` (piece 0: the whole Map is one piece).
inline std::uintptr_t PieceEnd(std::uintptr_t at, std::uintptr_t end, std::size_t piece) {
  if (piece == 0) return end;
  const std::uintptr_t next = (at / piece + 1) * piece;
  return next < end ? next : end;
}

enum class [[nodiscard]] UpstreamStatus{
    kOk = 0,
    kOutOfMemory,      // the device (or the virtual capacity) has no room
    kNotSupported,     // e.g. virtual-memory calls on an upstream without VMM
    kInvalidArgument,  // a caller bug: unknown address, zero size
    kError,            // anything else the driver reported
};

class Upstream {
 public:
  virtual ~Upstream() = default;

  // --- Plain segments (every upstream) ---------------------------------------------------------
  // Takes `bytes` of device memory at a fresh address (cuMemAlloc).
  virtual UpstreamStatus Allocate(std::size_t bytes, std::uintptr_t* address) = 0;
  // Gives back exactly what one Allocate returned.
  virtual UpstreamStatus Free(std::uintptr_t address, std::size_t bytes) = 0;
  // Physical bytes the device has (cuMemGetInfo total); 0 = unknown. The virtual-memory policy
  // sizes its reserved address range from it.
  virtual std::size_t TotalBytes() const { return 0; }

  // --- Virtual memory (optional) ---------------------------------------------------------------
  // Granularity of Map/Unmap in bytes (cuMemGetAllocationGranularity); 0 = no VMM support, in
  // which case the four calls below are never made.
  virtual std::size_t MapGranularity() const { return 0; }
  // Reserves address space only (cuMemAddressReserve); no memory is taken.
  virtual UpstreamStatus ReserveRange(std::size_t /*bytes*/, std::uintptr_t* /*address*/) {
    return UpstreamStatus::kNotSupported;
  }
  virtual UpstreamStatus ReleaseRange(std::uintptr_t /*address*/, std::size_t /*bytes*/) {
    return UpstreamStatus::kNotSupported;
  }
  // True when Unmap may take any granule-aligned mapped range: part of one Map, or spanning
  // several. A driver upstream offers this by creating one physical handle per granule in Map
  // (one cuMemSetAccess for the whole range), as PyTorch's expandable segments do. It lets the
  // pool return free granules wherever they are, which keeps reserved memory much closer to
  // live memory (traces/gpt2_train: 1.03 instead of 1.07 of peak).
  virtual bool UnmapsPartialMaps() const { return false; }
  // Without UnmapsPartialMaps(): a Map of `map_bytes` is backed by one physical handle per
  // piece, cut at every address that is a multiple of this (a power-of-two multiple of
  // MapGranularity(), PieceBytesFor), so Unmap may take any run of whole pieces, not only whole
  // Maps. 0: one handle per Map.
  virtual std::size_t MapPieceBytes(std::size_t /*map_bytes*/) const { return 0; }
  // Backs [address, address + bytes) with physical memory (cuMemCreate + cuMemMap +
  // cuMemSetAccess). Both are multiples of MapGranularity() inside a reserved range.
  virtual UpstreamStatus Map(std::uintptr_t /*address*/, std::size_t /*bytes*/) {
    return UpstreamStatus::kNotSupported;
  }
  // Returns the physical memory behind [address, address + bytes) (cuMemUnmap + cuMemRelease).
  // The range is granule-aligned and fully mapped. Unless UnmapsPartialMaps(), it is one or more
  // whole, adjacent ranges that earlier Map calls made (the pool then never unmaps part of one
  // Map, which the driver cannot do with one handle per Map).
  virtual UpstreamStatus Unmap(std::uintptr_t /*address*/, std::size_t /*bytes*/) {
    return UpstreamStatus::kNotSupported;
  }
};

// Reuse safety. Each free carries a fence token supplied by the caller (the shim: a CUDA event
// recorded on every stream that could touch the block, or an epoch of its device-wide sync);
// a freed block is not handed out again until IsComplete(fence) has returned true.
// Token 0 means "already complete" and is never passed to the tracker.
class FenceTracker {
 public:
  virtual ~FenceTracker() = default;
  // Cheap, non-blocking (cuEventQuery). Called in batches, oldest fence first.
  virtual bool IsComplete(std::uint64_t fence) = 0;
  // Blocks until the fence completes (cuEventSynchronize); used under memory pressure.
  virtual void Wait(std::uint64_t fence) = 0;
  // The pool no longer refers to `fence` (after it completed); the tracker may recycle it.
  virtual void Retire(std::uint64_t /*fence*/) {}
  // True if fences complete in the order they were issued (an epoch counter): once one is
  // found incomplete, every later one is too, so a poll may stop there.
  virtual bool CompletesInOrder() const { return false; }
  // False if Retire does nothing (an epoch counter has nothing to recycle): the pool then keeps
  // no per-fence reference counts.
  virtual bool NeedsRetire() const { return true; }
};

}  // namespace vramscope::pool
