// DriverUpstream: a pool's memory source, the driver behind it, and the setup that chooses it
// (VMM or cuMemAlloc segments, granularity, the peers granted access).
//
// Thread safety: every member may be called from any thread (`mu_` guards the books; the driver
// is called outside it). Errors: the pool::Upstream calls answer pool::UpstreamStatus, and the
// CUresult of the last failed driver call on this thread is kept for LastUpstreamError.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include <cuda.h>

#include "config.h"
#include "counters.h"
#include "vramscope/pool/upstream.h"

namespace vramscope::interposer {

class EpochFences;

// The pool's memory source: cuMemAlloc_v2/cuMemFree_v2 segments, or with VMM
// cuMemAddressReserve + cuMemCreate/cuMemMap per piece (MapPieceBytes: one physical handle per
// piece, so the pool can give back any run of whole pieces) and one cuMemSetAccess per Map (the
// handles are released right after mapping, so cuMemUnmap alone returns the memory). Every call
// runs in a DriverCallScope on the slot's context. Remembers what it holds so the shim can tell its
// memory from the application's (OwnsAddress).
class DriverUpstream final : public pool::Upstream {
 public:
  // `piece`: the smallest physical handle (Config::vmm_piece_bytes; 0 or below the granularity:
  // one handle per mapping).
  void Configure(CUcontext ctx, int device, bool vmm, std::size_t granularity,
                 const CUmemAccessDesc* access, int access_count, std::size_t piece = 0);
  // The context is being torn down: never call the driver for this memory again. cuMemAlloc
  // segments belong to the context and go with it. VMM memory belongs to the device and
  // outlives the context, so its mappings and ranges are given back here (errors ignored),
  // after waiting for the context's queued work when it is still alive (`context_alive`: a
  // reset about to happen), so no kernel still running touches an unmapped page.
  void Abandon(bool context_alive);
  bool vmm() const { return vmm_; }
  // True once after the upstream took memory from the driver or gave some back: the shim then
  // writes a POOL_STATE record (outside the pool's lock, which is held around these calls).
  bool TakeStateDue() {
    return state_due_.load(std::memory_order_relaxed) &&
           state_due_.exchange(false, std::memory_order_relaxed);
  }
  // True if `address` lies in a segment or reserved range this upstream holds.
  bool OwnsAddress(std::uintptr_t address) const;
  // The slot's fences: memory goes back to the driver only once no settled free's work runs.
  void SetFences(class EpochFences* fences) { fences_ = fences; }

  // IPC (ipc.h): the handle type new physical memory is created with (set before the first
  // Map), and the mappings that tile [address, address + bytes), in address order, into `out`
  // (for ipc_export.cc). Returns how many, or -1 if they do not tile it or exceed
  // `capacity`.
  // A device that reports the type but refuses to create such memory turns it off for good.
  void SetShareableType(CUmemAllocationHandleType type) {
    shareable_.store(type, std::memory_order_relaxed);
  }
  CUmemAllocationHandleType shareable_type() const {
    return shareable_.load(std::memory_order_relaxed);
  }
  int MappingsCovering(std::uintptr_t address, std::size_t bytes,
                       std::pair<std::uintptr_t, std::size_t>* out, int capacity) const;

  pool::UpstreamStatus Allocate(std::size_t bytes, std::uintptr_t* address) override;
  pool::UpstreamStatus Free(std::uintptr_t address, std::size_t bytes) override;
  std::size_t MapGranularity() const override { return vmm_ ? granularity_ : 0; }
  std::size_t MapPieceBytes(std::size_t map_bytes) const override {
    return pool::PieceBytesFor(piece_, map_bytes);
  }
  pool::UpstreamStatus ReserveRange(std::size_t bytes, std::uintptr_t* address) override;
  pool::UpstreamStatus ReleaseRange(std::uintptr_t address, std::size_t bytes) override;
  pool::UpstreamStatus Map(std::uintptr_t address, std::size_t bytes) override;
  pool::UpstreamStatus Unmap(std::uintptr_t address, std::size_t bytes) override;

  // Deferred unmaps. With GPU-side waits (stream_fence.h) a free block may still be in use by
  // work queued before its handover, so memory could go back to the driver only after a context
  // synchronisation, which would cost the program its lead over the GPU at every unmap. Instead
  // Unmap keeps such pieces mapped (and counted as reserved) until every owed round up to the
  // newest at the time (EpochFences::OwedToCover) is retired; ReapDeferred then unmaps them. The
  // helper thread calls it as it retires rounds (a deferral wakes it), Map on its way. A Map takes
  // back the deferred pieces inside one window of its own pieces (TakeBackDeferred), maps the
  // memory of one of the same size elsewhere at its new address (MapDeferred), so the memory is
  // not held twice while the GPU catches up, and synchronises and unmaps them all first only where
  // one lies across its range or a window's edge, or where the driver refuses it while some are
  // deferred (FlushDeferred). True while pieces wait.
  bool HasDeferred() const { return deferred_count_.load(std::memory_order_acquire) != 0; }
  // Unmaps the deferred pieces whose rounds are retired; every one with `all` (the caller made
  // sure the GPU passed them). Any thread.
  void ReapDeferred(bool all);
  // What wakes the helper thread when a piece is deferred (the lifecycle passes it down:
  // WakeFenceWorker); without one, pieces wait for the next Map, Unmap or poll.
  static void SetDeferredWaker(void (*wake)());

