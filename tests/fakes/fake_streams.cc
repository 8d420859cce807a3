// Streams, events, stream capture and the stream-ordered allocator of the fake CUDA driver.
//
// Mimics:
// - Events complete when the work before them does. Nothing runs here, so by default a record
//   completes at once; in manual mode the test decides (fake_cuda_control.h), which lets tests
//   prove that a shim waits for events before reusing memory.
// - Stream capture (docs/driver-notes.md): a capturing stream's own synchronize or
//   query fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture; other
//   "potentially unsafe" calls follow the thread's capture mode (CheckCaptureUnsafeLocked);
//   cuStreamEndCapture of an invalidated capture returns CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.
//   cuMemAllocAsync on a capturing stream returns graph-owned memory (not charged).
// - The default memory pool keeps memory freed by cuMemFreeAsync reserved (still charged to the
//   device) and releases what exceeds its release threshold (default 0) at synchronization
//   points or on cuMemPoolTrimTo.
// - The legacy stream is handle 0 or CU_STREAM_LEGACY; through a _ptsz entry point handle 0 is
//   the per-thread stream (CU_STREAM_PER_THREAD).
//
// Simplifications: no implicit synchronization between the legacy stream and blocking streams;
// the per-thread default streams of all threads share one identity; captured work records no
// graph nodes.
#include <chrono>

#include <cuda.h>

#include "fake_cuda_decls.h"
#include "fake_state.h"

namespace vramscope::fake {
namespace {

bool IsPool(State& s, CUmemoryPool pool) {
  for (int d = 0; d < s.device_count; ++d) {
    if (pool == &s.devices[d].default_pool) return true;
  }
  return false;
}

// Device that work on `key` runs on: the stream's context, or the current context for the
// default streams. Requires a context for the default streams.
CUresult StreamDevice(Call& call, uintptr_t key, int* device) {
  if (key == reinterpret_cast<uintptr_t>(CU_STREAM_LEGACY) ||
      key == reinterpret_cast<uintptr_t>(CU_STREAM_PER_THREAD)) {
    CUctx_st* ctx = nullptr;
    if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
    *device = ctx->device;
    return CUDA_SUCCESS;
  }
  *device = reinterpret_cast<CUstream_st*>(key)->ctx->device;
  return CUDA_SUCCESS;
}

// The context and kind (fake_state.h) of the stream `key` names; the default streams resolve
// against the current context.
CUresult StreamInfo(Call& call, uintptr_t key, CUctx_st** ctx, int* kind) {
  if (key == reinterpret_cast<uintptr_t>(CU_STREAM_LEGACY) ||
      key == reinterpret_cast<uintptr_t>(CU_STREAM_PER_THREAD)) {
    if (CUresult r = call.RequireContext(ctx); r != CUDA_SUCCESS) return r;
    *kind = key == reinterpret_cast<uintptr_t>(CU_STREAM_LEGACY) ? kStreamLegacy : kStreamBlocking;
    return CUDA_SUCCESS;
  }
  const auto* stream = reinterpret_cast<CUstream_st*>(key);
  *ctx = stream->ctx;
  *kind = (stream->flags & CU_STREAM_NON_BLOCKING) != 0 ? kStreamNonBlocking : kStreamBlocking;
  return CUDA_SUCCESS;
}

CUresult StreamCreate(Call& call, CUstream* ph, unsigned int flags, int priority) {
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  if (ph == nullptr || (flags & ~static_cast<unsigned int>(CU_STREAM_NON_BLOCKING)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto* st = new CUstream_st;
  st->ctx = ctx;
  st->flags = flags;
  st->priority = priority;
  call.state().streams.insert(st);
  *ph = st;
  return CUDA_SUCCESS;
}

CUresult StreamDestroy(Call& call, CUstream h) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  auto it = s.streams.find(h);
  if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  s.captures.erase(reinterpret_cast<uintptr_t>(h));
  s.stream_waits.erase(reinterpret_cast<uintptr_t>(h));
  s.unordered_at_last_work.erase(reinterpret_cast<uintptr_t>(h));
  delete *it;
  s.streams.erase(it);
  return CUDA_SUCCESS;
}

CUresult StreamSynchronize(Call& call, CUstream h, bool per_thread) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  uintptr_t key = 0;
  if (!StreamKey(s, h, per_thread, &key)) return CUDA_ERROR_INVALID_HANDLE;
  int device = 0;
  if (CUresult r = StreamDevice(call, key, &device); r != CUDA_SUCCESS) return r;
  if (CUresult r = RejectIfCapturingLocked(s, key); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckCaptureUnsafeLocked(s); r != CUDA_SUCCESS) return r;
  WaitStreamLocked(call, key, device);
  return CUDA_SUCCESS;
}

CUresult StreamQuery(Call& call, CUstream h, bool per_thread) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  uintptr_t key = 0;
  if (!StreamKey(s, h, per_thread, &key)) return CUDA_ERROR_INVALID_HANDLE;
  int device = 0;
  if (CUresult r = StreamDevice(call, key, &device); r != CUDA_SUCCESS) return r;
  if (CUresult r = RejectIfCapturingLocked(s, key); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckCaptureUnsafeLocked(s); r != CUDA_SUCCESS) return r;
  for (CUevent_st* ev : s.events) {
    if (ev->status == CUevent_st::Status::kPending && ev->stream_key == key) {
      return CUDA_ERROR_NOT_READY;
    }
  }
  return CUDA_SUCCESS;
}

CUresult StreamWaitEvent(Call& call, CUstream h, CUevent ev, unsigned int flags, bool per_thread) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  uintptr_t key = 0;
  if (!StreamKey(s, h, per_thread, &key) || s.events.count(ev) == 0) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (flags != 0 && flags != CU_EVENT_WAIT_EXTERNAL) return CUDA_ERROR_INVALID_VALUE;
  // Device-side wait: the host does not block; later work on the stream follows what the event
  // stands for (a capture's wait becomes a graph edge instead).
  if (ev->status == CUevent_st::Status::kPending && s.captures.count(key) == 0) {
    s.stream_waits[key].push_back(*ev);
  }
  return CUDA_SUCCESS;
}

}  // namespace

