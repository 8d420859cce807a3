#include "cupti.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cupti_activity.h>
#include <cupti_result.h>

#include "driver.h"
#include "log.h"
#include "ring_events.h"

namespace vramscope::interposer {
namespace cupti_internal {
constinit std::atomic<int> g_cupti_state{static_cast<int>(CuptiState::kOff)};
}  // namespace cupti_internal

namespace {

using cupti_internal::CuptiState;
using cupti_internal::g_cupti_state;

// A fixed set of activity buffers, allocated once at start. 8 x 1 MiB holds about 70,000 memory
// records between flushes; when all are in flight CUPTI counts drops rather than us allocating.
constexpr int kBuffers = 8;
constexpr std::size_t kBufferBytes = std::size_t{1} << 20;
constexpr std::size_t kBufferAlign = 8;  // CUPTI's ALIGN_SIZE

struct CuptiApi {
  decltype(&::cuptiActivityEnable) activity_enable = nullptr;
  decltype(&::cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&::cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&::cuptiActivityGetNextRecord) get_next_record = nullptr;
  decltype(&::cuptiActivityGetNumDroppedRecords) get_num_dropped = nullptr;
  decltype(&::cuptiGetResultString) get_result_string = nullptr;
  decltype(&::cuptiActivityRegisterTimestampCallback) register_timestamp = nullptr;  // optional
};

constinit CuptiApi g_api{};
constinit void* g_buffers[kBuffers] = {};
// Bit i set: buffer i is free to hand to CUPTI.
constinit std::atomic<std::uint32_t> g_free_buffers{0};
// Added to CUPTI's timestamps to put them on CLOCK_MONOTONIC (0 with the timestamp callback).
constinit std::atomic<std::int64_t> g_clock_offset_ns{0};
constinit std::atomic<std::uint64_t> g_dropped{0};

// The helper thread: periodic flush, and the final forced flush the exit handler asks for.
struct Flusher {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t wake = PTHREAD_COND_INITIALIZER;  // to the helper
  pthread_cond_t done = PTHREAD_COND_INITIALIZER;  // from the helper
  bool started = false;
  bool final_requested = false;
  bool final_done = false;
  std::uint32_t period_ms = 100;
};
constinit Flusher g_flusher{};

std::uint32_t EnvMs(const char* name, std::uint32_t fallback) {
  const char* value = getenv(name);
  if (value == nullptr || value[0] == '\0') return fallback;
  char* end = nullptr;
  const unsigned long parsed = strtoul(value, &end, 10);
  if (end == value || *end != '\0' || parsed > 3600u * 1000u) {
    VRAMSCOPE_LOG(kWarn, "%s=%s is not a number of milliseconds; using %u", name, value, fallback);
    return fallback;
  }
  return static_cast<std::uint32_t>(parsed);
}

const char* ResultString(CUptiResult result) {
  const char* text = nullptr;
  if (g_api.get_result_string == nullptr || g_api.get_result_string(result, &text) != 0 ||
      text == nullptr) {
    return "unknown CUPTI error";
  }
  return text;
}

// Another profiler (Nsight Systems/Compute, the PyTorch profiler, a CUPTI injection) already
// holds CUPTI: its activity API admits one client.
bool HeldByAnotherTool(CUptiResult result) {
  return result == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED ||
         result == CUPTI_ERROR_MAX_LIMIT_REACHED || result == CUPTI_ERROR_NOT_COMPATIBLE ||
         result == CUPTI_ERROR_OLD_PROFILER_API_INITIALIZED;
}

std::uint64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

std::uint64_t RealtimeNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

// CUPTI's timestamp source: the ring's clock.
std::uint64_t CUPTIAPI TimestampNs() { return MonotonicNs(); }

std::uint64_t ToRingClock(std::uint64_t cupti_ns) {
  if (cupti_ns == 0) return 0;  // the writer stamps it now
  const std::int64_t shifted =
      static_cast<std::int64_t>(cupti_ns) + g_clock_offset_ns.load(std::memory_order_relaxed);
  return shifted > 0 ? static_cast<std::uint64_t>(shifted) : 1;
}

void* OpenLibrary() {
  if (const char* path = getenv("VRAMSCOPE_CUPTI_LIB"); path != nullptr && path[0] != '\0') {
    void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      VRAMSCOPE_LOG(kWarn, "cannot open VRAMSCOPE_CUPTI_LIB=%s (%s); continuing without CUPTI",
                    path, why != nullptr ? why : "?");
    }
    return handle;
  }
  static constexpr const char* kCandidates[] = {
      "libcupti.so.13",
      "/usr/local/cuda/lib64/libcupti.so.13",
      "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
      "/usr/local/cuda/lib/libcupti.so.13",
  };
  for (const char* candidate : kCandidates) {
    if (void* handle = dlopen(candidate, RTLD_NOW | RTLD_LOCAL)) return handle;
  }
  VRAMSCOPE_LOG(kWarn,
                "cannot find libcupti.so.13 (set VRAMSCOPE_CUPTI_LIB=/path/to/libcupti.so.13); "
                "continuing without CUPTI memory records");
  return nullptr;
}

bool LoadApi(void* handle) {
  const DlsymFn real_dlsym = RealDlsym();
  if (real_dlsym == nullptr) return false;
  CuptiApi api;
  api.activity_enable =
      reinterpret_cast<decltype(api.activity_enable)>(real_dlsym(handle, "cuptiActivityEnable"));
  api.register_callbacks = reinterpret_cast<decltype(api.register_callbacks)>(
      real_dlsym(handle, "cuptiActivityRegisterCallbacks"));
  api.flush_all =
      reinterpret_cast<decltype(api.flush_all)>(real_dlsym(handle, "cuptiActivityFlushAll"));
  api.get_next_record = reinterpret_cast<decltype(api.get_next_record)>(
      real_dlsym(handle, "cuptiActivityGetNextRecord"));
  api.get_num_dropped = reinterpret_cast<decltype(api.get_num_dropped)>(
      real_dlsym(handle, "cuptiActivityGetNumDroppedRecords"));
  api.get_result_string =
      reinterpret_cast<decltype(api.get_result_string)>(real_dlsym(handle, "cuptiGetResultString"));
  api.register_timestamp = reinterpret_cast<decltype(api.register_timestamp)>(
      real_dlsym(handle, "cuptiActivityRegisterTimestampCallback"));
  if (api.activity_enable == nullptr || api.register_callbacks == nullptr ||
      api.flush_all == nullptr || api.get_next_record == nullptr ||
      api.get_num_dropped == nullptr) {
    VRAMSCOPE_LOG(kWarn,
                  "libcupti lacks an activity function vramscope needs; continuing "
                  "without CUPTI memory records");
    return false;
  }
  g_api = api;
  return true;
}

// --- CUPTI's buffer callbacks (CUPTI's threads, or the one calling cuptiActivityFlushAll) ------

void CUPTIAPI BufferRequested(std::uint8_t** buffer, std::size_t* size,
                              std::size_t* max_num_records) {
  *max_num_records = 0;
  std::uint32_t free_bits = g_free_buffers.load(std::memory_order_acquire);
  while (free_bits != 0) {
    const int index = __builtin_ctz(free_bits);
    const std::uint32_t bit = 1u << index;
    if (g_free_buffers.compare_exchange_weak(free_bits, free_bits & ~bit,
                                             std::memory_order_acq_rel)) {
      *buffer = static_cast<std::uint8_t*>(g_buffers[index]);
      *size = kBufferBytes;
      return;
    }
  }
  // All buffers in flight: CUPTI drops records and counts them (reported at completion).
  *buffer = nullptr;
  *size = 0;
}

void GiveBack(const std::uint8_t* buffer) {
  for (int i = 0; i < kBuffers; ++i) {
    if (g_buffers[i] == buffer) {
      g_free_buffers.fetch_or(1u << i, std::memory_order_acq_rel);
      return;
    }
  }
  // Not ours (another client's buffer completed to our callback): its owner frees it.
}

std::uint8_t ClampDevice(std::uint32_t device) {
  return device < VRAMSCOPE_RING_MAX_DEVICES ? static_cast<std::uint8_t>(device) : 0;
}

void WriteMemory(RingWriter* ring, const CUpti_ActivityMemory4& m) {
  std::uint8_t operation = VRAMSCOPE_RING_CUPTI_UNSPECIFIED;
  if (m.memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION) {
    operation = VRAMSCOPE_RING_CUPTI_ALLOCATION;
  } else if (m.memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE) {
    operation = VRAMSCOPE_RING_CUPTI_RELEASE;
  } else {
    return;
  }
  vramscope_ring_cupti_payload payload{};
  payload.address = m.address;
  payload.bytes = m.bytes;
  payload.stream = m.streamId == CUPTI_INVALID_STREAM_ID ? 0 : m.streamId;
  payload.memory_kind = static_cast<std::uint32_t>(m.memoryKind);
  payload.pool_type = static_cast<std::uint32_t>(m.memoryPoolConfig.memoryPoolType);
  payload.pool_address = m.memoryPoolConfig.address;
  (void)ring->RecordCuptiMemory(ClampDevice(m.deviceId), operation, ToRingClock(m.timestamp),
                                payload);
}

void WritePool(RingWriter* ring, const CUpti_ActivityMemoryPool3& p) {
  std::uint8_t operation = VRAMSCOPE_RING_CUPTI_UNSPECIFIED;
  switch (p.memoryPoolOperationType) {
    case CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_CREATED:
      operation = VRAMSCOPE_RING_CUPTI_POOL_CREATED;
      break;
    case CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_DESTROYED:
      operation = VRAMSCOPE_RING_CUPTI_POOL_DESTROYED;
      break;
    case CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_TRIMMED:
      operation = VRAMSCOPE_RING_CUPTI_POOL_TRIMMED;
      break;
    default:
      return;
  }
  vramscope_ring_cupti_payload payload{};
  payload.address = p.address;
  payload.pool_address = p.address;
  payload.bytes = p.size;
  payload.pool_type = static_cast<std::uint32_t>(p.memoryPoolType);
  (void)ring->RecordCuptiMemory(ClampDevice(p.deviceId), operation, ToRingClock(p.timestamp),
                                payload);
}

void NoteDropped(RingWriter* ring, std::size_t dropped) {
  if (dropped == 0) return;
  g_dropped.fetch_add(dropped, std::memory_order_relaxed);
  VRAMSCOPE_LOG_ONCE(kWarn,
                     "CUPTI dropped %zu memory records (its buffers were full); the report "
                     "counts them",
                     dropped);
  if (ring == nullptr) return;
  vramscope_ring_cupti_payload payload{};
  payload.bytes = dropped;
  (void)ring->RecordCuptiMemory(0, VRAMSCOPE_RING_CUPTI_RECORDS_DROPPED, 0, payload);
}

void CUPTIAPI BufferCompleted(CUcontext context, std::uint32_t stream_id, std::uint8_t* buffer,
                              std::size_t /*size*/, std::size_t valid_size) {
  RingWriter* ring = Ring();
  if (buffer != nullptr && valid_size > 0 && ring != nullptr) {
    CUpti_Activity* record = nullptr;
    while (g_api.get_next_record(buffer, valid_size, &record) == CUPTI_SUCCESS) {
      if (record->kind == CUPTI_ACTIVITY_KIND_MEMORY2) {
        WriteMemory(ring, *reinterpret_cast<const CUpti_ActivityMemory4*>(record));
      } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMORY_POOL) {
        WritePool(ring, *reinterpret_cast<const CUpti_ActivityMemoryPool3*>(record));
      }
    }
  }
  std::size_t dropped = 0;
  if (g_api.get_num_dropped(context, stream_id, &dropped) == CUPTI_SUCCESS) {
    NoteDropped(ring, dropped);
  }
  if (buffer != nullptr) GiveBack(buffer);
}