 private:
  struct Deferred {
    std::uintptr_t address;
    std::size_t bytes;
    std::uint64_t gen;  // the newest owed round when the pool unmapped it
    bool aliased;       // its memory is mapped elsewhere too now (MapDeferred)
  };
  pool::UpstreamStatus MapPieces(std::uintptr_t address, std::size_t bytes);
  // Maps the physical memory of a deferred piece of exactly `bytes` at `address` as well, instead
  // of creating new memory: as safe as handing the block over, since work that reaches the new
  // address pays every owed round first (stream_fence.h). Never a piece inside the mapping being
  // made, [map_start, map_start + map_bytes), which TakeBackDeferred takes back where it is.
  // True if it did.
  bool MapDeferred(std::uintptr_t address, std::size_t bytes, std::uintptr_t map_start,
                   std::size_t map_bytes);
  // Keeps `count` pieces mapped until the owed rounds up to `gen` are retired.
  void Defer(const std::pair<std::uintptr_t, std::size_t>* ranges, int count, std::uint64_t gen);
  // True if a deferred piece overlaps [address, address + bytes) other than inside it and inside
  // one window of `piece` bytes (0: any overlap), or more than kMaxMapPieces lie inside.
  bool DeferredOverlaps(std::uintptr_t address, std::size_t bytes, std::size_t piece) const;
  // The deferred piece that starts at `address` and ends by `limit`, still mapped, taken back for
  // a Map: its bytes, or 0 if there is none.
  std::size_t TakeBackDeferred(std::uintptr_t address, std::uintptr_t limit);
  // The first deferred piece's start after `after` and before `limit`, else `limit`.
  std::uintptr_t NextDeferredStart(std::uintptr_t after, std::uintptr_t limit) const;
  // Synchronises the context as memory given back requires, then unmaps every deferred piece.
  void FlushDeferred();
  bool Usable() const;
  // cuMemUnmap of one mapping while the context is usable; CUDA_SUCCESS otherwise or once the
  // driver is deinitialised.
  CUresult UnmapOne(std::uintptr_t address, std::size_t bytes);
  // cuMemCreate + cuMemMap of one piece (the handle released once mapped); the driver's result.
  CUresult MapOne(CUmemAllocationProp* prop, std::uintptr_t address, std::size_t bytes);
  static constexpr int kMaxMapPieces = static_cast<int>(pool::kMaxPiecesPerMap) + 2;
  pool::UpstreamStatus FromDriver(CUresult result);
  // Ring records and counters for memory taken from / given back to the driver.
  void Reserved(std::uintptr_t address, std::size_t bytes);
  void Released(std::uintptr_t address, std::size_t bytes);

  CUcontext ctx_ = nullptr;
  class EpochFences* fences_ = nullptr;
  int device_ = 0;
  bool vmm_ = false;
  std::size_t granularity_ = 0;
  std::size_t piece_ = 0;                     // the smallest piece (0: one physical handle per Map)
  CUmemAccessDesc access_[kMaxDevices] = {};  // the owning device first, then its peers
  int access_count_ = 0;
  std::atomic<CUmemAllocationHandleType> shareable_{CU_MEM_HANDLE_TYPE_NONE};
  std::atomic<bool> dead_{false};
  std::atomic<bool> state_due_{false};
  mutable pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;
  std::map<std::uintptr_t, std::size_t> held_;    // segments or reserved ranges
  std::map<std::uintptr_t, std::size_t> mapped_;  // VMM mappings
  // Held around the deferred pieces' list and their unmaps (never with mu_).
  mutable pthread_mutex_t deferred_mu_ = PTHREAD_MUTEX_INITIALIZER;
  std::vector<Deferred> deferred_;
  std::atomic<int> deferred_count_{0};
};

// The VMM/peer setup of a new pool on `device` (its context current): the policy ("vmm" where the
// device and the driver support virtual memory management and VRAMSCOPE_VMM allows it, else
// "segments"; Config::policy overrides), the map granularity and every peer that can access the
// device (granted access, so pooled memory behaves like cuMemAlloc memory); configures
// `upstream` with them, VMM memory shareable for IPC where the device allows (ipc.h). Writes the
// policy's name into `policy` (at least 32 bytes) and returns the granularity found (for the log
// line; 0 when none was asked).
std::size_t ConfigureDriverUpstream(DriverUpstream* upstream, CUcontext ctx, int device,
                                    const Config& config, char* policy);

// The CUresult of the last failed driver call made by an upstream on this thread;
// ClearUpstreamError resets it before a pooled allocation.
CUresult LastUpstreamError();
void ClearUpstreamError();

}  // namespace vramscope::interposer
