#include "epoch_fences.h"

#include <time.h>

#include "capture.h"
#include "counters.h"
#include "driver.h"
#include "log.h"
#include "state.h"

namespace vramscope::interposer {

void EpochFences::Complete(std::uint64_t epoch) {
  std::uint64_t done = completed_.load(std::memory_order_relaxed);
  while (epoch > done &&
         !completed_.compare_exchange_weak(done, epoch, std::memory_order_acq_rel)) {
  }
  frees_since_sync.store(0, std::memory_order_relaxed);
  bytes_since_sync.store(0, std::memory_order_relaxed);
}

bool EpochFences::Sync(bool forced) {
  if (dead_.load(std::memory_order_acquire) || Exiting()) return false;
  if (AnyCaptureLive()) {
    if (!forced) {
      DeviceCountersFor(device_).syncs_skipped_capture.Add(1);
      return false;
    }
    DeviceCountersFor(device_).syncs_during_capture.Add(1);
  }
  // Frees stamped with `epoch` returned before this increment; the synchronisation below
  // starts after it, so it covers all the work they could have queued.
  const std::uint64_t epoch = epoch_.fetch_add(1, std::memory_order_seq_cst);
  DriverCallScope scope(ctx_);
  if (!scope.ok()) return false;
  timespec start{};
  clock_gettime(CLOCK_MONOTONIC, &start);
  const CUresult result = Real().cuCtxSynchronize();
  timespec end{};
  clock_gettime(CLOCK_MONOTONIC, &end);
  const std::int64_t took =
      (end.tv_sec - start.tv_sec) * 1000000000LL + (end.tv_nsec - start.tv_nsec);
  const std::uint64_t sample = took > 0 ? static_cast<std::uint64_t>(took) : 0;
  const std::uint64_t average = sync_ns_.load(std::memory_order_relaxed);
  sync_ns_.store((7 * average + sample) / 8, std::memory_order_relaxed);
  DeviceCountersFor(device_).fence_syncs.Add(1);
  if (result != CUDA_SUCCESS) {
    VRAMSCOPE_LOG(kDebug, "device %d: cuCtxSynchronize for the free fence failed (%d)", device_,
                  static_cast<int>(result));
    return false;
  }
  Complete(epoch);
  return true;
}

void EpochFences::EndUserSync(std::uint64_t epoch, CUresult result) {
  if (result != CUDA_SUCCESS) return;
  Complete(epoch);
  DeviceCountersFor(device_).user_syncs.Add(1);
}

void EpochFences::Wait(std::uint64_t fence) {
  if (IsComplete(fence) || Exiting()) return;
  if (!Sync(/*forced=*/true) && !IsComplete(fence)) {
    VRAMSCOPE_LOG_ONCE(kWarn, "device %d: cannot wait for a free's fence (cuCtxSynchronize failed)",
                       device_);
  }
}

}  // namespace vramscope::interposer
