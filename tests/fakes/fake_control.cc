// Test control API of the fake CUDA driver. See fake_cuda_control.h.
#include <mutex>
#include <string>

#include "fake_cuda_control.h"
#include "fake_state.h"

namespace {

using vramscope::fake::GlobalState;
using vramscope::fake::kMaxDevices;
using vramscope::fake::State;

bool InRange(int device) { return device >= 0 && device < kMaxDevices; }

bool IsPending(const CUevent_st* ev) { return ev->status == CUevent_st::Status::kPending; }

}  // namespace

VRAMSCOPE_FAKE_EXPORT void vramscope_fake_reset(void) {
  State& s = GlobalState();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    vramscope::fake::ResetLocked(s);
  }
  vramscope::fake::ContextStack().clear();
  vramscope::fake::ThreadCaptureMode() = CU_STREAM_CAPTURE_MODE_GLOBAL;
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_set_capacity(int device, size_t bytes) {
  if (!InRange(device)) return -1;
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  s.devices[device].capacity = bytes;
  return 0;
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_set_device_count(int count) {
  if (count < 1 || count > kMaxDevices) return -1;
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  s.device_count = count;
  return 0;
}

VRAMSCOPE_FAKE_EXPORT void vramscope_fake_set_manual_events(int on) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  s.manual_events = on != 0;
}

VRAMSCOPE_FAKE_EXPORT void vramscope_fake_set_manual_kernels(int on) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  s.manual_kernels = on != 0;
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_complete_kernels(CUstream stream, int max) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  uintptr_t key = 0;
  if (!vramscope::fake::StreamKey(s, stream, false, &key)) return 0;
  int n = 0;
  while (max < 0 || n < max) {
    CUevent_st* oldest = nullptr;
    for (CUevent_st* ev : s.events) {
      if (ev->kernel && IsPending(ev) && ev->stream_key == key &&
          (oldest == nullptr || ev->record_seq < oldest->record_seq)) {
        oldest = ev;
      }
    }
    if (oldest == nullptr) break;
    vramscope::fake::CompleteEventLocked(s, oldest);
    ++n;
  }
  return n;
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_pending_kernels(void) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  int n = 0;
  for (CUevent_st* ev : s.events) n += ev->kernel && IsPending(ev) ? 1 : 0;
  return n;
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_pending_kernels_on(CUstream stream) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  uintptr_t key = 0;
  if (!vramscope::fake::StreamKey(s, stream, false, &key)) return 0;
  int n = 0;
  for (CUevent_st* ev : s.events) n += ev->kernel && IsPending(ev) && ev->stream_key == key;
  return n;
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_unordered_at_last_work(CUstream stream) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  uintptr_t key = 0;
  if (!vramscope::fake::StreamKey(s, stream, false, &key)) return -1;
  const auto it = s.unordered_at_last_work.find(key);
  return it == s.unordered_at_last_work.end() ? -1 : static_cast<int>(it->second.size());
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_kernel_unordered_at_last_work(CUstream stream,
                                                                       uint64_t kernel) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  uintptr_t key = 0;
  if (!vramscope::fake::StreamKey(s, stream, false, &key)) return -1;
  const auto it = s.unordered_at_last_work.find(key);
  if (it == s.unordered_at_last_work.end()) return -1;
  for (uint64_t seq : it->second) {
    if (seq == kernel) return 1;
  }
  return 0;
}

VRAMSCOPE_FAKE_EXPORT uint64_t vramscope_fake_last_kernel(void) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.last_kernel_seq;
}

VRAMSCOPE_FAKE_EXPORT CUstream vramscope_fake_blocked_wait_stream(void) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  return reinterpret_cast<CUstream>(s.blocked_wait_stream);
}

VRAMSCOPE_FAKE_EXPORT void vramscope_fake_set_blocking_sync(int on) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  s.blocking_sync = on != 0;
  s.cv.notify_all();
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_complete_all_events(void) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  int n = 0;
  for (CUevent_st* ev : s.events) {
    if (IsPending(ev)) {
      vramscope::fake::CompleteEventLocked(s, ev);
      ++n;
    }
  }
  return n;
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_complete_next_event(void) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  CUevent_st* oldest = nullptr;
  for (CUevent_st* ev : s.events) {
    if (IsPending(ev) && (oldest == nullptr || ev->record_seq < oldest->record_seq)) oldest = ev;
  }
  if (oldest == nullptr) return 0;
  vramscope::fake::CompleteEventLocked(s, oldest);
  return 1;
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_pending_events(void) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  int n = 0;
  for (CUevent_st* ev : s.events) n += IsPending(ev) ? 1 : 0;
  return n;
}

// An entry point no <cuda.h> declares, standing for a newer driver's (ordered_test).
VRAMSCOPE_FAKE_EXPORT CUresult cuVramscopeFakeFutureEntryPoint(void) { return CUDA_SUCCESS; }

VRAMSCOPE_FAKE_EXPORT uint64_t vramscope_fake_unmaps_under_pending_work(void) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.unmaps_under_pending_work;
}

VRAMSCOPE_FAKE_EXPORT uint64_t vramscope_fake_call_count(const char* exact_name) {
  if (exact_name == nullptr) return 0;
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.call_counts.find(exact_name);
  return it == s.call_counts.end() ? 0 : it->second;
}

VRAMSCOPE_FAKE_EXPORT uint64_t vramscope_fake_total_calls(void) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  uint64_t n = 0;
  for (const auto& [name, count] : s.call_counts) {
    if (name.rfind("lookup:", 0) != 0) n += count;
  }
  return n;
}

VRAMSCOPE_FAKE_EXPORT uint64_t vramscope_fake_lookup_count(const char* symbol) {
  if (symbol == nullptr) return 0;
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.call_counts.find(std::string("lookup:") + symbol);
  return it == s.call_counts.end() ? 0 : it->second;
}

VRAMSCOPE_FAKE_EXPORT size_t vramscope_fake_live_bytes(int device) {
  if (!InRange(device)) return static_cast<size_t>(-1);
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.devices[device].used;
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_live_allocations(int device) {
  if (!InRange(device)) return -1;
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.devices[device].live_allocations;
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_live_host_allocations(void) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  int n = 0;
  for (const auto& [base, a] : s.allocations) {
    n += (a.kind == vramscope::fake::AllocKind::kHost ||
          a.kind == vramscope::fake::AllocKind::kHostRegistered ||
          a.kind == vramscope::fake::AllocKind::kManaged)
             ? 1
             : 0;
  }
  return n;
}

VRAMSCOPE_FAKE_EXPORT size_t vramscope_fake_pool_cached_bytes(int device) {
  if (!InRange(device)) return static_cast<size_t>(-1);
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.devices[device].default_pool.cached;
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_live_reservations(void) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  return static_cast<int>(s.reservations.size());
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_live_mappings(void) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  return static_cast<int>(s.mappings.size());
}

VRAMSCOPE_FAKE_EXPORT uint32_t vramscope_fake_access_devices(uint64_t ptr) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.mappings.upper_bound(ptr);
  if (it == s.mappings.begin()) return 0;
  --it;
  return ptr - it->first < it->second.size ? it->second.access_devices : 0;
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_active_captures(void) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  return static_cast<int>(s.captures.size());
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_invalidated_captures(void) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  int n = 0;
  for (const auto& [key, c] : s.captures) n += c.invalidated ? 1 : 0;
  return n;
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_forked_after_init(void) {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.forked_after_init ? 1 : 0;
}