// --- the helper thread ----------------------------------------------------------------------

void* FlusherMain(void* /*arg*/) {
  Flusher& f = g_flusher;
  pthread_mutex_lock(&f.mu);
  while (!f.final_requested) {
    timespec deadline{};
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    const std::uint64_t ns =
        static_cast<std::uint64_t>(deadline.tv_nsec) + std::uint64_t{f.period_ms} * 1000000u;
    deadline.tv_sec += static_cast<time_t>(ns / 1000000000u);
    deadline.tv_nsec = static_cast<long>(ns % 1000000000u);
    pthread_cond_timedwait(&f.wake, &f.mu, &deadline);
    if (f.final_requested) break;
    pthread_mutex_unlock(&f.mu);
    // Default flush: completed buffers only; cheap when nothing happened.
    (void)g_api.flush_all(0);
    pthread_mutex_lock(&f.mu);
  }
  pthread_mutex_unlock(&f.mu);
  (void)g_api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  pthread_mutex_lock(&f.mu);
  f.final_done = true;
  pthread_cond_broadcast(&f.done);
  pthread_mutex_unlock(&f.mu);
  return nullptr;
}

bool StartFlusher() {
  Flusher& f = g_flusher;
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&f.wake, &attr);
  pthread_cond_init(&f.done, &attr);
  pthread_condattr_destroy(&attr);
  f.period_ms = EnvMs("VRAMSCOPE_CUPTI_FLUSH_MS", 100);
  if (f.period_ms == 0) f.period_ms = 1;
  sigset_t all;
  sigset_t saved;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &saved);
  pthread_attr_t thread_attr;
  pthread_attr_init(&thread_attr);
  pthread_attr_setdetachstate(&thread_attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&thread_attr, 256 * 1024);
  pthread_t thread;
  const int error = pthread_create(&thread, &thread_attr, FlusherMain, nullptr);
  pthread_attr_destroy(&thread_attr);
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (error != 0) {
    VRAMSCOPE_LOG(kWarn,
                  "cannot start the CUPTI flush thread (error %d); CUPTI records arrive "
                  "when CUPTI's buffers fill",
                  error);
    return false;
  }
  pthread_mutex_lock(&f.mu);
  f.started = true;
  pthread_mutex_unlock(&f.mu);
  return true;
}

