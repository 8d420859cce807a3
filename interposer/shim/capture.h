// Stream-capture awareness for the shim's own driver calls.
//
// A driver call the shim makes for itself (pool growth, the fence synchronisation) must never
// invalidate an application's stream capture: every such call runs inside a DriverCallScope,
// which switches the calling thread to CU_STREAM_CAPTURE_MODE_RELAXED (and pushes the pool's
// context when another one is current), restoring both afterwards. Synchronisation is skipped
// altogether while any capture begun through a hooked entry point is live (AnyCaptureLive).
//
// Thread safety: the capture count is a process-wide atomic; a scope belongs to its thread.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda.h>

namespace vramscope::interposer {

// Called by the cuStreamBeginCapture*/cuStreamEndCapture* hooks with the driver's result.
void NoteCaptureBegin(CUresult result);
void NoteCaptureEnd(CUresult result);
namespace capture_internal {
extern constinit std::atomic<int> g_live_captures;
extern constinit std::atomic<std::uint64_t> g_captures_begun;
}  // namespace capture_internal
inline bool AnyCaptureLive() {
  return capture_internal::g_live_captures.load(std::memory_order_acquire) > 0;
}
// Captures begun so far: a change across a span of driver calls means one began meanwhile.
inline std::uint64_t CapturesBegun() {
  return capture_internal::g_captures_begun.load(std::memory_order_acquire);
}
void ResetCapturesAfterFork();

class DriverCallScope {
 public:
  // ctx may be null: keep whatever context is current.
  explicit DriverCallScope(CUcontext ctx);
  ~DriverCallScope();
  DriverCallScope(const DriverCallScope&) = delete;
  DriverCallScope& operator=(const DriverCallScope&) = delete;

  // False if the context could not be made current (the call would go to the wrong device).
  bool ok() const { return ok_; }

 private:
  bool ok_ = true;
  bool pushed_ = false;
  bool exchanged_ = false;
  CUstreamCaptureMode saved_mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
};

}  // namespace vramscope::interposer