void NoteWorkLocked(Call& call, uintptr_t key) {
  State& s = call.state();
  CUevent_st now;
  now.stream_key = key;
  now.record_seq = s.next_record_seq;
  if (StreamInfo(call, key, &now.stream_ctx, &now.stream_kind) != CUDA_SUCCESS) return;
  const auto waits = s.stream_waits.find(key);
  std::vector<uint64_t> unordered;
  for (const CUevent_st* k : s.events) {
    if (!k->kernel || k->status != CUevent_st::Status::kPending) continue;
    bool ordered = BlocksLocked(k, &now);
    if (!ordered && waits != s.stream_waits.end()) {
      for (const CUevent_st& w : waits->second) ordered = ordered || BlocksLocked(k, &w);
    }
    if (!ordered) unordered.push_back(k->record_seq);
  }
  s.unordered_at_last_work[key] = std::move(unordered);
}

namespace {

CUresult EventRecord(Call& call, CUevent ev, CUstream h, bool per_thread) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  uintptr_t key = 0;
  if (s.events.count(ev) == 0 || !StreamKey(s, h, per_thread, &key)) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  int device = 0;
  if (CUresult r = StreamDevice(call, key, &device); r != CUDA_SUCCESS) return r;
  // Recorded into a capture: the record becomes a graph node and leaves the event as it was.
  if (s.captures.count(key) != 0) return CUDA_SUCCESS;
  ev->stream_key = key;
  ev->record_seq = s.next_record_seq++;
  ev->status = CUevent_st::Status::kPending;
  (void)StreamInfo(call, key, &ev->stream_ctx, &ev->stream_kind);
  ev->automatic = !s.manual_events && s.manual_kernels;
  if (ev->automatic) {
    ResolveAutomaticLocked(s);
  } else if (!s.manual_events) {
    CompleteEventLocked(s, ev);
  }
  return CUDA_SUCCESS;
}

