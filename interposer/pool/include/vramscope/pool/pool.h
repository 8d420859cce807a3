// The pooled caching allocator behind the shim's cuMemAlloc_v2/cuMemFree_v2.
//
// A Pool serves any size from 1 byte to the whole device out of memory it takes from an
// Upstream, caches what is freed, and hands it out again once the free's fence has completed.
// Policies (PoolOptions::policy) choose the layout; every policy keeps the same contract and the
// same exact statistics (tests/pool/pool_contract_test.cc runs every policy through it).
//
// Thread safety: all methods may be called concurrently from any thread.
// Ownership: the Upstream and FenceTracker are borrowed and must outlive the Pool.
// Errors: PoolStatus; no exceptions escape, nothing aborts on bad input (an unknown address to
// Free is kInvalidAddress, which the shim turns into CUDA_ERROR_INVALID_VALUE).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "vramscope/pool/upstream.h"

namespace vramscope::pool {

// A free's fence that has already completed, for a caller that knows no queued work can touch
// the block (the shim's ordered reuse): the block goes straight to the quick bin of its size.
inline constexpr std::uint64_t kSettledFence = ~std::uint64_t{0};

enum class [[nodiscard]] PoolStatus{
    kOk = 0,
    kOutOfMemory,      // upstream OOM after releasing idle memory and retrying once
    kInvalidAddress,   // Free/Lookup of an address the pool did not hand out (or already freed)
    kInvalidArgument,  // size 0 or larger than the configured capacity
    kUpstreamError,    // the upstream failed with something other than OOM
};

const char* PoolStatusName(PoolStatus status);

enum class OomVerdict : std::uint8_t {
  kNone = 0,
  kFragmentation,  // free bytes >= request, but no free block large enough
  kCapacity,       // not enough free bytes in total
};

struct PoolOptions {
  // Name of the layout policy; see PolicyNames(). Empty = the default.
  std::string_view policy;
  // Upper bound on bytes held from the upstream (0 = unlimited, the upstream decides).
  std::size_t capacity_bytes = 0;
  // Fenced frees of a size come back to the next request of that size unmerged (quick bins).
  bool quick_reuse = true;
  // vmm: the soft cap on mapped bytes counts bytes waiting for their fence as in use.
  bool cap_counts_pending = true;
};

// Every figure is exact at the moment Stats() is called (taken under the pool's lock).
struct PoolStats {
  // requested: sum of sizes the callers asked for; allocated: after rounding;
  // reserved: held from the upstream (mapped bytes for the virtual-memory policy).
  std::uint64_t current_requested_bytes = 0;
  std::uint64_t peak_requested_bytes = 0;
  std::uint64_t current_allocated_bytes = 0;
  std::uint64_t peak_allocated_bytes = 0;
  std::uint64_t current_reserved_bytes = 0;
  std::uint64_t peak_reserved_bytes = 0;
  std::uint64_t largest_free_block_bytes =
      0;                                      // largest request that succeeds with no upstream call
  std::uint64_t free_bytes = 0;               // reserved - allocated (cached, pending included)
  std::uint64_t pending_bytes = 0;            // freed, fence not yet complete
  std::uint64_t unreleasable_free_bytes = 0;  // free bytes in segments that hold live blocks
  std::uint64_t live_blocks = 0;
  std::uint64_t alloc_count = 0;
  std::uint64_t free_count = 0;
  std::uint64_t upstream_grow_calls = 0;    // requests to the upstream for more memory
  std::uint64_t upstream_shrink_calls = 0;  // requests to give memory back
  std::uint64_t upstream_retries = 0;       // retries after an upstream OOM
  std::uint64_t oom_count = 0;              // allocations that finally failed
  OomVerdict last_oom_verdict = OomVerdict::kNone;
  std::uint64_t fence_waits = 0;  // blocking waits on fences under memory pressure
};

// Where a live allocation sits inside the memory the pool holds.
struct BlockInfo {
  std::uintptr_t address = 0;       // what Allocate returned
  std::size_t requested = 0;        // the caller's size
  std::size_t allocated = 0;        // after rounding
  std::uintptr_t segment_base = 0;  // start of the upstream allocation (or mapped range) holding it
  std::size_t segment_size = 0;     // segments: the whole segment; vmm: the granules under it
};

// The sizes of one block, for callers that record allocations (the shim's event ring).
struct BlockSizes {
  std::size_t requested = 0;
  std::size_t allocated = 0;  // after rounding
};

class Pool {
 public:
  virtual ~Pool() = default;

  // Serves `size` bytes (1 .. capacity). On upstream OOM: releases idle cached memory, waits for
  // pending fences if that could help, retries once; then kOutOfMemory with the verdict in Stats().
  virtual PoolStatus Allocate(std::size_t size, std::uintptr_t* address) = 0;
  // Frees what Allocate returned; the block is reusable once `fence` completes (0 = now, merged
  // with its free neighbours; kSettledFence = now, kept whole for the next request of its size).
  virtual PoolStatus Free(std::uintptr_t address, std::uint64_t fence) = 0;
  // Allocate and Free that also report the block's sizes (`sizes` may be null), at no extra
  // cost: Lookup would take the lock again and walk the page's blocks.
  virtual PoolStatus AllocateSized(std::size_t size, std::uintptr_t* address,
                                   BlockSizes* sizes) = 0;
  virtual PoolStatus FreeSized(std::uintptr_t address, std::uint64_t fence, BlockSizes* sizes) = 0;
  // AllocateSized from memory the pool already holds (after polling fences): kOutOfMemory,
  // with nothing recorded, where AllocateSized would have to ask the upstream. For a caller
  // that would rather complete fences (synchronise) than grow.
  virtual PoolStatus AllocateCached(std::size_t size, std::uintptr_t* address,
                                    BlockSizes* sizes) = 0;
  // Finds the live allocation containing `address` (interior pointers included, up to the
  // rounded size); freed and pending blocks are kInvalidAddress.
  virtual PoolStatus Lookup(std::uintptr_t address, BlockInfo* info) const = 0;
  // Gives every idle byte it can back to the upstream (waiting for no fence); returns bytes freed.
  virtual std::size_t ReleaseIdle() = 0;
  // Waits for every pending fence (cuCtxSynchronize-style full wait), making all frees reusable.
  virtual void DrainPending() = 0;
  virtual PoolStats Stats() const = 0;
  // Bytes freed but waiting for their fence, read without the lock (a moment old under
  // concurrency): for the caller's hot-path decisions, where Stats() would cost a lock.
  virtual std::size_t PendingBytesRelaxed() const = 0;
  // The layout in use: "vmm" asked of an upstream without VMM reports "segments".
  virtual std::string_view policy() const = 0;
};

// Comma-separated policy names, the default first.
std::string_view PolicyNames();

// nullptr when `options.policy` names no policy.
std::unique_ptr<Pool> MakePool(Upstream* upstream, FenceTracker* fences,
                               const PoolOptions& options);

}  // namespace vramscope::pool
