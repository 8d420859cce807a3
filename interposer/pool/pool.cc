// First, trivially correct pool: every Allocate is one upstream Allocate, every Free waits for
// its fence and gives the memory straight back. Replaced by the caching policies.
#include "vramscope/pool/pool.h"

#include <algorithm>
#include <map>
#include <mutex>

namespace vramscope::pool {
namespace {

constexpr std::size_t kRound = 512;

class PassthroughPool final : public Pool {
 public:
  PassthroughPool(Upstream* upstream, FenceTracker* fences, const PoolOptions& options)
      : upstream_(upstream), fences_(fences), options_(options) {}

  PoolStatus Allocate(std::size_t size, std::uintptr_t* address) override {
    if (size == 0 || address == nullptr ||
        (options_.capacity_bytes != 0 && size > options_.capacity_bytes)) {
      return PoolStatus::kInvalidArgument;
    }
    const std::size_t rounded = (size + kRound - 1) / kRound * kRound;
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.upstream_grow_calls;
    UpstreamStatus status = upstream_->Allocate(rounded, address);
    if (status != UpstreamStatus::kOk) {
      ++stats_.oom_count;
      stats_.last_oom_verdict = OomVerdict::kCapacity;
      return status == UpstreamStatus::kOutOfMemory ? PoolStatus::kOutOfMemory
                                                    : PoolStatus::kUpstreamError;
    }
    live_[*address] = {size, rounded};
    ++stats_.alloc_count;
    ++stats_.live_blocks;
    stats_.current_requested_bytes += size;
    stats_.current_allocated_bytes += rounded;
    stats_.current_reserved_bytes += rounded;
    stats_.peak_requested_bytes =
        std::max(stats_.peak_requested_bytes, stats_.current_requested_bytes);
    stats_.peak_allocated_bytes =
        std::max(stats_.peak_allocated_bytes, stats_.current_allocated_bytes);
    stats_.peak_reserved_bytes =
        std::max(stats_.peak_reserved_bytes, stats_.current_reserved_bytes);
    return PoolStatus::kOk;
  }

  PoolStatus Free(std::uintptr_t address, std::uint64_t fence) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(address);
    if (it == live_.end()) return PoolStatus::kInvalidAddress;
    if (fence != 0) {
      fences_->Wait(fence);
      fences_->Retire(fence);
    }
    ++stats_.upstream_shrink_calls;
    if (upstream_->Free(address, it->second.second) != UpstreamStatus::kOk) {
      return PoolStatus::kUpstreamError;
    }
    ++stats_.free_count;
    --stats_.live_blocks;
    stats_.current_requested_bytes -= it->second.first;
    stats_.current_allocated_bytes -= it->second.second;
    stats_.current_reserved_bytes -= it->second.second;
    live_.erase(it);
    return PoolStatus::kOk;
  }

  PoolStatus Lookup(std::uintptr_t address, BlockInfo* info) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.upper_bound(address);
    if (it == live_.begin()) return PoolStatus::kInvalidAddress;
    --it;
    if (address >= it->first + it->second.first) return PoolStatus::kInvalidAddress;
    *info = {it->first, it->second.first, it->second.second, it->first, it->second.second};
    return PoolStatus::kOk;
  }

  std::size_t ReleaseIdle() override { return 0; }
  void DrainPending() override {}
  PoolStats Stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  std::string_view policy() const override { return "segments"; }

 private:
  Upstream* upstream_;
  FenceTracker* fences_;
  PoolOptions options_;
  mutable std::mutex mu_;
  std::map<std::uintptr_t, std::pair<std::size_t, std::size_t>> live_;
  PoolStats stats_;
};

}  // namespace

const char* PoolStatusName(PoolStatus status) {
  switch (status) {
    case PoolStatus::kOk:
      return "ok";
    case PoolStatus::kOutOfMemory:
      return "out_of_memory";
    case PoolStatus::kInvalidAddress:
      return "invalid_address";
    case PoolStatus::kInvalidArgument:
      return "invalid_argument";
    case PoolStatus::kUpstreamError:
      return "upstream_error";
  }
  return "unknown";
}

std::string_view PolicyNames() { return "vmm,segments"; }

std::unique_ptr<Pool> MakePool(Upstream* upstream, FenceTracker* fences,
                               const PoolOptions& options) {
  if (!options.policy.empty() && options.policy != "vmm" && options.policy != "segments") {
    return nullptr;
  }
  return std::make_unique<PassthroughPool>(upstream, fences, options);
}

}  // namespace vramscope::pool
