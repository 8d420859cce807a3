#include "replay/replay.h"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <queue>
#include <utility>
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

// The fence models' tracker: a token per free (kEvents) or per synchronisation epoch
// (kDeviceSync), complete once the simulated host clock reached its ready time. Clocks: the host
// runs at the trace's times plus every wait so far (`waited_`); the GPU finishes the work queued
// at trace time t (host time t + W, W the waits before it) at t + max(lag, W): it runs `lag`
// behind the trace, and while the host waits it catches up instead of idling.
class ModelFences final : public FenceTracker {
 public:
  explicit ModelFences(const ReplayOptions& options) : options_(options) {}

  // The host clock: the trace time of the current event plus every wait so far.
  std::uint64_t now() const { return now_; }
  void Advance(std::uint64_t trace_time) {
    now_ = std::max(now_, trace_time + waited_);
    if (sync_in_flight_ && now_ >= sync_ready_) {
      completed_epoch_ = sync_epoch_;
      sync_in_flight_ = false;
    }
  }

  // A free at the current time; returns its token.
  std::uint64_t Free(const ReplayOp& op, ReplayResult* result) {
    if (PerFree()) {
      const std::uint64_t ready =
          std::max(op.time_us + std::max(options_.gpu_lag_us, waited_), op.completed_us + waited_);
      ready_.push_back(ready);
      queue_.push({ready, ready_.size()});
      return ready_.size();  // tokens start at 1
    }
    ++frees_since_;
    bytes_since_ += op.size;
    const std::uint64_t token = epoch_;
    if (!sync_in_flight_ &&
        (frees_since_ >= options_.batch_frees || bytes_since_ >= options_.batch_bytes)) {
      // The helper's cuCtxSynchronize: covers every free so far, returns `lag` later.
      sync_in_flight_ = true;
      sync_epoch_ = epoch_++;
      sync_ready_ = op.time_us + std::max(options_.gpu_lag_us, waited_);
      frees_since_ = 0;
      bytes_since_ = 0;
      ++result->fence_syncs;
      Advance(now_ - waited_);
    }
    return token;
  }

  // kEvents: the host waits for the oldest fence not yet complete; false if none is pending.
  bool WaitOldest(ReplayResult* result) {
    while (!queue_.empty() && queue_.top().first <= now_) queue_.pop();
    if (queue_.empty()) return false;
    const std::uint64_t ready = queue_.top().first;
    queue_.pop();
    result->host_wait_us += ready - now_;
    waited_ += ready - now_;
    now_ = ready;
    ++result->lag_waits;
    return true;
  }

  // kGpuWait: every free so far that is not yet complete becomes complete now (the shim issues a
  // round for the newest frees and hands all queued fences over as one), its order left to the
  // GPU; the host does not wait. False if none is pending.
  bool HandOverAll(ReplayResult* result) {
    while (!queue_.empty() && queue_.top().first <= now_) queue_.pop();
    if (queue_.empty()) return false;
    for (; !queue_.empty(); queue_.pop()) ready_[queue_.top().second - 1] = 0;
    ++result->handovers;
    return true;
  }

  bool IsComplete(std::uint64_t fence) override {
    if (PerFree()) return ready_[fence - 1] <= now_;
    return fence <= completed_epoch_;
  }
  void Wait(std::uint64_t fence) override {
    // Under pressure the shim synchronises: the host waits until the fence is ready.
    std::uint64_t ready = now_;
    if (PerFree()) {
      ready = std::max(ready, ready_[fence - 1]);
    } else if (fence > completed_epoch_) {
      ready = std::max(ready, sync_in_flight_ ? sync_ready_ : now_ + options_.gpu_lag_us);
      completed_epoch_ = std::max(completed_epoch_, fence);
    }
    waited_ += ready - now_;
    now_ = ready;
  }
  bool CompletesInOrder() const override { return options_.fence == FenceModel::kDeviceSync; }
  bool NeedsRetire() const override { return false; }

 private:
  // A token per free (the event fences, with host or GPU waits).
  bool PerFree() const {
    return options_.fence == FenceModel::kEvents || options_.fence == FenceModel::kGpuWait;
  }

