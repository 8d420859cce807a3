#include "driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include <algorithm>
#include <atomic>

#include "log.h"

// Read by the dlsym entry stub (dlsym_hook.cc); written once, before any use, with a release
// store. Plain pointer because the assembly loads it directly.
extern "C" {
__attribute__((visibility("hidden"))) void* vramscope_real_dlsym = nullptr;
}

extern "C" __attribute__((visibility("hidden"))) void* vramscope_resolve_real_dlsym() {
  void* found = __atomic_load_n(&vramscope_real_dlsym, __ATOMIC_ACQUIRE);
  if (found != nullptr) return found;
  // RTLD_NEXT here means "after libvramscope.so": glibc's dlsym (or the next interposer's).
  found = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (found == nullptr) found = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  if (found == nullptr) found = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");  // aarch64
  if (found != nullptr) __atomic_store_n(&vramscope_real_dlsym, found, __ATOMIC_RELEASE);
  return found;
}

namespace vramscope::interposer {

constinit RealDriver driver_internal::g_real{};

namespace {

using driver_internal::g_real;

struct IdentityEntry {
  void* real;
  void* wrapper;
};

constexpr int kMaxIdentity = 320;
#define VRAMSCOPE_COUNT_ONE(name) +1
static_assert(0 VRAMSCOPE_HOOKED_ENTRY_POINTS(VRAMSCOPE_COUNT_ONE)
                      VRAMSCOPE_WATCHED_ENTRY_POINTS(VRAMSCOPE_COUNT_ONE) <= kMaxIdentity,
              "every hooked entry point needs a slot in the identity table");
#undef VRAMSCOPE_COUNT_ONE

constinit IdentityEntry g_identity[kMaxIdentity] = {};
constinit int g_identity_count = 0;
constinit std::atomic<bool> g_loaded{false};
constinit pthread_mutex_t g_load_mu = PTHREAD_MUTEX_INITIALIZER;

// Names already reported by NoteUnwrapped: FNV-1a hashes in an open-addressing set.
constexpr int kNotedSlots = 1024;
constinit std::atomic<std::uint64_t> g_noted[kNotedSlots] = {};
// What a lookup of an unknown entry point sets off (SetUnknownEntryPointHandler).
constinit std::atomic<UnknownEntryPointHandler> g_unknown_handler{nullptr};

std::uint64_t HashName(const char* name) {
  std::uint64_t hash = 1469598103934665603ull;
  for (; *name != '\0'; ++name) {
    hash ^= static_cast<unsigned char>(*name);
    hash *= 1099511628211ull;
  }
  return hash == 0 ? 1 : hash;
}

// True the first time `name` is seen.
bool FirstSighting(const char* name) {
  const std::uint64_t hash = HashName(name);
  for (int probe = 0; probe < kNotedSlots; ++probe) {
    std::atomic<std::uint64_t>& slot = g_noted[(hash + probe) % kNotedSlots];
    std::uint64_t seen = slot.load(std::memory_order_relaxed);
    if (seen == hash) return false;
    if (seen == 0) {
      if (slot.compare_exchange_strong(seen, hash, std::memory_order_relaxed)) return true;
      if (seen == hash) return false;
    }
  }
  return false;  // full: stay quiet
}

}  // namespace

DlsymFn RealDlsym() { return reinterpret_cast<DlsymFn>(vramscope_resolve_real_dlsym()); }

bool DriverLoaded() { return g_loaded.load(std::memory_order_acquire); }

bool LoadDriver(bool may_load) {
  if (DriverLoaded()) return true;
  DlsymFn real_dlsym = RealDlsym();
  if (real_dlsym == nullptr) return false;
  pthread_mutex_lock(&g_load_mu);
  if (DriverLoaded()) {
    pthread_mutex_unlock(&g_load_mu);
    return true;
  }
  // RTLD_LOCAL: the shim's reference must not change how the application's own lookups bind.
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | (may_load ? 0 : RTLD_NOLOAD));
  if (handle == nullptr) {
    pthread_mutex_unlock(&g_load_mu);
    return false;
  }
  RealDriver table{};
  int count = 0;
  IdentityEntry identity[kMaxIdentity] = {};
  // A handle-scoped lookup never sees a preloaded library, so these are the driver's own
  // functions, unless libcuda.so.1 *is* this library (SONAME variant): refuse those.
#define VRAMSCOPE_LOAD_HOOKED(name)                                                \
  {                                                                                \
    void* real = real_dlsym(handle, #name);                                        \
    void* self = reinterpret_cast<void*>(&::name);                                 \
    if (real == self) real = nullptr;                                              \
    table.name = reinterpret_cast<decltype(&::name)>(real);                        \
    if (real != nullptr && count < kMaxIdentity) identity[count++] = {real, self}; \
  }
  VRAMSCOPE_HOOKED_ENTRY_POINTS(VRAMSCOPE_LOAD_HOOKED)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  VRAMSCOPE_WATCHED_ENTRY_POINTS(VRAMSCOPE_LOAD_HOOKED)
#pragma GCC diagnostic pop
#undef VRAMSCOPE_LOAD_HOOKED
#define VRAMSCOPE_LOAD_USED(name) \
  table.name = reinterpret_cast<decltype(&::name)>(real_dlsym(handle, #name));
  VRAMSCOPE_USED_ENTRY_POINTS(VRAMSCOPE_LOAD_USED)
#undef VRAMSCOPE_LOAD_USED
  std::sort(identity, identity + count, [](const IdentityEntry& a, const IdentityEntry& b) {
    return reinterpret_cast<std::uintptr_t>(a.real) < reinterpret_cast<std::uintptr_t>(b.real);
  });
  memcpy(static_cast<void*>(&g_real), &table, sizeof(table));
  memcpy(g_identity, identity, sizeof(identity));
  g_identity_count = count;
  g_loaded.store(true, std::memory_order_release);
  pthread_mutex_unlock(&g_load_mu);
  return true;
}

void* WrapperFor(void* real_function) {
  if (real_function == nullptr || !DriverLoaded()) return nullptr;
  const auto key = reinterpret_cast<std::uintptr_t>(real_function);
  int lo = 0;
  int hi = g_identity_count;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    const auto at = reinterpret_cast<std::uintptr_t>(g_identity[mid].real);
    if (at == key) return g_identity[mid].wrapper;
    if (at < key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return nullptr;
}

void SetUnknownEntryPointHandler(UnknownEntryPointHandler handler) {
  g_unknown_handler.store(handler, std::memory_order_release);
}

void NoteUnwrapped(const char* route, const char* requested, void* function) {
  if (function == nullptr) return;
  if (requested != nullptr && requested[0] != '\0' && !IsKnownDriverEntryPoint(requested)) {
    // A newer driver's entry point: it may queue work the shim does not watch.
    VRAMSCOPE_LOG_ONCE(kInfo, "%s(\"%s\"): an entry point <cuda.h> %d does not declare", route,
                       requested, CUDA_VERSION);
    if (const UnknownEntryPointHandler handler = g_unknown_handler.load(std::memory_order_acquire);
        handler != nullptr) {
      handler();
    }
  }
  if (!LogEnabled(LogLevel::kDebug)) return;
  Dl_info info{};
  const char* exact = nullptr;
  if (dladdr(function, &info) != 0 && info.dli_sname != nullptr && info.dli_saddr == function) {
    exact = info.dli_sname;
  }
  const char* key = exact != nullptr ? exact : requested;
  if (key == nullptr || !FirstSighting(key)) return;
  Log(LogLevel::kDebug, "%s(\"%s\") -> %s: driver entry point not wrapped", route,
      requested != nullptr ? requested : "", exact != nullptr ? exact : "(unidentified)");
}

}  // namespace vramscope::interposer