CUresult LaunchKernel(Call& call, CUfunction f, unsigned int blocks, unsigned int threads,
                      CUstream h, bool per_thread) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  uintptr_t key = 0;
  if (!StreamKey(s, h, per_thread, &key)) return CUDA_ERROR_INVALID_HANDLE;
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (blocks == 0 || threads == 0 || threads > 1024) return CUDA_ERROR_INVALID_VALUE;
  int device = 0;
  if (CUresult r = StreamDevice(call, key, &device); r != CUDA_SUCCESS) return r;
  if (s.captures.count(key) != 0) return CUDA_ERROR_NOT_SUPPORTED;
  NoteWorkLocked(call, key);
  if (s.manual_kernels) {
    // A kernel still running until the test (or a host wait) completes it.
    auto* kernel = new CUevent_st;
    kernel->kernel = true;
    kernel->stream_key = key;
    kernel->record_seq = s.next_record_seq++;
    s.last_kernel_seq = kernel->record_seq;
    kernel->status = CUevent_st::Status::kPending;
    (void)StreamInfo(call, key, &kernel->stream_ctx, &kernel->stream_kind);
    kernel->ctx = kernel->stream_ctx;
    s.events.insert(kernel);
  }
  return CUDA_SUCCESS;
}

CUresult EventDestroy(Call& call, CUevent ev) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  auto it = s.events.find(ev);
  if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  // Destroying a pending event is allowed; a thread blocked on it wakes up.
  delete *it;
  s.events.erase(it);
  s.cv.notify_all();
  return CUDA_SUCCESS;
}

CUresult EventElapsedTime(Call& call, float* ms, CUevent start, CUevent end) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (s.events.count(start) == 0 || s.events.count(end) == 0) return CUDA_ERROR_INVALID_HANDLE;
  if (((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING) != 0) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (start->status == CUevent_st::Status::kNeverRecorded ||
      end->status == CUevent_st::Status::kNeverRecorded) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (start->status != CUevent_st::Status::kComplete ||
      end->status != CUevent_st::Status::kComplete) {
    return CUDA_ERROR_NOT_READY;
  }
  *ms = std::chrono::duration<float, std::milli>(end->completed_at - start->completed_at).count();
  return CUDA_SUCCESS;
}

CUresult BeginCapture(Call& call, CUstream h, CUstreamCaptureMode mode, bool per_thread) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  uintptr_t key = 0;
  if (!StreamKey(s, h, per_thread, &key)) return CUDA_ERROR_INVALID_HANDLE;
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The legacy stream cannot be captured.
  if (key == reinterpret_cast<uintptr_t>(CU_STREAM_LEGACY)) {
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (s.captures.count(key) != 0) return CUDA_ERROR_ILLEGAL_STATE;
  Capture c;
  c.id = s.next_capture_id++;
  c.mode = mode;
  c.thread = ThreadId();
  s.captures.emplace(key, c);
  return CUDA_SUCCESS;
}

CUresult EndCapture(Call& call, CUstream h, CUgraph* graph, bool per_thread) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  uintptr_t key = 0;
  if (!StreamKey(s, h, per_thread, &key)) return CUDA_ERROR_INVALID_HANDLE;
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = s.captures.find(key);
  if (it == s.captures.end()) return CUDA_ERROR_ILLEGAL_STATE;
  if (it->second.mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL && it->second.thread != ThreadId()) {
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  bool invalidated = it->second.invalidated;
  const std::vector<std::pair<int, size_t>> alloc_nodes = std::move(it->second.alloc_nodes);
  s.captures.erase(it);
  if (invalidated) {
    *graph = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  auto* g = new CUgraph_st;
  for (const auto& [device, bytes] : alloc_nodes) {
    auto* node = new CUgraphNode_st;
    node->device = device;
    node->bytes = bytes;
    g->nodes.push_back(node);
  }
  s.graphs.insert(g);
  *graph = g;
  return CUDA_SUCCESS;
}

CUresult IsCapturing(Call& call, CUstream h, CUstreamCaptureStatus* status, bool per_thread,
                     cuuint64_t* id) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  uintptr_t key = 0;
  if (!StreamKey(s, h, per_thread, &key)) return CUDA_ERROR_INVALID_HANDLE;
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = s.captures.find(key);
  if (it == s.captures.end()) {
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
  } else {
    *status = it->second.invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                     : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    if (id != nullptr) *id = it->second.id;
  }
  return CUDA_SUCCESS;
}

