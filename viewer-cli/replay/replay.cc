#include "replay/replay.h"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "vramscope/pool/virtual_upstream.h"

namespace vramscope::cli {
namespace {

using vramscope::pool::FenceTracker;
using vramscope::pool::Pool;
using vramscope::pool::PoolStatus;
using vramscope::pool::VirtualUpstream;

// Replays use fence token 0 ("already complete"), which the pool never passes to its tracker;
// this one exists because the pool requires a tracker, and answers "complete" if asked anyway.
class CompletedFences final : public FenceTracker {
 public:
  bool IsComplete(std::uint64_t /*fence*/) override { return true; }
  void Wait(std::uint64_t /*fence*/) override {}
};

// Operations between two progress reports (and, in timed runs, between two clock reads: the
// clock costs ~20 ns, amortised to nothing over a batch).
constexpr std::size_t kBatch = std::size_t{64} * 1024;
constexpr int kMaxTimedRuns = 5;
constexpr std::chrono::milliseconds kTimingBudget(250);

// A pool and its upstream, destroyed in the right order (the pool first).
struct PoolUnderTest {
  VirtualUpstream upstream;
  CompletedFences fences;
  std::unique_ptr<Pool> pool;
};

absl::StatusOr<std::unique_ptr<PoolUnderTest>> MakePoolUnderTest(std::string_view policy) {
  auto under_test = std::make_unique<PoolUnderTest>();
  vramscope::pool::PoolOptions options;
  options.policy = policy;
  under_test->pool = vramscope::pool::MakePool(&under_test->upstream, &under_test->fences, options);
  if (under_test->pool == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("unknown policy '%s' (known: %s)", policy, vramscope::pool::PolicyNames()));
  }
  return under_test;
}

absl::Status FreeFailed(const ReplayOp& op, PoolStatus status) {
  return absl::InternalError(
      absl::StrFormat("the pool refused to free allocation #%d (%d bytes): %s; this is a pool bug",
                      op.slot, op.size, vramscope::pool::PoolStatusName(status)));
}

}  // namespace

absl::StatusOr<ReplayResult> ReplayTrace(const LoadedTrace& trace, std::string_view policy,
                                         const ReplayProgress& progress) {
  const std::vector<ReplayOp>& ops = trace.ops;
  std::vector<std::uintptr_t> addresses(trace.alloc_events, 0);  // by slot; 0 = not allocated
  ReplayResult result;

  // Measured run.
  {
    absl::StatusOr<std::unique_ptr<PoolUnderTest>> made = MakePoolUnderTest(policy);
    if (!made.ok()) return made.status();
    PoolUnderTest& t = **made;
    result.policy = std::string(t.pool->policy());
    std::uint64_t physical_high = 0;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const ReplayOp& op = ops[i];
      if (op.is_free) {
        if (addresses[op.slot] == 0) continue;  // its alloc failed
        PoolStatus status = t.pool->Free(addresses[op.slot], 0);
        if (status != PoolStatus::kOk) return FreeFailed(op, status);
        addresses[op.slot] = 0;
      } else {
        PoolStatus status = t.pool->Allocate(op.size, &addresses[op.slot]);
        if (status != PoolStatus::kOk) {
          addresses[op.slot] = 0;
          ++result.failed_allocs;
          continue;
        }
        // Reserved bytes only grow inside an upstream call; the upstream's counter says when
        // they reach a new high, and only then is the pool asked for its (costlier) statistics.
        std::uint64_t physical = t.upstream.Counters().current_physical_bytes;
        if (physical > physical_high) {
          physical_high = physical;
          vramscope::pool::PoolStats stats = t.pool->Stats();
          result.free_bytes_at_peak = stats.free_bytes;
          result.largest_free_block_at_peak =
              std::min(stats.largest_free_block_bytes, stats.free_bytes);
          result.fragmentation_at_peak =
              stats.free_bytes == 0 ? 0.0
                                    : 1.0 - static_cast<double>(result.largest_free_block_at_peak) /
                                                static_cast<double>(stats.free_bytes);
        }
      }
      if (progress && i % kBatch == kBatch - 1) {
        progress("replay", static_cast<double>(i) / static_cast<double>(ops.size()));
      }
    }
    result.stats = t.pool->Stats();
    result.upstream_peak_physical_bytes = t.upstream.Counters().peak_physical_bytes;
  }

  // Timed runs: only the pool's calls (and a vector walk) inside the clock.
  std::chrono::nanoseconds best = std::chrono::nanoseconds::max();
  std::chrono::nanoseconds total(0);
  int planned_runs = 1;  // for the progress bar: re-estimated after the first run
  while (result.timed_runs < kMaxTimedRuns && (result.timed_runs == 0 || total < kTimingBudget)) {
    std::fill(addresses.begin(), addresses.end(), 0);
    absl::StatusOr<std::unique_ptr<PoolUnderTest>> made = MakePoolUnderTest(policy);
    if (!made.ok()) return made.status();
    Pool& pool = *(*made)->pool;
    std::chrono::nanoseconds run(0);
    for (std::size_t begin = 0; begin < ops.size(); begin += kBatch) {
      const std::size_t end = std::min(ops.size(), begin + kBatch);
      const auto start = std::chrono::steady_clock::now();
      for (std::size_t i = begin; i < end; ++i) {
        const ReplayOp& op = ops[i];
        if (op.is_free) {
          if (addresses[op.slot] == 0) continue;
          if (PoolStatus status = pool.Free(addresses[op.slot], 0); status != PoolStatus::kOk) {
            return FreeFailed(op, status);
          }
        } else if (pool.Allocate(op.size, &addresses[op.slot]) != PoolStatus::kOk) {
          addresses[op.slot] = 0;
        }
      }
      run += std::chrono::steady_clock::now() - start;
      if (progress) {
        progress("timing", (static_cast<double>(result.timed_runs) +
                            static_cast<double>(end) / static_cast<double>(ops.size())) /
                               planned_runs);
      }
    }
    ++result.timed_runs;
    total += run;
    best = std::min(best, run);
    if (result.timed_runs == 1) {
      const auto per_run = std::max<std::chrono::nanoseconds::rep>(run.count(), 1);
      planned_runs = static_cast<int>(std::clamp<std::chrono::nanoseconds::rep>(
          (std::chrono::nanoseconds(kTimingBudget).count() + per_run - 1) / per_run, 1,
          kMaxTimedRuns));
    }
  }
  result.ns_per_event =
      ops.empty() ? 0.0 : static_cast<double>(best.count()) / static_cast<double>(ops.size());
  return result;
}

}  // namespace vramscope::cli
