// State, prologue and shared helpers of the fake CUDA driver. See fake_state.h.
#include "fake_state.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>

namespace vramscope::fake {
namespace {

size_t EnvSize(const char* name, size_t fallback) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  unsigned long long n = strtoull(v, &end, 0);
  return (end != nullptr && *end == '\0' && n > 0) ? static_cast<size_t>(n) : fallback;
}

void ConfigureFromEnv(State& s) {
  size_t capacity = EnvSize("VRAMSCOPE_FAKE_CAPACITY", kDefaultCapacity);
  for (int d = 0; d < kMaxDevices; ++d) {
    s.devices[d].capacity = capacity;
    s.devices[d].primary.device = d;
    s.devices[d].default_pool.device = d;
  }
  size_t devices = EnvSize("VRAMSCOPE_FAKE_DEVICES", kDefaultDevices);
  s.device_count =
      (devices >= 1 && devices <= kMaxDevices) ? static_cast<int>(devices) : kDefaultDevices;
  s.manual_events = EnvSize("VRAMSCOPE_FAKE_MANUAL_EVENTS", 0) != 0;
  s.manual_kernels = false;
  s.blocking_sync = false;
  const char* requirements = getenv("VRAMSCOPE_FAKE_ARRAY_REQUIREMENTS");
  s.array_requirements_for_all = requirements == nullptr || strcmp(requirements, "deferred") != 0;
}

// fork(): the real driver cannot be used in the child of a process that initialised it
// (docs/driver-notes.md); every call there returns CUDA_ERROR_NOT_INITIALIZED. The
// prepare/parent/child handlers also keep the mutex consistent across fork.
void AtForkPrepare() { GlobalState().mu.lock(); }
void AtForkParent() { GlobalState().mu.unlock(); }
void AtForkChild() {
  State& s = GlobalState();
  if (s.initialized) s.forked_after_init = true;
  s.mu.unlock();
}

State* CreateState() {
  // Never destroyed: static destructors of the program may still call the driver at exit.
  auto* s = new State;
  ConfigureFromEnv(*s);
  pthread_atfork(AtForkPrepare, AtForkParent, AtForkChild);
  return s;
}

}  // namespace

State& GlobalState() {
  static State* s = CreateState();
  return *s;
}

uint64_t ThreadId() {
  static std::atomic<uint64_t> next{1};
  thread_local uint64_t id = next.fetch_add(1);
  return id;
}

std::vector<CUctx_st*>& ContextStack() {
  thread_local std::vector<CUctx_st*> stack;
  return stack;
}

CUstreamCaptureMode& ThreadCaptureMode() {
  thread_local CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  return mode;
}

void ResetLocked(State& s) {
  while (!s.allocations.empty()) FreeAllocationLocked(s, s.allocations.begin());
  for (CUctx_st* ctx : s.contexts) {
    ctx->destroyed = true;
    ctx->refcount = 0;
  }
  for (CUstream_st* st : s.streams) delete st;
  s.streams.clear();
  for (CUevent_st* ev : s.events) delete ev;
  s.events.clear();
  ResetGraphsAndArraysLocked(s);
  for (CUgraph_st* g : s.graphs) delete g;
  s.graphs.clear();
  s.captures.clear();
  s.stream_waits.clear();
  s.unordered_at_last_work.clear();
  s.ipc_opens.clear();
  for (auto& [base, m] : s.mappings) {
    munmap(reinterpret_cast<void*>(base), m.size);
  }
  s.mappings.clear();
  for (auto& [base, size] : s.reservations) {
    munmap(reinterpret_cast<void*>(base), size);
  }
  s.reservations.clear();
  for (auto& [h, p] : s.physical) close(p.fd);
  s.physical.clear();
  for (Device& d : s.devices) {
    d.used = 0;
    d.live_allocations = 0;
    d.primary.refcount = 0;
    d.default_pool.live = 0;
    d.default_pool.cached = 0;
    d.default_pool.release_threshold = 0;
  }
  s.call_counts.clear();
  s.initialized = false;
  ConfigureFromEnv(s);
  s.cv.notify_all();
}

Call::Call(const char* name) : s_(GlobalState()), lock_(s_.mu) { ++s_.call_counts[name]; }

