#include "shim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <iterator>

#include "capture.h"
#include "counters.h"
#include "cupti.h"
#include "device_pools.h"
#include "driver.h"
#include "fence_worker.h"
#include "graph_memory.h"
#include "ipc.h"
#include "log.h"
#include "ordered.h"
#include "registry.h"
#include "ring_events.h"
#include "slots.h"
#include "stacks.h"
#include "state.h"
#include "stream_fence.h"

namespace vramscope::interposer {
namespace {

using shim_internal::g_config;
using shim_internal::g_disabled;
using shim_internal::g_exiting;
using shim_internal::g_state;
using shim_internal::State;
using shim_internal::t_in_init;

constinit pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;
constinit bool g_handlers_registered = false;

void OnExit() {
  // Stop first: from here on the shim makes no driver call of its own (the runtime and the
  // driver tear down around this point; atexit order against them is not ours to choose).
  g_exiting.store(true, std::memory_order_release);
  QuiesceFenceWorker(/*timeout_ms=*/2000);
  // CUPTI's last records, before the exit record (on_exit runs after this); bounded wait.
  FlushCuptiAtExit();
  if (g_config.summary) PrintSummary();
}

// on_exit (glibc) rather than atexit: it receives the status given to exit(), which the ring's
// header reports. Registered before OnExit, so it runs after it (the fence helper is quiet).
void OnExitStatus(int status, void* /*arg*/) { MarkRingExited(status); }

// A looked-up entry point <cuda.h> does not declare may queue work the shim does not watch
// (driver.h calls this, registered in Initialise).
void OnUnknownEntryPoint() {
  BreakOrdered("unknown_entry_point");
  NoteUnknownStreamWork();
}

// Ordered reuse serves pool mode only, and needs the context query its watch makes.
bool OrderedAllowed(const Config& config) {
  return config.mode == Mode::kPool && config.ordered && Real().cuCtxGetCurrent != nullptr;
}

// Configures what depends on the settings (at init and in a fork child).
void ApplyConfig() {
  ConfigureOrdered(OrderedAllowed(g_config));
  ConfigureStreamFence(g_config.mode == Mode::kPool && g_config.fence_events);
  DriverUpstream::SetDeferredWaker(g_config.fence_async ? WakeFenceWorker : nullptr);
  Counters().mode = static_cast<std::uint32_t>(g_config.mode);
}

void LockInit() { pthread_mutex_lock(&g_init_mu); }
void UnlockInit() { pthread_mutex_unlock(&g_init_mu); }

// A fork child re-reads the settings (a clean shim: its driver table stays valid, since the
// mapping of libcuda is inherited; the driver itself decides what works in a child).
void ReadConfigInChild() {
  InitLogLevel();
  g_config = ReadConfig();
  ApplyConfig();
}

// The child records into its own ring, opened by its first hook.
void RingInChild() { RingForkChild(ModeName(g_config.mode)); }

// The fork handlers of every module, as one table. Its order IS the shim's lock order: a thread
// that holds the lock of one entry may take the locks of later entries only (the init lock
// around everything; a slot's creation under the table lock; RefreshGraphMemory records into the
// registries under its own lock; the helper thread's lock last). ForkPrepare takes the locks in
// this order, ForkParent releases them in reverse, and ForkChild walks it in order: each module
// releases (or re-creates) its locks and forgets the parent's state (pools, exports, streams,
// entries, threads) without touching it, then the counters are zeroed, the settings re-read,
// and the ring, stacks, runtime and CUPTI start afresh. Entries without a lock have only a
// child handler.
struct ForkHandlers {
  const char* module;
  void (*prepare)();
  void (*parent)();
  void (*child)();
};
constexpr ForkHandlers kForkTable[] = {
    {"init", LockInit, UnlockInit, UnlockInit},
    {"slots", LockSlotsForFork, UnlockSlotsAfterFork, SlotsForkChild},
    {"graph_memory", LockGraphMemoryForFork, UnlockGraphMemoryAfterFork, ResetGraphMemoryInChild},
    {"registry", LockRegistriesForFork, UnlockRegistriesAfterFork, RegistriesForkChild},
    {"fence_worker", LockFenceWorkerForFork, UnlockFenceWorkerAfterFork, ResetFenceWorkerInChild},
    {"ipc", nullptr, nullptr, IpcForgetInChild},
    {"stream_fence", nullptr, nullptr, ResetStreamFenceInChild},
    {"capture", nullptr, nullptr, ResetCapturesAfterFork},
    {"counters", nullptr, nullptr, ResetCountersInChild},
    {"config", nullptr, nullptr, ReadConfigInChild},
    {"ring_events", nullptr, nullptr, RingInChild},
    {"stacks", nullptr, nullptr, StacksForkChild},
    {"runtime", nullptr, nullptr, ForgetRuntimeInChild},
    {"cupti", nullptr, nullptr, CuptiForkChild},
};

void ForkPrepare() {
  for (const ForkHandlers& entry : kForkTable) {
    if (entry.prepare != nullptr) entry.prepare();
  }
}

void ForkParent() {
  for (auto it = std::rbegin(kForkTable); it != std::rend(kForkTable); ++it) {
    if (it->parent != nullptr) it->parent();
  }
}

void ForkChild() {
  for (const ForkHandlers& entry : kForkTable) {
    if (entry.child != nullptr) entry.child();
  }
}

bool RequiredForPooling(const RealDriver& real) {
  return real.cuMemAlloc_v2 != nullptr && real.cuMemFree_v2 != nullptr &&
         real.cuCtxGetCurrent != nullptr && real.cuCtxGetDevice != nullptr &&
         real.cuCtxPushCurrent_v2 != nullptr && real.cuCtxPopCurrent_v2 != nullptr &&
         real.cuCtxSynchronize != nullptr;
}

bool Initialise(bool may_load) {
  if (t_in_init) return DriverLoaded();
  t_in_init = true;
  pthread_mutex_lock(&g_init_mu);
  bool ready = g_state.load(std::memory_order_acquire) == static_cast<int>(State::kReady);
  if (!ready) {
    InitLogLevel();
    g_config = ReadConfig();
    SetUnknownEntryPointHandler(OnUnknownEntryPoint);
    if (!LoadDriver(may_load)) {
      if (may_load) {
        const char* why = dlerror();
        VRAMSCOPE_LOG_ONCE(kWarn,
                           "cannot open libcuda.so.1 (%s); vramscope is inactive until it can",
                           why != nullptr ? why : "not found");
      }
    } else {
      if (!RequiredForPooling(Real())) {
        g_disabled.store(true, std::memory_order_relaxed);
        VRAMSCOPE_LOG(kWarn, "the driver lacks an entry point vramscope needs; running without it");
      }
      if (!g_handlers_registered) {
        g_handlers_registered = true;
        if (pthread_atfork(ForkPrepare, ForkParent, ForkChild) != 0 ||
            on_exit(OnExitStatus, nullptr) != 0 || atexit(OnExit) != 0) {
          g_disabled.store(true, std::memory_order_relaxed);
          VRAMSCOPE_LOG(kWarn, "cannot register fork/exit handlers; running without vramscope");
        }
      }
      ApplyConfig();
      VRAMSCOPE_LOG(kInfo, "active, mode=%s", ModeName(g_config.mode));
      OpenRingAtInit(ModeName(g_config.mode));
      // Started by the next hook entry, outside this lock (CUPTI calls the driver, and dlopen
      // must not run under the init lock). Its records go to the ring: none, no CUPTI.
      ArmCupti(g_config.CuptiWanted(/*as_injection=*/false) && Ring() != nullptr);
      g_state.store(static_cast<int>(State::kReady), std::memory_order_release);
      ready = true;
    }
  }
  pthread_mutex_unlock(&g_init_mu);
  t_in_init = false;
  return ready;
}

int AppendF(char* buffer, int used, int size, const char* format, ...)
    __attribute__((format(printf, 4, 5)));

int AppendF(char* buffer, int used, int size, const char* format, ...) {
  if (used >= size) return used;
  va_list args;
  va_start(args, format);
  const int n = vsnprintf(buffer + used, static_cast<std::size_t>(size - used), format, args);
  va_end(args);
  if (n < 0) return used;
  return used + n >= size ? size - 1 : used + n;
}

}  // namespace

bool shim_internal::EnsureDriverSlow() {
  const bool ready = Initialise(true);
  if (ready && !t_in_init) MaybeStartCupti();
  return ready;
}

bool EnsureDriverFromDlsym() {
  if (g_state.load(std::memory_order_acquire) == static_cast<int>(State::kReady)) return true;
  return Initialise(false);
}

void PrintSummary() {
  const char* policy = RefreshPoolFigures();
  const ShimCounters& counters = Counters();
  char line[2048];
  constexpr int kSize = sizeof(line);
  // ordered=on, off (not allowed), or ended:<the entry point or event that ended it>.
  const char* ordered = OrderedStatus();
  const bool ended = strcmp(ordered, "on") != 0 && strcmp(ordered, "off") != 0;
  int used =
      AppendF(line, 0, kSize, "vramscope: mode=%s policy=%s ordered=%s%s", ModeName(g_config.mode),
              policy != nullptr ? policy : "none", ended ? "ended:" : "", ordered);
  for (int device = 0; device < kMaxDevices; ++device) {
    const DeviceCounters& d = counters.device[device];
    if (d.allocs.Get() == 0 && d.frees.Get() == 0 && d.reserved_bytes.peak.load() == 0 &&
        d.driver_alloc_calls.Get() == 0) {
      continue;
    }
    const std::uint64_t calls = d.allocs.Get() + d.frees.Get();
    const std::uint64_t driver_calls = d.driver_alloc_calls.Get() + d.driver_free_calls.Get();
    used = AppendF(line, used, kSize,
                   " dev%d peak_requested=%llu peak_allocated=%llu peak_reserved=%llu"
                   " current_requested=%llu current_reserved=%llu idle=%llu allocs=%llu"
                   " frees=%llu driver_allocs=%llu driver_frees=%llu driver_calls_avoided=%llu"
                   " fence_syncs=%llu user_syncs=%llu oom=%llu",
                   device, static_cast<unsigned long long>(d.peak_requested_bytes.Get()),
                   static_cast<unsigned long long>(d.peak_allocated_bytes.Get()),
                   static_cast<unsigned long long>(d.reserved_bytes.peak.load()),
                   static_cast<unsigned long long>(d.current_requested_bytes.Get()),
                   static_cast<unsigned long long>(d.reserved_bytes.current.load()),
                   static_cast<unsigned long long>(d.idle_bytes.Get()),
                   static_cast<unsigned long long>(d.allocs.Get()),
                   static_cast<unsigned long long>(d.frees.Get()),
                   static_cast<unsigned long long>(d.driver_alloc_calls.Get()),
                   static_cast<unsigned long long>(d.driver_free_calls.Get()),
                   static_cast<unsigned long long>(calls > driver_calls ? calls - driver_calls : 0),
                   static_cast<unsigned long long>(d.fence_syncs.Get()),
                   static_cast<unsigned long long>(d.user_syncs.Get()),
                   static_cast<unsigned long long>(d.oom.Get()));
  }
  used =
      AppendF(line, used, kSize, " passthrough peak_device_memory=%llu current_device_memory=%llu",
              static_cast<unsigned long long>(counters.passthrough_device_bytes.peak.load()),
              static_cast<unsigned long long>(counters.passthrough_device_bytes.current.load()));
  for (int kind = 0; kind < static_cast<int>(Kind::kCount); ++kind) {
    const KindCounters& k = counters.kind[kind];
    used = AppendF(line, used, kSize, " %s=%llu/%llu/%llu", KindName(static_cast<Kind>(kind)),
                   static_cast<unsigned long long>(k.bytes.current.load()),
                   static_cast<unsigned long long>(k.bytes.peak.load()),
                   static_cast<unsigned long long>(k.allocs.Get()));
  }
  used = AppendF(line, used, kSize,
                 " ipc_refused=%llu ordered_end_waits=%llu event_fences=%llu"
                 " event_fence_syncs=%llu event_fence_waits=%llu gpu_wait_handovers=%llu"
                 " gpu_waits=%llu event_records=%llu event_queries=%llu fence_thread_cpu_us=%llu"
                 " deferred_unmaps=%llu deferred_reused=%llu deferred_flushes=%llu\n",
                 static_cast<unsigned long long>(counters.ipc_refused.Get()),
                 static_cast<unsigned long long>(counters.ordered_end_waits.Get()),
                 static_cast<unsigned long long>(counters.event_fences.Get()),
                 static_cast<unsigned long long>(counters.event_fence_syncs.Get()),
                 static_cast<unsigned long long>(counters.event_fence_waits.Get()),
                 static_cast<unsigned long long>(counters.gpu_wait_handovers.Get()),
                 static_cast<unsigned long long>(counters.gpu_waits.Get()),
                 static_cast<unsigned long long>(counters.event_records.Get()),
                 static_cast<unsigned long long>(counters.event_queries.Get()),
                 static_cast<unsigned long long>(FenceWorkerCpuNs() / 1000),
                 static_cast<unsigned long long>(counters.deferred_unmaps.Get()),
                 static_cast<unsigned long long>(counters.deferred_reused.Get()),
                 static_cast<unsigned long long>(counters.deferred_flushes.Get()));
  if (line[used - 1] != '\n') line[used - 1] = '\n';
  WriteStderr(line, static_cast<std::size_t>(used));
}

}  // namespace vramscope::interposer
