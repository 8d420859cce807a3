// A fake CUPTI (libcupti.so.13, built into its own directory tests/fakes/fake_cupti/) for CI:
// the activity functions the shim uses (interposer/shim/cupti.h), producing MEMORY2 records for
// the memory the fake driver hands out and takes back, and MEMORY_POOL TRIMMED records when it
// trims a stream-ordered pool (vramscope_fake_set_memory_observer).
//
// Implemented: cuptiActivityEnable (MEMORY2, MEMORY_POOL; others CUPTI_ERROR_NOT_SUPPORTED),
// cuptiActivityDisable, cuptiActivityRegisterCallbacks, cuptiActivityRegisterTimestampCallback,
// cuptiActivityFlushAll (delivers every pending record through the client's buffer callbacks,
// as many buffers as needed), cuptiActivityGetNextRecord, cuptiActivityGetNumDroppedRecords,
// cuptiGetResultString. Records are kept until a flush (the real CUPTI also delivers when a
// buffer fills); timestamps come from the registered callback, else CLOCK_REALTIME as CUPTI's.
// The fake driver is found with dlopen("libcuda.so.1", RTLD_NOLOAD) when MEMORY2 is enabled.
//
// Modes, VRAMSCOPE_FAKE_CUPTI_MODE (read when MEMORY2 is enabled):
//   (unset)       normal
//   subscriber    another tool holds CUPTI: cuptiActivityEnable returns
//                 CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
//   drop          every third record is dropped and counted (cuptiActivityGetNumDroppedRecords)
//   slow_flush    a forced flush first sleeps VRAMSCOPE_FAKE_CUPTI_FLUSH_DELAY_MS (default 600000)
// Also: a client buffer callback that returns no buffer makes the records dropped, as in CUPTI.
//
// Thread safety: one mutex; the client's callbacks are called without it held.
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include <cupti_activity.h>
#include <cupti_result.h>

#include "fake_cuda_control.h"

#define FAKE_CUPTI_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

enum class Mode { kNormal, kSubscriber, kDrop, kSlowFlush };

struct State {
  std::mutex mu;
  Mode mode = Mode::kNormal;
  bool memory2 = false;
  bool memory_pool = false;
  bool observing = false;
  CUpti_BuffersCallbackRequestFunc request = nullptr;
  CUpti_BuffersCallbackCompleteFunc complete = nullptr;
  CUpti_TimestampCallbackFunc timestamp = nullptr;
  // MEMORY2 and MEMORY_POOL records, in order; pool records flagged by their kind.
  struct Record {
    CUpti_ActivityMemory4 memory;
    CUpti_ActivityMemoryPool3 pool;
  };
  std::vector<Record> pending;
  std::uint64_t seen = 0;
  std::size_t dropped = 0;
  std::uint32_t correlation = 0;
  std::atomic<pid_t> owner{0};  // the process that enabled MEMORY2
};

State& S() {
  static State* state = new State();  // never destroyed: callbacks may come during exit
  return *state;
}

