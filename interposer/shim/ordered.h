// Ordered reuse: the provable fast path of the free fence (docs/design.md, "cudaFree is a
// device-wide fence").
//
// A pooled free may not be reused while work queued before it can still touch the block. When
// every piece of GPU work the process has queued went to the legacy default stream of one
// context, that work is one FIFO: anything the next owner of the block queues runs after
// everything the last owner queued. The block is then reusable at once, as PyTorch's allocator
// reuses a block on its own stream: no synchronisation, and the same block goes back to the
// next request of its size.
//
// The shim proves it by watching every entry point that queues work on a stream
// (hooks_streams_gen.cc, generated from <cuda.h> by gen_stream_hooks.py, and the hand-written
// hooks that take streams). Ordered reuse ends for good, the first time the process:
//  - queues work on any stream but the legacy one: a created stream, CU_STREAM_PER_THREAD, or
//    the per-thread default stream through a _ptsz / _ptds entry point (creating a stream does
//    not end it; its first work does);
//  - queues work from a second context (a second device, a green or non-primary context);
//  - creates a pool in a second context, or exports pooled memory by IPC;
//  - looks up a driver entry point that neither the <cuda.h> the shim was built with nor the
//    interop and profiler headers declare (a newer driver's, which might queue work unwatched).
// Ending it records an event on the legacy stream, and until that event completed every watched
// call that queues work elsewhere (the one that ended it first) makes its stream wait for it on
// the GPU (cuStreamWaitEvent, before the call reaches the driver): no block handed out again
// under ordered reuse can meet the new stream's work before the old work finished, and no host
// thread blocks. An IPC export synchronises instead. From then on the amortised fence applies.
// Reuse under ordered reuse is ordered; giving the memory back to the driver is not, so memory
// freed under it is unmapped or freed only after a synchronisation covers it
// (EpochFences::BeforeReturningMemory).
//
// Pool mode only (strict keeps the driver's full wait; passthrough pools nothing);
// VRAMSCOPE_ORDERED=0 turns it off from the start.
//
// Thread safety: one process-wide atomic state; the checks below are one acquire load once
// ordered reuse has ended.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda.h>

#include "stream_fence.h"

namespace vramscope::interposer {
namespace ordered_internal {

// kOn -> kBreaking (the end being marked: other watched calls wait for it, briefly) -> kEnding
// (the end event recorded, not yet complete) -> kOff. Frees are settled only in kOn.
enum : int { kOn = 0, kBreaking = 1, kEnding = 2, kOff = 3 };
extern constinit std::atomic<int> g_state;

// True if the current context is not the ordered one, which ended ordered reuse.
bool CheckContextBreaks();
// Work for `stream` while ordered reuse is ending: waits out kBreaking, then makes the stream
// wait for the end event (EndingWait) unless it already completed.
void WhileEnding(CUstream stream, bool per_thread);

}  // namespace ordered_internal

// At initialisation (and in a fork child): whether ordered reuse may start.
void ConfigureOrdered(bool allowed);

// A free happening now may be reused at once. Sequentially consistent: a free that saw ordered
// reuse still on was stamped before BreakOrdered took the end's fence and recorded its event.
inline bool OrderedOn() {
  return ordered_internal::g_state.load(std::memory_order_seq_cst) == ordered_internal::kOn;
}

// Ends ordered reuse (idempotent; `why` names the entry point or the event): records an event
// on the ordered context's legacy stream, which work queued anywhere else waits for until it
// completed (WatchStream), or, if it cannot, synchronises every pooled context. Never blocks on
// the GPU otherwise. Returns at once if another thread is ending it (WhileEnding waits).
void BreakOrdered(const char* why);
// The same, then waits on the host for the work queued before the end (an export to another
// process, whose work the shim never sees).
void BreakOrderedAndWait(const char* why);

// Work is about to be queued on `stream` by the entry point `where`; `per_thread` for the
// _ptsz / _ptds flavour, where a null stream is the calling thread's per-thread stream.
// Also pays the stream's owed GPU-side waits (stream_fence.h, PayOwedWaits).
inline void WatchStream(CUstream stream, bool per_thread, const char* where) {
  const int state = ordered_internal::g_state.load(std::memory_order_acquire);
  if (__builtin_expect(state == ordered_internal::kOff, 1)) {
    PayOwedWaits(stream, per_thread);
    return;
  }
  if (state == ordered_internal::kOn) {
    const auto handle = reinterpret_cast<std::uintptr_t>(stream);
    // CU_STREAM_LEGACY names the legacy stream in both flavours, a null stream in the legacy
    // one. Work there from the ordered context follows everything before it, the end included.
    if (handle == reinterpret_cast<std::uintptr_t>(CU_STREAM_LEGACY) ||
        (handle == 0 && !per_thread)) {
      if (!ordered_internal::CheckContextBreaks()) {
        PayOwedWaits(stream, per_thread);
        return;
      }
    } else {
      BreakOrdered(where);
    }
  }
  ordered_internal::WhileEnding(stream, per_thread);
  PayOwedWaits(stream, per_thread);
}

// A pool is being created for `ctx`: a second context ends ordered reuse.
void NoteOrderedContext(CUcontext ctx);

// For the summary: "on", "off" (not allowed) or the name of what ended it (an entry point,
// "second_context", "second_context_pool", "unknown_entry_point").
const char* OrderedStatus();

}  // namespace vramscope::interposer