CUresult GetCaptureInfoV3(Call& call, CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id,
                          CUgraph* graph, const CUgraphNode** deps, const CUgraphEdgeData** edges,
                          size_t* num_deps, bool per_thread) {
  CUresult r = IsCapturing(call, h, status, per_thread, id);
  if (r != CUDA_SUCCESS) return r;
  if (graph != nullptr) *graph = nullptr;
  if (deps != nullptr) *deps = nullptr;
  if (edges != nullptr) *edges = nullptr;
  if (num_deps != nullptr) *num_deps = 0;
  return CUDA_SUCCESS;
}

CUresult AllocAsync(Call& call, CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream h,
                    bool per_thread) {
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  uintptr_t key = 0;
  if (!StreamKey(s, h, per_thread, &key)) return CUDA_ERROR_INVALID_HANDLE;
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (pool == nullptr) {
    int device = 0;
    if (CUresult r = StreamDevice(call, key, &device); r != CUDA_SUCCESS) return r;
    pool = &s.devices[device].default_pool;
  } else if (!IsPool(s, pool)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  bool capturing = s.captures.count(key) != 0;
  size_t reuse = 0;
  if (!capturing) {
    reuse = pool->cached < bytesize ? pool->cached : bytesize;
    if (!Charge(s, pool->device, bytesize - reuse)) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  void* p = AllocStorage(bytesize);
  if (p == nullptr) {
    if (!capturing) Uncharge(s, pool->device, bytesize - reuse);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Allocation a;
  a.size = bytesize;
  a.device = pool->device;
  a.ctx = &s.devices[pool->device].primary;
  a.buffer_id = s.next_buffer_id++;
  a.storage = p;
  if (capturing) {
    // A mem-alloc node of the graph being captured: memory comes from the graph pool when the
    // graph is instantiated (fake_graph.cc).
    a.kind = AllocKind::kGraph;
    s.captures[key].alloc_nodes.emplace_back(pool->device, bytesize);
  } else {
    a.kind = AllocKind::kAsync;
    a.charged = bytesize;
    a.pool = pool;
    pool->cached -= reuse;
    pool->live += bytesize;
    ++s.devices[pool->device].live_allocations;
  }
  *dptr = reinterpret_cast<CUdeviceptr>(p);
  if (!capturing) {
    NotifyMemory(VRAMSCOPE_FAKE_MEMORY_ALLOCATION, pool->device, *dptr, bytesize,
                 VRAMSCOPE_FAKE_MEMORY_STREAM_ORDERED, static_cast<uint64_t>(key));
  }
  s.allocations.emplace(*dptr, a);
  return CUDA_SUCCESS;
}

CUresult FreeAsync(Call& call, CUdeviceptr dptr, CUstream h, bool per_thread) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  uintptr_t key = 0;
  if (!StreamKey(s, h, per_thread, &key)) return CUDA_ERROR_INVALID_HANDLE;
  auto it = s.allocations.find(dptr);
  if (it == s.allocations.end() ||
      (it->second.kind != AllocKind::kAsync && it->second.kind != AllocKind::kGraph)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  FreeAllocationLocked(s, it);
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace vramscope::fake

using vramscope::fake::Call;
using vramscope::fake::State;
namespace fake = vramscope::fake;

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  Call call("cuStreamCreate");
  return fake::StreamCreate(call, phStream, Flags, 0);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags,
                                                          int priority) {
  Call call("cuStreamCreateWithPriority");
  return fake::StreamCreate(call, phStream, flags, priority);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  Call call("cuStreamDestroy_v2");
  return fake::StreamDestroy(call, hStream);
}

VRAMSCOPE_FAKE_EXPORT CUresult vramscope_fake_cuStreamDestroy_v2000(CUstream hStream) {
  Call call("cuStreamDestroy");
  return fake::StreamDestroy(call, hStream);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
  Call call("cuStreamSynchronize");
  return fake::StreamSynchronize(call, hStream, false);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
  Call call("cuStreamSynchronize_ptsz");
  return fake::StreamSynchronize(call, hStream, true);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamGetCtx(CUstream hStream, CUcontext* pctx) {
  Call call("cuStreamGetCtx");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  uintptr_t key = 0;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!fake::StreamKey(s, hStream, false, &key)) return CUDA_ERROR_INVALID_HANDLE;
  int kind = 0;
  CUctx_st* ctx = nullptr;
  if (CUresult r = fake::StreamInfo(call, key, &ctx, &kind); r != CUDA_SUCCESS) return r;
  *pctx = ctx;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamQuery(CUstream hStream) {
  Call call("cuStreamQuery");
  return fake::StreamQuery(call, hStream, false);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamQuery_ptsz(CUstream hStream) {
  Call call("cuStreamQuery_ptsz");
  return fake::StreamQuery(call, hStream, true);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent,
                                                 unsigned int Flags) {
  Call call("cuStreamWaitEvent");
  return fake::StreamWaitEvent(call, hStream, hEvent, Flags, false);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent,
                                                      unsigned int Flags) {
  Call call("cuStreamWaitEvent_ptsz");
  return fake::StreamWaitEvent(call, hStream, hEvent, Flags, true);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  Call call("cuEventCreate");
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  constexpr unsigned int kKnown =
      CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (phEvent == nullptr || (Flags & ~kKnown) != 0 ||
      ((Flags & CU_EVENT_INTERPROCESS) != 0 && (Flags & CU_EVENT_DISABLE_TIMING) == 0)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto* ev = new CUevent_st;
  ev->ctx = ctx;
  ev->flags = Flags;
  call.state().events.insert(ev);
  *phEvent = ev;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  Call call("cuEventRecord");
  return fake::EventRecord(call, hEvent, hStream, false);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
  Call call("cuEventRecord_ptsz");
  return fake::EventRecord(call, hEvent, hStream, true);
}

// The fake runs no kernels: a launch checks its stream and arguments and queues nothing. A
// launch into a capture would need a kernel node, which the fake's graphs do not support.
VRAMSCOPE_FAKE_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX,
                                              unsigned int gridDimY, unsigned int gridDimZ,
                                              unsigned int blockDimX, unsigned int blockDimY,
                                              unsigned int blockDimZ, unsigned int sharedMemBytes,
                                              CUstream hStream, void** kernelParams, void** extra) {
  (void)sharedMemBytes;
  (void)kernelParams;
  (void)extra;
  Call call("cuLaunchKernel");
  return fake::LaunchKernel(call, f, gridDimX * gridDimY * gridDimZ,
                            blockDimX * blockDimY * blockDimZ, hStream, false);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                                   unsigned int gridDimY, unsigned int gridDimZ,
                                                   unsigned int blockDimX, unsigned int blockDimY,
                                                   unsigned int blockDimZ,
                                                   unsigned int sharedMemBytes, CUstream hStream,
                                                   void** kernelParams, void** extra) {
  (void)sharedMemBytes;
  (void)kernelParams;
  (void)extra;
  Call call("cuLaunchKernel_ptsz");
  return fake::LaunchKernel(call, f, gridDimX * gridDimY * gridDimZ,
                            blockDimX * blockDimY * blockDimZ, hStream, true);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuEventQuery(CUevent hEvent) {
  Call call("cuEventQuery");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (s.events.count(hEvent) == 0) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = fake::CheckCaptureUnsafeLocked(s); r != CUDA_SUCCESS) return r;
  // A never-recorded event counts as complete.
  return hEvent->status == CUevent_st::Status::kPending ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuEventSynchronize(CUevent hEvent) {
  Call call("cuEventSynchronize");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (s.events.count(hEvent) == 0) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = fake::CheckCaptureUnsafeLocked(s); r != CUDA_SUCCESS) return r;
  fake::WaitEventLocked(call, hEvent, hEvent->ctx->device);
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent) {
  Call call("cuEventDestroy_v2");
  return fake::EventDestroy(call, hEvent);
}

VRAMSCOPE_FAKE_EXPORT CUresult vramscope_fake_cuEventDestroy_v2000(CUevent hEvent) {
  Call call("cuEventDestroy");
  return fake::EventDestroy(call, hEvent);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart,
                                                     CUevent hEnd) {
  Call call("cuEventElapsedTime_v2");
  return fake::EventElapsedTime(call, pMilliseconds, hStart, hEnd);
}

VRAMSCOPE_FAKE_EXPORT CUresult vramscope_fake_cuEventElapsedTime_v2000(float* pMilliseconds,
                                                                       CUevent hStart,
                                                                       CUevent hEnd) {
  Call call("cuEventElapsedTime");
  return fake::EventElapsedTime(call, pMilliseconds, hStart, hEnd);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  Call call("cuStreamBeginCapture_v2");
  return fake::BeginCapture(call, hStream, mode, false);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream,
                                                            CUstreamCaptureMode mode) {
  Call call("cuStreamBeginCapture_v2_ptsz");
  return fake::BeginCapture(call, hStream, mode, true);
}

// CUDA 10.0 ABI: no mode argument, the capture is GLOBAL.
VRAMSCOPE_FAKE_EXPORT CUresult vramscope_fake_cuStreamBeginCapture_v10000(CUstream hStream) {
  Call call("cuStreamBeginCapture");
  return fake::BeginCapture(call, hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, false);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream) {
  Call call("cuStreamBeginCapture_ptsz");
  return fake::BeginCapture(call, hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, true);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  Call call("cuStreamEndCapture");
  return fake::EndCapture(call, hStream, phGraph, false);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  Call call("cuStreamEndCapture_ptsz");
  return fake::EndCapture(call, hStream, phGraph, true);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamIsCapturing(CUstream hStream,
                                                   CUstreamCaptureStatus* captureStatus) {
  Call call("cuStreamIsCapturing");
  return fake::IsCapturing(call, hStream, captureStatus, false, nullptr);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream hStream,
                                                        CUstreamCaptureStatus* captureStatus) {
  Call call("cuStreamIsCapturing_ptsz");
  return fake::IsCapturing(call, hStream, captureStatus, true, nullptr);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream hStream,
                                                         CUstreamCaptureStatus* captureStatus_out,
                                                         cuuint64_t* id_out, CUgraph* graph_out,
                                                         const CUgraphNode** dependencies_out,
                                                         const CUgraphEdgeData** edgeData_out,
                                                         size_t* numDependencies_out) {
  Call call("cuStreamGetCaptureInfo_v3");
  return fake::GetCaptureInfoV3(call, hStream, captureStatus_out, id_out, graph_out,
                                dependencies_out, edgeData_out, numDependencies_out, false);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamGetCaptureInfo_v3_ptsz(
    CUstream hStream, CUstreamCaptureStatus* captureStatus_out, cuuint64_t* id_out,
    CUgraph* graph_out, const CUgraphNode** dependencies_out, const CUgraphEdgeData** edgeData_out,
    size_t* numDependencies_out) {
  Call call("cuStreamGetCaptureInfo_v3_ptsz");
  return fake::GetCaptureInfoV3(call, hStream, captureStatus_out, id_out, graph_out,
                                dependencies_out, edgeData_out, numDependencies_out, true);
}

VRAMSCOPE_FAKE_EXPORT CUresult vramscope_fake_cuStreamGetCaptureInfo_v10010(
    CUstream hStream, CUstreamCaptureStatus* captureStatus_out, cuuint64_t* id_out) {
  Call call("cuStreamGetCaptureInfo");
  return fake::GetCaptureInfoV3(call, hStream, captureStatus_out, id_out, nullptr, nullptr, nullptr,
                                nullptr, false);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamGetCaptureInfo_ptsz(CUstream hStream,
                                                           CUstreamCaptureStatus* captureStatus_out,
                                                           cuuint64_t* id_out) {
  Call call("cuStreamGetCaptureInfo_ptsz");
  return fake::GetCaptureInfoV3(call, hStream, captureStatus_out, id_out, nullptr, nullptr, nullptr,
                                nullptr, true);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream hStream,
                                                         CUstreamCaptureStatus* captureStatus_out,
                                                         cuuint64_t* id_out, CUgraph* graph_out,
                                                         const CUgraphNode** dependencies_out,
                                                         size_t* numDependencies_out) {
  Call call("cuStreamGetCaptureInfo_v2");
  return fake::GetCaptureInfoV3(call, hStream, captureStatus_out, id_out, graph_out,
                                dependencies_out, nullptr, numDependencies_out, false);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuStreamGetCaptureInfo_v2_ptsz(
    CUstream hStream, CUstreamCaptureStatus* captureStatus_out, cuuint64_t* id_out,
    CUgraph* graph_out, const CUgraphNode** dependencies_out, size_t* numDependencies_out) {
  Call call("cuStreamGetCaptureInfo_v2_ptsz");
  return fake::GetCaptureInfoV3(call, hStream, captureStatus_out, id_out, graph_out,
                                dependencies_out, nullptr, numDependencies_out, true);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  Call call("cuThreadExchangeStreamCaptureMode");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  if (mode == nullptr ||
      (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
       *mode != CU_STREAM_CAPTURE_MODE_RELAXED)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUstreamCaptureMode& current = fake::ThreadCaptureMode();
  CUstreamCaptureMode previous = current;
  current = *mode;
  *mode = previous;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize,
                                               CUstream hStream) {
  Call call("cuMemAllocAsync");
  return fake::AllocAsync(call, dptr, bytesize, nullptr, hStream, false);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                    CUstream hStream) {
  Call call("cuMemAllocAsync_ptsz");
  return fake::AllocAsync(call, dptr, bytesize, nullptr, hStream, true);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize,
                                                       CUmemoryPool pool, CUstream hStream) {
  Call call("cuMemAllocFromPoolAsync");
  if (pool == nullptr) {
    if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
    return CUDA_ERROR_INVALID_VALUE;
  }
  return fake::AllocAsync(call, dptr, bytesize, pool, hStream, false);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                            CUmemoryPool pool, CUstream hStream) {
  Call call("cuMemAllocFromPoolAsync_ptsz");
  if (pool == nullptr) {
    if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
    return CUDA_ERROR_INVALID_VALUE;
  }
  return fake::AllocAsync(call, dptr, bytesize, pool, hStream, true);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  Call call("cuMemFreeAsync");
  return fake::FreeAsync(call, dptr, hStream, false);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  Call call("cuMemFreeAsync_ptsz");
  return fake::FreeAsync(call, dptr, hStream, true);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool_out, CUdevice dev) {
  Call call("cuDeviceGetDefaultMemPool");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (pool_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!fake::ValidDevice(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  *pool_out = &s.devices[dev].default_pool;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  Call call("cuMemPoolTrimTo");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (!fake::IsPool(s, pool)) return CUDA_ERROR_INVALID_VALUE;
  // The pool keeps at least minBytesToKeep reserved (live + cached); only cached bytes go.
  size_t keep_cached = minBytesToKeep > pool->live ? minBytesToKeep - pool->live : 0;
  fake::TrimPoolLocked(s, pool, keep_cached < pool->cached ? keep_cached : pool->cached);
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                                     void* value) {
  Call call("cuMemPoolSetAttribute");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (!fake::IsPool(s, pool) || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) return CUDA_ERROR_NOT_SUPPORTED;
  pool->release_threshold = static_cast<size_t>(*static_cast<cuuint64_t*>(value));
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                                     void* value) {
  Call call("cuMemPoolGetAttribute");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (!fake::IsPool(s, pool) || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* out = static_cast<cuuint64_t*>(value);
  switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      *out = pool->release_threshold;
      break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
      *out = pool->live + pool->cached;
      break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      *out = pool->live;
      break;
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}