std::uint64_t Now(const State& s) {
  if (s.timestamp != nullptr) return s.timestamp();
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

Mode ReadMode() {
  const char* mode = getenv("VRAMSCOPE_FAKE_CUPTI_MODE");
  if (mode == nullptr) return Mode::kNormal;
  if (strcmp(mode, "subscriber") == 0) return Mode::kSubscriber;
  if (strcmp(mode, "drop") == 0) return Mode::kDrop;
  if (strcmp(mode, "slow_flush") == 0) return Mode::kSlowFlush;
  return Mode::kNormal;
}

// The fake driver's observer (its lock held): queue a record, never call the driver.
void Observe(int operation, int device, std::uint64_t address, std::uint64_t bytes, int kind,
             std::uint64_t stream) {
  State& s = S();
  // A fork child inherits the observer, not CUPTI (and maybe our lock held by a thread that is
  // gone): it records nothing, as a client never flushes there.
  if (getpid() != s.owner.load()) return;
  std::lock_guard<std::mutex> lock(s.mu);
  if (operation == VRAMSCOPE_FAKE_MEMORY_POOL_TRIMMED) {
    if (!s.memory_pool) return;
    State::Record r;
    memset(&r, 0, sizeof(r));
    CUpti_ActivityMemoryPool3& p = r.pool;
    p.kind = CUPTI_ACTIVITY_KIND_MEMORY_POOL;
    p.memoryPoolOperationType = CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_TRIMMED;
    p.memoryPoolType = CUPTI_ACTIVITY_MEMORY_POOL_TYPE_LOCAL;
    p.correlationId = ++s.correlation;
    p.processId = static_cast<std::uint32_t>(getpid());
    p.deviceId = static_cast<std::uint32_t>(device);
    p.address = address;
    p.size = bytes;
    p.timestamp = Now(s);
    r.memory.kind = CUPTI_ACTIVITY_KIND_MEMORY_POOL;
    s.pending.push_back(r);
    return;
  }
  if (!s.memory2) return;
  ++s.seen;
  if (s.mode == Mode::kDrop && s.seen % 3 == 0) {
    ++s.dropped;
    return;
  }
  State::Record r;
  memset(&r, 0, sizeof(r));
  CUpti_ActivityMemory4& m = r.memory;
  m.kind = CUPTI_ACTIVITY_KIND_MEMORY2;
  m.memoryOperationType = operation == VRAMSCOPE_FAKE_MEMORY_ALLOCATION
                              ? CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION
                              : CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE;
  m.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
  m.correlationId = ++s.correlation;
  m.address = address;
  m.bytes = bytes;
  m.timestamp = Now(s);
  m.processId = static_cast<std::uint32_t>(getpid());
  m.deviceId = static_cast<std::uint32_t>(device);
  m.contextId = static_cast<std::uint32_t>(device) + 1;
  m.streamId = CUPTI_INVALID_STREAM_ID;
  if (kind == VRAMSCOPE_FAKE_MEMORY_STREAM_ORDERED) {
    m.isAsync = 1;
    m.streamId = static_cast<std::uint32_t>(stream & 0xffffffu);
    m.memoryPoolConfig.memoryPoolType = CUPTI_ACTIVITY_MEMORY_POOL_TYPE_LOCAL;
    m.memoryPoolConfig.address = 0x7000000000ull + static_cast<std::uint64_t>(device);
  }
  s.pending.push_back(r);
}

bool StartObserving() {
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (cuda == nullptr) return false;
  auto set_observer = reinterpret_cast<void (*)(vramscope_fake_memory_observer)>(
      dlsym(cuda, "vramscope_fake_set_memory_observer"));
  if (set_observer == nullptr) return false;
  S().owner.store(getpid());
  set_observer(Observe);
  return true;
}

std::size_t RecordSize(const CUpti_Activity* record) {
  return record->kind == CUPTI_ACTIVITY_KIND_MEMORY_POOL ? sizeof(CUpti_ActivityMemoryPool3)
                                                         : sizeof(CUpti_ActivityMemory4);
}

}  // namespace

FAKE_CUPTI_EXPORT CUptiResult cuptiGetResultString(CUptiResult result, const char** str) {
  if (str == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  switch (result) {
    case CUPTI_SUCCESS:
      *str = "CUPTI_SUCCESS";
      break;
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
      *str = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED";
      break;
    case CUPTI_ERROR_NOT_SUPPORTED:
      *str = "CUPTI_ERROR_NOT_SUPPORTED";
      break;
    default:
      *str = "CUPTI_ERROR_UNKNOWN";
      break;
  }
  return CUPTI_SUCCESS;
}

FAKE_CUPTI_EXPORT CUptiResult cuptiActivityRegisterCallbacks(
    CUpti_BuffersCallbackRequestFunc request, CUpti_BuffersCallbackCompleteFunc complete) {
  if (request == nullptr || complete == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.request = request;
  s.complete = complete;
  return CUPTI_SUCCESS;
}

FAKE_CUPTI_EXPORT CUptiResult
cuptiActivityRegisterTimestampCallback(CUpti_TimestampCallbackFunc timestamp) {
  if (timestamp == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.timestamp = timestamp;
  return CUPTI_SUCCESS;
}

FAKE_CUPTI_EXPORT CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind) {
  State& s = S();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.mode = ReadMode();
    if (s.mode == Mode::kSubscriber) return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    if (kind == CUPTI_ACTIVITY_KIND_MEMORY_POOL) {
      s.memory_pool = true;  // TRIMMED records when the fake trims a stream-ordered pool
      return CUPTI_SUCCESS;
    }
    if (kind != CUPTI_ACTIVITY_KIND_MEMORY2) return CUPTI_ERROR_NOT_SUPPORTED;
    s.memory2 = true;
    if (s.observing) return CUPTI_SUCCESS;
  }
  // Outside our lock: the observer is installed under the driver's.
  if (!StartObserving()) return CUPTI_ERROR_NOT_INITIALIZED;
  std::lock_guard<std::mutex> lock(s.mu);
  s.observing = true;
  return CUPTI_SUCCESS;
}

FAKE_CUPTI_EXPORT CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (kind == CUPTI_ACTIVITY_KIND_MEMORY2) s.memory2 = false;
  if (kind == CUPTI_ACTIVITY_KIND_MEMORY_POOL) s.memory_pool = false;
  return CUPTI_SUCCESS;
}