CUresult Call::RequireInit() const {
  if (s_.forked_after_init || !s_.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  return CUDA_SUCCESS;
}

CUresult Call::RequireContext(CUctx_st** ctx) const {
  if (CUresult r = RequireInit(); r != CUDA_SUCCESS) return r;
  auto& stack = ContextStack();
  // A primary context whose last retain was released is inactive: the real driver rejects it
  // until it is retained again.
  if (stack.empty() || stack.back() == nullptr || stack.back()->refcount <= 0 ||
      stack.back()->destroyed) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  *ctx = stack.back();
  return CUDA_SUCCESS;
}

CUctx_st* ValidContext(State& s, CUcontext ctx) {
  for (int d = 0; d < s.device_count; ++d) {
    if (ctx == &s.devices[d].primary) return ctx;
  }
  if (s.contexts.count(ctx) != 0 && !ctx->destroyed) return ctx;
  return nullptr;
}

bool ValidDevice(const State& s, CUdevice dev) { return dev >= 0 && dev < s.device_count; }

namespace {
std::atomic<vramscope_fake_memory_observer> g_memory_observer{nullptr};
}  // namespace

void NotifyMemory(int operation, int device, uint64_t address, uint64_t bytes, int kind,
                  uint64_t stream) {
  if (vramscope_fake_memory_observer observer = g_memory_observer.load()) {
    observer(operation, device, address, bytes, kind, stream);
  }
}

}  // namespace vramscope::fake

VRAMSCOPE_FAKE_EXPORT void vramscope_fake_set_memory_observer(
    vramscope_fake_memory_observer observer) {
  vramscope::fake::g_memory_observer.store(observer);
}

