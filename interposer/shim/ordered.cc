#include "ordered.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>

#include "capture.h"
#include "counters.h"
#include "driver.h"
#include "log.h"
#include "slots.h"
#include "state.h"

namespace vramscope::interposer {

constinit std::atomic<int> ordered_internal::g_state{ordered_internal::kOn};

namespace {

using ordered_internal::g_state;
using ordered_internal::kBreaking;
using ordered_internal::kEnding;
using ordered_internal::kOff;
using ordered_internal::kOn;

constinit std::atomic<CUcontext> g_ctx{nullptr};  // the one context work has gone to
constinit std::atomic<const char*> g_reason{nullptr};
// Recorded on the ordered context's legacy stream when ordered reuse ended: everything queued
// before the end. Never destroyed (a thread may still be about to wait on it).
constinit std::atomic<CUevent> g_end_event{nullptr};

void EndingWait(CUstream stream, bool per_thread);

// True if `ctx` is the ordered context, or becomes it (the first one seen).
bool IsOrderedContext(CUcontext ctx) {
  CUcontext expected = g_ctx.load(std::memory_order_acquire);
  if (expected == ctx) return true;
  if (expected == nullptr &&
      g_ctx.compare_exchange_strong(expected, ctx, std::memory_order_acq_rel)) {
    return true;
  }
  return expected == ctx;  // another thread made it the ordered context meanwhile
}

CUcontext CurrentContextOrNull() {
  CUcontext ctx = nullptr;
  const RealDriver& real = Real();
  if (real.cuCtxGetCurrent == nullptr || real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) return nullptr;
  return ctx;
}

// Every pooled context synchronised: what the end of ordered reuse falls back to when it cannot
// mark its point with an event, and what an export to another process needs.
void SynchroniseAllPools() {
  Slot* slots[kMaxSlots];
  const int count = LiveSlots(slots, kMaxSlots);
  for (int i = 0; i < count; ++i) (void)slots[i]->fences.Sync(/*forced=*/true);
}

// Marks the end on the ordered context's legacy stream; false if it could not.
bool RecordEndEvent() {
  const CUcontext ctx = g_ctx.load(std::memory_order_acquire);
  if (ctx == nullptr || ExistingSlot(ctx) == nullptr) return true;  // no pool, nothing reused
  const RealDriver& real = Real();
  if (real.cuEventCreate == nullptr || real.cuEventRecord == nullptr ||
      real.cuEventQuery == nullptr || real.cuStreamWaitEvent == nullptr) {
    return false;
  }
  DriverCallScope scope(ctx);
  if (!scope.ok()) return false;
  CUevent event = nullptr;
  if (real.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return false;
  if (real.cuEventRecord(event, CU_STREAM_LEGACY) != CUDA_SUCCESS) {
    if (real.cuEventDestroy_v2 != nullptr) (void)real.cuEventDestroy_v2(event);
    return false;
  }
  g_end_event.store(event, std::memory_order_release);
  return true;
}

// At info level: which libraries led to the end (module+offset of the first frames), so a user
// can see what in a program ended ordered reuse. Once per process.
void LogEnd(const char* why) {
  if (!LogEnabled(LogLevel::kInfo)) return;
  void* frames[10];
  const int count = backtrace(frames, 10);
  char trail[768];
  int used = 0;
  trail[0] = '\0';
  for (int i = 2; i < count && used < static_cast<int>(sizeof(trail)) - 1; ++i) {
    Dl_info info{};
    const char* module = "?";
    std::uintptr_t offset = 0;
    if (dladdr(frames[i], &info) != 0 && info.dli_fname != nullptr) {
      const char* slash = strrchr(info.dli_fname, '/');
      module = slash != nullptr ? slash + 1 : info.dli_fname;
      offset = reinterpret_cast<std::uintptr_t>(frames[i]) -
               reinterpret_cast<std::uintptr_t>(info.dli_fbase);
    }
    const int n = snprintf(trail + used, sizeof(trail) - static_cast<std::size_t>(used),
                           " < %s+%#lx", module, static_cast<unsigned long>(offset));
    if (n < 0) break;
    used = std::min(used + n, static_cast<int>(sizeof(trail)) - 1);
  }
  Log(LogLevel::kInfo, "ordered reuse ends: %s%s (frees wait for the fence from now on)", why,
      trail);
}

}  // namespace

void ConfigureOrdered(bool allowed) {
  g_ctx.store(nullptr, std::memory_order_relaxed);
  g_end_event.store(nullptr, std::memory_order_relaxed);
  g_reason.store(nullptr, std::memory_order_relaxed);
  g_state.store(allowed ? kOn : kOff, std::memory_order_seq_cst);
}

void BreakOrdered(const char* why) {
  int expected = kOn;
  if (!g_state.compare_exchange_strong(expected, kBreaking, std::memory_order_seq_cst)) return;
  g_reason.store(why, std::memory_order_release);
  Counters().ordered_ended.Add(1);
  {
    Slot* slots[kMaxSlots];
    const int count = LiveSlots(slots, kMaxSlots);
    for (int i = 0; i < count; ++i) slots[i]->fences.EndSettling();
  }
  LogEnd(why);
  if (!RecordEndEvent()) {
    SynchroniseAllPools();
    g_state.store(kOff, std::memory_order_seq_cst);
    return;
  }
  // No pool yet: nothing was reused, nothing to wait for.
  g_state.store(g_end_event.load(std::memory_order_acquire) != nullptr ? kEnding : kOff,
                std::memory_order_seq_cst);
}

void BreakOrderedAndWait(const char* why) {
  // Another process's work does not pay the owed GPU-side waits (stream_fence.h).
  DrainOwedWaitsOnHost();
  BreakOrdered(why);
  if (g_state.load(std::memory_order_acquire) == kOff) return;
  SynchroniseAllPools();
  int expected = kEnding;
  (void)g_state.compare_exchange_strong(expected, kOff, std::memory_order_seq_cst);
}

bool ordered_internal::CheckContextBreaks() {
  const CUcontext ctx = CurrentContextOrNull();
  // No context: the driver refuses the call, nothing is queued.
  if (ctx == nullptr || IsOrderedContext(ctx)) return false;
  BreakOrdered("second_context");
  return true;
}

void ordered_internal::WhileEnding(CUstream stream, bool per_thread) {
  for (;;) {
    const int state = g_state.load(std::memory_order_acquire);
    if (state == kOff) return;
    if (state == kEnding) {
      EndingWait(stream, per_thread);
      return;
    }
    sched_yield();  // kBreaking: another thread is recording the end (microseconds)
  }
}

namespace {

// Ordered reuse is ending (kEnding: the end event is recorded): work about to go to a stream that
// is not the ordered context's legacy stream first waits (on the GPU) for everything queued
// there before the end.
void EndingWait(CUstream stream, bool per_thread) {
  const CUevent event = g_end_event.load(std::memory_order_acquire);
  const RealDriver& real = Real();
  // Relaxed capture mode on this thread: cuEventQuery would otherwise invalidate a global-mode
  // capture live in the process.
  DriverCallScope scope(nullptr);
  if (real.cuEventQuery(event) == CUDA_SUCCESS) {
    int expected = kEnding;
    (void)g_state.compare_exchange_strong(expected, kOff, std::memory_order_seq_cst);
    return;
  }
  const auto handle = reinterpret_cast<std::uintptr_t>(stream);
  const bool legacy_handle =
      handle == reinterpret_cast<std::uintptr_t>(CU_STREAM_LEGACY) || (handle == 0 && !per_thread);
  if (legacy_handle && CurrentContextOrNull() == g_ctx.load(std::memory_order_acquire)) return;
  // The per-thread stream by its handle: the plain cuStreamWaitEvent then serves both flavours.
  CUstream target = stream;
  if (handle == 0) target = per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
  // A wait on an event recorded outside a capture would invalidate it. A capturing stream
  // waited before its capture began (cuStreamBeginCapture* is watched), and its graph waits
  // when it is launched.
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (real.cuStreamIsCapturing != nullptr &&
      real.cuStreamIsCapturing(target, &status) == CUDA_SUCCESS &&
      status != CU_STREAM_CAPTURE_STATUS_NONE) {
    return;
  }
  if (real.cuStreamWaitEvent(target, event, 0) != CUDA_SUCCESS) {
    // Cannot order it on the GPU: wait on the host instead.
    if (real.cuEventSynchronize != nullptr) (void)real.cuEventSynchronize(event);
  }
  Counters().ordered_end_waits.Add(1);
}

}  // namespace

void NoteOrderedContext(CUcontext ctx) {
  if (g_state.load(std::memory_order_acquire) != kOn || ctx == nullptr) return;
  if (!IsOrderedContext(ctx)) BreakOrdered("second_context_pool");
}

const char* OrderedStatus() {
  const char* reason = g_reason.load(std::memory_order_acquire);
  if (reason != nullptr) return reason;
  return g_state.load(std::memory_order_acquire) == kOn ? "on" : "off";
}

}  // namespace vramscope::interposer
