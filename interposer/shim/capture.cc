#include "capture.h"

#include <atomic>

#include "driver.h"

namespace vramscope::interposer {

constinit std::atomic<int> capture_internal::g_live_captures{0};
constinit std::atomic<std::uint64_t> capture_internal::g_captures_begun{0};

namespace {
using capture_internal::g_live_captures;
}  // namespace

void NoteCaptureBegin(CUresult result) {
  if (result == CUDA_SUCCESS) {
    g_live_captures.fetch_add(1, std::memory_order_acq_rel);
    capture_internal::g_captures_begun.fetch_add(1, std::memory_order_acq_rel);
  }
}

void NoteCaptureEnd(CUresult result) {
  // An invalidated capture still ends; any other error means no capture was ended by this call
  // (not capturing, wrong thread).
  if (result != CUDA_SUCCESS && result != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) return;
  int live = g_live_captures.load(std::memory_order_relaxed);
  while (live > 0 &&
         !g_live_captures.compare_exchange_weak(live, live - 1, std::memory_order_acq_rel)) {
  }
}

void ResetCapturesAfterFork() { g_live_captures.store(0, std::memory_order_relaxed); }

DriverCallScope::DriverCallScope(CUcontext ctx) {
  const RealDriver& real = Real();
  if (ctx != nullptr) {
    CUcontext current = nullptr;
    if (real.cuCtxGetCurrent == nullptr || real.cuCtxGetCurrent(&current) != CUDA_SUCCESS) {
      current = nullptr;
    }
    if (current != ctx) {
      pushed_ =
          real.cuCtxPushCurrent_v2 != nullptr && real.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS;
      ok_ = pushed_;
    }
  }
  if (real.cuThreadExchangeStreamCaptureMode != nullptr) {
    saved_mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
    exchanged_ = real.cuThreadExchangeStreamCaptureMode(&saved_mode_) == CUDA_SUCCESS;
  }
}

DriverCallScope::~DriverCallScope() {
  const RealDriver& real = Real();
  if (exchanged_) {
    CUstreamCaptureMode mode = saved_mode_;
    (void)real.cuThreadExchangeStreamCaptureMode(&mode);
  }
  if (pushed_) {
    CUcontext popped = nullptr;
    (void)real.cuCtxPopCurrent_v2(&popped);
  }
}

}  // namespace vramscope::interposer
