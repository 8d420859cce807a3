// Test helpers for the pool: a fence tracker the test drives, and a reader for the bundled
// allocation traces (traces/README.md) with a replay that reports the ratio and upstream calls.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "vramscope/pool/pool.h"
#include "vramscope/pool/upstream.h"

namespace vramscope::pool::testing {

// Fences complete only when the test says so. Wait() completes the fence (what a real
// cuEventSynchronize achieves) and records that it blocked.
class FakeFences final : public FenceTracker {
 public:
  bool IsComplete(std::uint64_t fence) override {
    ++is_complete_calls;
    return complete.count(fence) != 0;
  }
  void Wait(std::uint64_t fence) override {
    waited.push_back(fence);
    complete.insert(fence);
  }
  void Retire(std::uint64_t fence) override { retired.push_back(fence); }

  void Complete(std::uint64_t fence) { complete.insert(fence); }
  bool CompletesInOrder() const override { return in_order; }
  bool NeedsRetire() const override { return needs_retire; }

  bool in_order = false;  // claim in-order completion (the test then completes in order)
  bool needs_retire = true;
  std::set<std::uint64_t> complete;
  std::vector<std::uint64_t> waited;
  std::vector<std::uint64_t> retired;
  std::uint64_t is_complete_calls = 0;
};

// Fences are epochs: fence f is complete once the test has completed every epoch up to f.
// Thread-safe, for the stress tests.
class EpochFences final : public FenceTracker {
 public:
  bool IsComplete(std::uint64_t fence) override { return fence <= completed.load(); }
  void Wait(std::uint64_t fence) override {
    std::uint64_t seen = completed.load();
    while (seen < fence && !completed.compare_exchange_weak(seen, fence)) {
    }
  }
  std::atomic<std::uint64_t> completed{0};
};

// The shim's fence scheme (interposer/shim/device_pools.h): frees are stamped with the current
// epoch, a synchronisation completes every epoch before it, in order, and nothing needs retiring.
// Single-threaded (benchmarks, replays).
class ShimEpochs final : public FenceTracker {
 public:
  bool IsComplete(std::uint64_t fence) override { return fence <= completed; }
  void Wait(std::uint64_t fence) override { completed = std::max(completed, fence); }
  bool CompletesInOrder() const override { return true; }
  bool NeedsRetire() const override { return false; }
  // A synchronisation: every free stamped so far becomes reusable.
  void Sync() { completed = epoch++; }
  std::uint64_t epoch = 1;
  std::uint64_t completed = 0;
};

// Forwards to a VirtualUpstream and answers the next `fail_grows` grow calls (Allocate, Map)
// with kOutOfMemory, like a device where someone else took the memory for a moment.
class FlakyUpstream final : public Upstream {
 public:
  explicit FlakyUpstream(Upstream* inner) : inner_(inner) {}
  UpstreamStatus Allocate(std::size_t bytes, std::uintptr_t* address) override {
    if (Fail()) return UpstreamStatus::kOutOfMemory;
    return inner_->Allocate(bytes, address);
  }
  UpstreamStatus Free(std::uintptr_t address, std::size_t bytes) override {
    return inner_->Free(address, bytes);
  }
  std::size_t MapGranularity() const override { return inner_->MapGranularity(); }
  std::size_t TotalBytes() const override { return inner_->TotalBytes(); }
  bool UnmapsPartialMaps() const override { return inner_->UnmapsPartialMaps(); }
  UpstreamStatus ReserveRange(std::size_t bytes, std::uintptr_t* address) override {
    return inner_->ReserveRange(bytes, address);
  }
  UpstreamStatus ReleaseRange(std::uintptr_t address, std::size_t bytes) override {
    return inner_->ReleaseRange(address, bytes);
  }
  UpstreamStatus Map(std::uintptr_t address, std::size_t bytes) override {
    if (Fail()) return UpstreamStatus::kOutOfMemory;
    return inner_->Map(address, bytes);
  }
  UpstreamStatus Unmap(std::uintptr_t address, std::size_t bytes) override {
    return inner_->Unmap(address, bytes);
  }

  int fail_grows = 0;

 private:
  bool Fail() {
    if (fail_grows == 0) return false;
    --fail_grows;
    return true;
  }
  Upstream* inner_;
};

struct TraceEvent {
  bool alloc = false;
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
};

// Reads `alloc` and `free_requested` rows; false if the file cannot be read.
inline bool ReadTrace(const std::string& path, std::vector<TraceEvent>* events) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) return false;
  char line[4096];
  bool header = true;
  while (gzgets(file, line, sizeof(line)) != nullptr) {
    if (header) {
      header = false;
      continue;
    }
    const std::string row(line);
    const std::size_t c1 = row.find(',');
    const std::size_t c2 = row.find(',', c1 + 1);
    const std::size_t c3 = row.find(',', c2 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos || c3 == std::string::npos) continue;
    const std::string action = row.substr(0, c1);
    if (action != "alloc" && action != "free_requested") continue;
    TraceEvent event;
    event.alloc = action == "alloc";
    event.addr = std::strtoull(row.c_str() + c1 + 1, nullptr, 10);
    event.size = std::strtoull(row.c_str() + c2 + 1, nullptr, 10);
    events->push_back(event);
  }
  gzclose(file);
  return true;
}

struct ReplayResult {
  std::uint64_t allocs = 0;
  std::uint64_t peak_live = 0;
  std::uint64_t failures = 0;
  PoolStats stats;
  double Ratio() const {
    return peak_live == 0
               ? 0.0
               : static_cast<double>(stats.peak_reserved_bytes) / static_cast<double>(peak_live);
  }
  std::uint64_t UpstreamCalls() const {
    return stats.upstream_grow_calls + stats.upstream_shrink_calls;
  }
};

// Replays the trace through `pool` with every free complete at once (fence 0).
inline ReplayResult Replay(const std::vector<TraceEvent>& events, Pool* pool) {
  ReplayResult result;
  std::unordered_map<std::uint64_t, std::pair<std::uintptr_t, std::uint64_t>> live;
  std::uint64_t live_bytes = 0;
  for (const TraceEvent& event : events) {
    if (event.alloc) {
      ++result.allocs;
      std::uintptr_t address = 0;
      if (pool->Allocate(event.size, &address) != PoolStatus::kOk) {
        ++result.failures;
        continue;
      }
      live[event.addr] = {address, event.size};
      live_bytes += event.size;
      result.peak_live = std::max(result.peak_live, live_bytes);
    } else {
      auto it = live.find(event.addr);
      if (it == live.end()) continue;
      if (pool->Free(it->second.first, 0) != PoolStatus::kOk) ++result.failures;
      live_bytes -= it->second.second;
      live.erase(it);
    }
  }
  result.stats = pool->Stats();
  return result;
}

}  // namespace vramscope::pool::testing