  const ReplayOptions options_;
  std::uint64_t now_ = 0;
  std::uint64_t waited_ = 0;
  // kEvents, kGpuWait
  std::vector<std::uint64_t> ready_;
  std::priority_queue<std::pair<std::uint64_t, std::size_t>,
                      std::vector<std::pair<std::uint64_t, std::size_t>>, std::greater<>>
      queue_;
  // kDeviceSync
  std::uint64_t epoch_ = 1;
  std::uint64_t completed_epoch_ = 0;
  bool sync_in_flight_ = false;
  std::uint64_t sync_epoch_ = 0;
  std::uint64_t sync_ready_ = 0;
  std::uint64_t frees_since_ = 0;
  std::uint64_t bytes_since_ = 0;
};

// Operations between two progress reports (and, in timed runs, between two clock reads: the
// clock costs ~20 ns, amortised to nothing over a batch).
constexpr std::size_t kBatch = std::size_t{64} * 1024;
constexpr int kMaxTimedRuns = 5;
constexpr std::chrono::milliseconds kTimingBudget(250);

// A pool and its upstream, destroyed in the right order (the pool first).
struct PoolUnderTest {
  explicit PoolUnderTest(std::size_t map_piece_bytes)
      : upstream(vramscope::pool::VirtualUpstreamOptions{.allow_partial_unmap = false,
                                                         .map_piece_bytes = map_piece_bytes}) {}
  VirtualUpstream upstream;
  CompletedFences fences;
  std::unique_ptr<Pool> pool;
};

// Over an upstream that unmaps whole pieces of `map_piece_bytes` (the shim's driver upstream).
absl::StatusOr<std::unique_ptr<PoolUnderTest>> MakePoolUnderTest(std::string_view policy,
                                                                 std::size_t map_piece_bytes,
                                                                 FenceTracker* model = nullptr) {
  auto under_test = std::make_unique<PoolUnderTest>(map_piece_bytes);
  vramscope::pool::PoolOptions options;
  options.policy = policy;
  under_test->pool = vramscope::pool::MakePool(
      &under_test->upstream, model != nullptr ? model : &under_test->fences, options);
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

// The shim's floor of the lag and handover bounds (reuse_policy.h's kLagFloor).
constexpr std::uint64_t kLagFloor = std::uint64_t{16} << 20;

// The measured run: every op through a fresh pool (under the fence model, if any), peaks and
// fragmentation at peak into *result. Fails only on a pool bug (a refused free).
absl::Status MeasuredRun(const LoadedTrace& trace, std::string_view policy,
                         const ReplayProgress& progress, const ReplayOptions& options,
                         ReplayResult* result) {
  const std::vector<ReplayOp>& ops = trace.ops;
  std::vector<std::uintptr_t> addresses(trace.alloc_events, 0);  // by slot; 0 = not allocated
  const bool modelled = options.fence != FenceModel::kNone;
  ModelFences model(options);
  absl::StatusOr<std::unique_ptr<PoolUnderTest>> made =
      MakePoolUnderTest(policy, options.map_piece_bytes, modelled ? &model : nullptr);
  if (!made.ok()) return made.status();
  PoolUnderTest& t = **made;
  result->policy = std::string(t.pool->policy());
  std::uint64_t physical_high = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const ReplayOp& op = ops[i];
    if (modelled) model.Advance(op.time_us);
    if (op.is_free) {
      if (addresses[op.slot] == 0) continue;  // its alloc failed
      const std::uint64_t fence = modelled ? model.Free(op, result) : 0;
      PoolStatus status = t.pool->Free(addresses[op.slot], fence);
      if (status != PoolStatus::kOk) return FreeFailed(op, status);
      addresses[op.slot] = 0;
    } else {
      PoolStatus status = PoolStatus::kOutOfMemory;
      const bool gpu_wait = options.fence == FenceModel::kGpuWait;
      if (options.fence == FenceModel::kEvents || gpu_wait) {
        // The shim's lag and handover bounds (EventLagWait): wait for the oldest fences (or hand
        // them over to GPU-side waits) rather than grow.
        auto over = [&](std::uint64_t least, std::uint64_t fraction) {
          const std::uint64_t pending = t.pool->PendingBytesRelaxed();
          return fraction != 0 && pending >= least &&
                 pending >= t.upstream.Counters().current_physical_bytes / fraction;
        };
        // A host wait once what waits could serve the request alone; a handover (no host wait)
        // also before that.
        auto due = [&] {
          return over(std::max<std::uint64_t>(op.size, kLagFloor), options.lag_fraction) ||
                 (gpu_wait && over(kLagFloor, options.handover_fraction));
        };
        if (due()) {
          status = t.pool->AllocateCached(op.size, &addresses[op.slot], nullptr);
          auto next = [&] {
            return options.fence == FenceModel::kGpuWait ? model.HandOverAll(result)
                                                         : model.WaitOldest(result);
          };
          while (status != PoolStatus::kOk && due() && next()) {
            status = t.pool->AllocateCached(op.size, &addresses[op.slot], nullptr);
          }
        }
      }
      if (status != PoolStatus::kOk) status = t.pool->Allocate(op.size, &addresses[op.slot]);
      if (status != PoolStatus::kOk) {
        addresses[op.slot] = 0;
        ++result->failed_allocs;
        continue;
      }
      // Reserved bytes only grow inside an upstream call; the upstream's counter says when
      // they reach a new high, and only then is the pool asked for its (costlier) statistics.
      std::uint64_t physical = t.upstream.Counters().current_physical_bytes;
      if (physical > physical_high) {
        physical_high = physical;
        vramscope::pool::PoolStats stats = t.pool->Stats();
        result->free_bytes_at_peak = stats.free_bytes;
        result->largest_free_block_at_peak =
            std::min(stats.largest_free_block_bytes, stats.free_bytes);
        result->fragmentation_at_peak =
            stats.free_bytes == 0 ? 0.0
                                  : 1.0 - static_cast<double>(result->largest_free_block_at_peak) /
                                              static_cast<double>(stats.free_bytes);
      }
    }
    if (progress && i % kBatch == kBatch - 1) {
      progress("replay", static_cast<double>(i) / static_cast<double>(ops.size()));
    }
  }
  result->stats = t.pool->Stats();
  result->upstream_peak_physical_bytes = t.upstream.Counters().peak_physical_bytes;
  result->upstream_mapped_pieces = t.upstream.Counters().mapped_pieces;
  return absl::OkStatus();
}