FAKE_CUPTI_EXPORT CUptiResult cuptiActivityFlushAll(uint32_t flag) {
  State& s = S();
  if ((flag & CUPTI_ACTIVITY_FLAG_FLUSH_FORCED) != 0 && ReadMode() == Mode::kSlowFlush) {
    const char* delay = getenv("VRAMSCOPE_FAKE_CUPTI_FLUSH_DELAY_MS");
    const unsigned long ms = delay != nullptr ? strtoul(delay, nullptr, 10) : 600000;
    usleep(static_cast<useconds_t>(ms * 1000));
  }
  std::vector<State::Record> records;
  CUpti_BuffersCallbackRequestFunc request = nullptr;
  CUpti_BuffersCallbackCompleteFunc complete = nullptr;
  bool any_dropped = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.request == nullptr) return CUPTI_ERROR_INVALID_OPERATION;
    records.swap(s.pending);
    request = s.request;
    complete = s.complete;
    any_dropped = s.dropped > 0;
  }
  // A forced flush with only drops to report still completes one (empty) buffer, so the client
  // asks for the count, as after CUPTI's own completions.
  bool deliver_empty = records.empty() && any_dropped && (flag & CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::size_t next = 0;
  while (next < records.size() || deliver_empty) {
    deliver_empty = false;
    std::uint8_t* buffer = nullptr;
    std::size_t size = 0;
    std::size_t max_records = 0;
    request(&buffer, &size, &max_records);
    if (buffer == nullptr || size < sizeof(State::Record)) {
      std::lock_guard<std::mutex> lock(s.mu);
      s.dropped += records.size() - next;
      break;
    }
    std::size_t used = 0;
    std::size_t count = 0;
    while (next < records.size() && (max_records == 0 || count < max_records)) {
      const State::Record& r = records[next];
      const bool pool = r.memory.kind == CUPTI_ACTIVITY_KIND_MEMORY_POOL;
      const std::size_t bytes = pool ? sizeof(r.pool) : sizeof(r.memory);
      if (used + bytes > size) break;
      memcpy(buffer + used, pool ? static_cast<const void*>(&r.pool) : &r.memory, bytes);
      used += bytes;
      ++count;
      ++next;
    }
    complete(nullptr, 0, buffer, size, used);
  }
  return CUPTI_SUCCESS;
}

FAKE_CUPTI_EXPORT CUptiResult cuptiActivityGetNextRecord(uint8_t* buffer,
                                                         size_t valid_buffer_size_bytes,
                                                         CUpti_Activity** record) {
  if (buffer == nullptr || record == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  std::size_t offset = 0;
  if (*record != nullptr) {
    offset = static_cast<std::size_t>(reinterpret_cast<std::uint8_t*>(*record) - buffer) +
             RecordSize(*record);
  }
  if (offset + sizeof(CUpti_Activity) > valid_buffer_size_bytes) {
    return CUPTI_ERROR_MAX_LIMIT_REACHED;
  }
  *record = reinterpret_cast<CUpti_Activity*>(buffer + offset);
  return CUPTI_SUCCESS;
}

FAKE_CUPTI_EXPORT CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext /*context*/,
                                                                uint32_t /*stream_id*/,
                                                                size_t* dropped) {
  if (dropped == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  *dropped = s.dropped;
  s.dropped = 0;
  return CUPTI_SUCCESS;
}