namespace vramscope::fake {

bool Charge(State& s, int device, size_t bytes) {
  Device& d = s.devices[device];
  if (bytes > d.capacity || d.used > d.capacity - bytes) return false;
  d.used += bytes;
  return true;
}

void Uncharge(State& s, int device, size_t bytes) { s.devices[device].used -= bytes; }

Allocation* FindContaining(State& s, CUdeviceptr ptr, size_t len, CUdeviceptr* base) {
  auto it = s.allocations.upper_bound(ptr);
  if (it == s.allocations.begin()) return nullptr;
  --it;
  // A zero-size query still has to point inside the allocation.
  size_t need = len == 0 ? 1 : len;
  if (ptr - it->first >= it->second.size || it->second.size - (ptr - it->first) < need) {
    return nullptr;
  }
  if (base != nullptr) *base = it->first;
  return &it->second;
}

bool InMapping(const State& s, CUdeviceptr ptr, size_t len, CUmemAccess_flags access) {
  auto it = s.mappings.upper_bound(ptr);
  if (it == s.mappings.begin()) return false;
  --it;
  return ptr - it->first < it->second.size && it->second.size - (ptr - it->first) >= len &&
         (it->second.access & access) == access;
}

void* AllocStorage(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void FreeStorage(void* p, size_t bytes) { munmap(p, bytes); }

void FreeAllocationLocked(State& s, std::map<CUdeviceptr, Allocation>::iterator it) {
  Allocation& a = it->second;
  if (a.kind == AllocKind::kAsync) {
    // Stream-ordered memory goes back to its pool, which keeps it reserved (still charged)
    // until a synchronization point or cuMemPoolTrimTo releases it.
    a.pool->live -= a.charged;
    a.pool->cached += a.charged;
    --s.devices[a.device].live_allocations;
    NotifyMemory(VRAMSCOPE_FAKE_MEMORY_RELEASE, a.device, it->first, a.charged,
                 VRAMSCOPE_FAKE_MEMORY_STREAM_ORDERED, 0);
  } else if (a.charged > 0) {
    Uncharge(s, a.device, a.charged);
    --s.devices[a.device].live_allocations;
    NotifyMemory(VRAMSCOPE_FAKE_MEMORY_RELEASE, a.device, it->first, a.charged,
                 VRAMSCOPE_FAKE_MEMORY_DEVICE, 0);
  }
  s.ipc_opens.erase(it->first);
  if (a.storage != nullptr) FreeStorage(a.storage, a.size);
  s.allocations.erase(it);
}

void DestroyContextResourcesLocked(State& s, CUctx_st* ctx) {
  for (auto it = s.allocations.begin(); it != s.allocations.end();) {
    auto next = std::next(it);
    if (it->second.ctx == ctx) FreeAllocationLocked(s, it);
    it = next;
  }
  for (auto it = s.streams.begin(); it != s.streams.end();) {
    auto next = std::next(it);
    if ((*it)->ctx == ctx) {
      s.captures.erase(reinterpret_cast<uintptr_t>(*it));
      delete *it;
      s.streams.erase(it);
    }
    it = next;
  }
  for (auto it = s.events.begin(); it != s.events.end();) {
    auto next = std::next(it);
    if ((*it)->ctx == ctx) {
      delete *it;
      s.events.erase(it);
    }
    it = next;
  }
  DestroyContextGraphsAndArraysLocked(s, ctx);
  CUmemPoolHandle_st& pool = s.devices[ctx->device].default_pool;
  TrimPoolLocked(s, &pool, 0);
  s.cv.notify_all();
}

bool StreamKey(const State& s, CUstream stream, bool per_thread, uintptr_t* key) {
  if (stream == nullptr) {
    *key = reinterpret_cast<uintptr_t>(per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY);
    return true;
  }
  if (stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) {
    *key = reinterpret_cast<uintptr_t>(stream);
    return true;
  }
  if (s.streams.count(stream) == 0) return false;
  *key = reinterpret_cast<uintptr_t>(stream);
  return true;
}

CUresult CheckCaptureUnsafeLocked(State& s) {
  CUstreamCaptureMode mode = ThreadCaptureMode();
  if (mode == CU_STREAM_CAPTURE_MODE_RELAXED || s.captures.empty()) return CUDA_SUCCESS;
  uint64_t self = ThreadId();
  bool prohibited = false;
  for (auto& [key, c] : s.captures) {
    bool own = c.thread == self && c.mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    bool foreign_global = mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c.thread != self &&
                          c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (own || foreign_global) {
      c.invalidated = true;
      prohibited = true;
    }
  }
  return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult RejectIfCapturingLocked(State& s, uintptr_t key) {
  auto it = s.captures.find(key);
  if (it == s.captures.end()) return CUDA_SUCCESS;
  it->second.invalidated = true;
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

void CompleteEventLocked(State& s, CUevent_st* ev) {
  if (ev->status != CUevent_st::Status::kPending) return;
  ev->status = CUevent_st::Status::kComplete;
  ev->completed_at = std::chrono::steady_clock::now();
  if (ev->kernel) ResolveAutomaticLocked(s);
  s.cv.notify_all();
}

bool BlocksLocked(const CUevent_st* k, const CUevent_st* ev) {
  if (!k->kernel || k->status != CUevent_st::Status::kPending) return false;
  if (k->record_seq >= ev->record_seq || k->stream_ctx != ev->stream_ctx) return false;
  if (k->stream_key == ev->stream_key) return true;
  return (ev->stream_kind == kStreamLegacy && k->stream_kind == kStreamBlocking) ||
         (ev->stream_kind == kStreamBlocking && k->stream_kind == kStreamLegacy);
}

void ResolveAutomaticLocked(State& s) {
  for (CUevent_st* ev : s.events) {
    if (!ev->automatic || ev->status != CUevent_st::Status::kPending) continue;
    bool blocked = false;
    for (CUevent_st* k : s.events) {
      if (BlocksLocked(k, ev)) {
        blocked = true;
        break;
      }
    }
    if (!blocked) {
      ev->status = CUevent_st::Status::kComplete;
      ev->completed_at = std::chrono::steady_clock::now();
      s.cv.notify_all();
    }
  }
}

void TrimPoolLocked(State& s, CUmemPoolHandle_st* pool, size_t keep) {
  if (pool->cached <= keep) return;
  Uncharge(s, pool->device, pool->cached - keep);
  NotifyMemory(VRAMSCOPE_FAKE_MEMORY_POOL_TRIMMED, pool->device, reinterpret_cast<uint64_t>(pool),
               pool->cached - keep, VRAMSCOPE_FAKE_MEMORY_STREAM_ORDERED, 0);
  pool->cached = keep;
}

namespace {

// Waits for (or, without blocking sync, completes) every pending event selected by `pick`.
template <typename Pick>
void WaitPendingLocked(Call& call, Pick pick) {
  State& s = call.state();
  auto pending = [&] {
    for (CUevent_st* ev : s.events) {
      if (ev->status == CUevent_st::Status::kPending && pick(ev)) return true;
    }
    return false;
  };
  if ((s.manual_events || s.manual_kernels) && s.blocking_sync) {
    s.cv.wait(call.lock(), [&] { return !pending(); });
  } else {
    for (CUevent_st* ev : s.events) {
      if (ev->status == CUevent_st::Status::kPending && pick(ev)) CompleteEventLocked(s, ev);
    }
  }
}

void TrimAllPoolsLocked(State& s, int device) {
  CUmemPoolHandle_st& pool = s.devices[device].default_pool;
  TrimPoolLocked(s, &pool, pool.release_threshold);
}

}  // namespace

void WaitEventLocked(Call& call, CUevent_st* ev, int device) {
  State& s = call.state();
  if (ev->status == CUevent_st::Status::kPending) s.blocked_wait_stream = ev->stream_key;
  // The kernels before an automatic event finish with it ("the host waited, so the GPU did").
  WaitPendingLocked(call, [ev](CUevent_st* e) { return e == ev || BlocksLocked(e, ev); });
  s.blocked_wait_stream = 0;
  TrimAllPoolsLocked(call.state(), device);
}

void WaitStreamLocked(Call& call, uintptr_t key, int device) {
  WaitPendingLocked(call, [key](CUevent_st* e) { return e->stream_key == key; });
  TrimAllPoolsLocked(call.state(), device);
}

void WaitContextLocked(Call& call, CUctx_st* ctx) {
  WaitPendingLocked(call, [ctx](CUevent_st* e) { return e->ctx == ctx; });
  TrimAllPoolsLocked(call.state(), ctx->device);
}

}  // namespace vramscope::fake