// Timed runs: only the pool's calls (and a vector walk) inside the clock; the fastest run per
// event into result->ns_per_event.
absl::Status TimedRuns(const LoadedTrace& trace, std::string_view policy,
                       const ReplayProgress& progress, std::size_t map_piece_bytes,
                       ReplayResult* result) {
  const std::vector<ReplayOp>& ops = trace.ops;
  std::vector<std::uintptr_t> addresses(trace.alloc_events, 0);
  std::chrono::nanoseconds best = std::chrono::nanoseconds::max();
  std::chrono::nanoseconds total(0);
  int planned_runs = 1;  // for the progress bar: re-estimated after the first run
  while (result->timed_runs < kMaxTimedRuns && (result->timed_runs == 0 || total < kTimingBudget)) {
    std::fill(addresses.begin(), addresses.end(), 0);
    absl::StatusOr<std::unique_ptr<PoolUnderTest>> made =
        MakePoolUnderTest(policy, map_piece_bytes);
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
        progress("timing", (static_cast<double>(result->timed_runs) +
                            static_cast<double>(end) / static_cast<double>(ops.size())) /
                               planned_runs);
      }
    }
    ++result->timed_runs;
    total += run;
    best = std::min(best, run);
    if (result->timed_runs == 1) {
      const auto per_run = std::max<std::chrono::nanoseconds::rep>(run.count(), 1);
      planned_runs = static_cast<int>(std::clamp<std::chrono::nanoseconds::rep>(
          (std::chrono::nanoseconds(kTimingBudget).count() + per_run - 1) / per_run, 1,
          kMaxTimedRuns));
    }
  }
  result->ns_per_event =
      ops.empty() ? 0.0 : static_cast<double>(best.count()) / static_cast<double>(ops.size());
  return absl::OkStatus();
}

}  // namespace

std::string_view FenceModelName(FenceModel model) {
  switch (model) {
    case FenceModel::kNone:
      return "none";
    case FenceModel::kEvents:
      return "events";
    case FenceModel::kGpuWait:
      return "gpuwait";
    case FenceModel::kDeviceSync:
      return "devsync";
  }
  return "none";
}

absl::StatusOr<ReplayResult> ReplayTrace(const LoadedTrace& trace, std::string_view policy,
                                         const ReplayProgress& progress,
                                         const ReplayOptions& options) {
  ReplayResult result;
  result.options = options;
  if (absl::Status measured = MeasuredRun(trace, policy, progress, options, &result);
      !measured.ok()) {
    return measured;
  }
  if (absl::Status timed = TimedRuns(trace, policy, progress, options.map_piece_bytes, &result);
      !timed.ok())
    return timed;
  return result;
}

}  // namespace vramscope::cli