bool AllocateBuffers() {
  std::uint32_t bits = 0;
  for (int i = 0; i < kBuffers; ++i) {
    // Heap (not static) buffers: if another client re-registers CUPTI's callbacks, a buffer of
    // ours may complete to its callback, which frees it.
    void* buffer = nullptr;
    if (g_buffers[i] == nullptr && posix_memalign(&buffer, kBufferAlign, kBufferBytes) == 0) {
      g_buffers[i] = buffer;
    }
    if (g_buffers[i] != nullptr) bits |= 1u << i;
  }
  g_free_buffers.store(bits, std::memory_order_release);
  return bits != 0;
}

bool Start() {
  void* handle = OpenLibrary();
  if (handle == nullptr || !LoadApi(handle)) return false;
  if (!AllocateBuffers()) {
    VRAMSCOPE_LOG(kWarn, "cannot allocate CUPTI buffers; continuing without CUPTI");
    return false;
  }
  // The clock first, before any kind is enabled, so every record is on the ring's clock.
  bool have_clock = false;
  if (g_api.register_timestamp != nullptr) {
    have_clock = g_api.register_timestamp(TimestampNs) == CUPTI_SUCCESS;
  }
  if (!have_clock) {
    // CUPTI stamps with CLOCK_REALTIME on Linux: shift by the offset now.
    const std::uint64_t mono = MonotonicNs();
    const std::uint64_t real = RealtimeNs();
    g_clock_offset_ns.store(static_cast<std::int64_t>(mono) - static_cast<std::int64_t>(real),
                            std::memory_order_relaxed);
  }
  CUptiResult result = g_api.register_callbacks(BufferRequested, BufferCompleted);
  if (result == CUPTI_SUCCESS) result = g_api.activity_enable(CUPTI_ACTIVITY_KIND_MEMORY2);
  if (result == CUPTI_SUCCESS) {
    // Pool records are a complement: without them the memory records still flow.
    const CUptiResult pool = g_api.activity_enable(CUPTI_ACTIVITY_KIND_MEMORY_POOL);
    if (pool != CUPTI_SUCCESS) {
      VRAMSCOPE_LOG(kInfo, "CUPTI memory-pool records unavailable (%s)", ResultString(pool));
    }
  }
  if (result != CUPTI_SUCCESS) {
    if (HeldByAnotherTool(result)) {
      VRAMSCOPE_LOG_ONCE(kWarn,
                         "CUPTI is already in use by another tool (Nsight, the PyTorch profiler, "
                         "a CUPTI injection: %s); continuing with hooks only, without the "
                         "driver's memory records",
                         ResultString(result));
    } else {
      VRAMSCOPE_LOG_ONCE(kWarn,
                         "cannot enable CUPTI memory activity (%s); continuing with hooks only",
                         ResultString(result));
    }
    return false;
  }
  if (!StartFlusher()) return true;  // records still arrive as buffers complete
  VRAMSCOPE_LOG(kInfo, "CUPTI memory activity on (%s clock)", have_clock ? "callback" : "offset");
  return true;
}

}  // namespace

void cupti_internal::StartPendingCupti() {
  int expected = static_cast<int>(CuptiState::kPending);
  if (!g_cupti_state.compare_exchange_strong(expected, static_cast<int>(CuptiState::kStarting),
                                             std::memory_order_acq_rel)) {
    return;
  }
  const bool on = Start();
  g_cupti_state.store(static_cast<int>(on ? CuptiState::kOn : CuptiState::kUnavailable),
                      std::memory_order_release);
}

void ArmCupti(bool enabled) {
  if (!enabled) return;
  int expected = static_cast<int>(CuptiState::kOff);
  (void)g_cupti_state.compare_exchange_strong(expected, static_cast<int>(CuptiState::kPending),
                                              std::memory_order_acq_rel);
}

void FlushCuptiAtExit() {
  if (g_cupti_state.load(std::memory_order_acquire) != static_cast<int>(CuptiState::kOn)) return;
  Flusher& f = g_flusher;
  const std::uint32_t timeout_ms = EnvMs("VRAMSCOPE_CUPTI_EXIT_TIMEOUT_MS", 2000);
  pthread_mutex_lock(&f.mu);
  if (!f.started) {
    pthread_mutex_unlock(&f.mu);
    return;
  }
  f.final_requested = true;
  pthread_cond_signal(&f.wake);
  timespec deadline{};
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  const std::uint64_t ns =
      static_cast<std::uint64_t>(deadline.tv_nsec) + std::uint64_t{timeout_ms} * 1000000u;
  deadline.tv_sec += static_cast<time_t>(ns / 1000000000u);
  deadline.tv_nsec = static_cast<long>(ns % 1000000000u);
  int wait = 0;
  while (!f.final_done && wait == 0) wait = pthread_cond_timedwait(&f.done, &f.mu, &deadline);
  const bool done = f.final_done;
  pthread_mutex_unlock(&f.mu);
  if (!done) {
    VRAMSCOPE_LOG(kWarn,
                  "CUPTI's final flush did not finish within %u ms "
                  "(VRAMSCOPE_CUPTI_EXIT_TIMEOUT_MS); its last records are lost",
                  timeout_ms);
  }
}

void CuptiForkChild() {
  // CUPTI's threads and ours did not survive the fork; its state is the parent's. Hooks only.
  if (g_cupti_state.load(std::memory_order_relaxed) != static_cast<int>(CuptiState::kOff)) {
    g_cupti_state.store(static_cast<int>(CuptiState::kUnavailable), std::memory_order_relaxed);
  }
  const pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  memcpy(&g_flusher.mu, &fresh, sizeof(fresh));
  g_flusher.started = false;
}

bool CuptiActive() {
  return g_cupti_state.load(std::memory_order_acquire) == static_cast<int>(CuptiState::kOn);
}

std::uint64_t CuptiDroppedRecords() { return g_dropped.load(std::memory_order_relaxed); }

}  // namespace vramscope::interposer
