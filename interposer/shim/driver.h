// The real CUDA driver: libcuda.so.1 opened with dlopen on first need, its entry points looked
// up with the real dlsym by exact name, and the identity table that maps a real entry point to
// the shim's wrapper (cuGetProcAddress and dlsym results are matched by pointer, never by name,
// so every ABI version keeps its own function; docs/driver-notes.md).
//
// Thread safety: LoadDriver may race with itself (serialised inside); after it returned true
// the table is immutable until a fork child re-reads nothing (the mapping is inherited).
// Errors: LoadDriver returns false and may be retried (libcuda may be loaded later).
#pragma once

#include <cstdint>

#include "exports.h"
#include "stream_hooks_gen.h"

namespace vramscope::interposer {

// The watched entry points include the deprecated pre-4.0 launches (cuLaunch, cuLaunchGrid).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
struct RealDriver {
#define VRAMSCOPE_REAL_FIELD(name) decltype(&::name) name = nullptr;
  VRAMSCOPE_HOOKED_ENTRY_POINTS(VRAMSCOPE_REAL_FIELD)
  VRAMSCOPE_WATCHED_ENTRY_POINTS(VRAMSCOPE_REAL_FIELD)
  VRAMSCOPE_USED_ENTRY_POINTS(VRAMSCOPE_REAL_FIELD)
#undef VRAMSCOPE_REAL_FIELD
};
#pragma GCC diagnostic pop

using DlsymFn = void* (*)(void*, const char*);

// glibc's dlsym, found with dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34" / "GLIBC_2.2.5"), so the
// shim never calls its own exported dlsym. nullptr only if glibc has neither version.
DlsymFn RealDlsym();

// Opens libcuda.so.1 (only if already loaded when `may_load` is false) and fills the table.
bool LoadDriver(bool may_load);
bool DriverLoaded();
namespace driver_internal {
extern constinit RealDriver g_real;
}  // namespace driver_internal
// The table; every pointer may be null when the driver lacks that entry point.
inline const RealDriver& Real() { return driver_internal::g_real; }

// The shim's wrapper for a real driver entry point, or nullptr if it is not one we hook.
void* WrapperFor(void* real_function);

// Debug log, once per exact name, of a driver entry point handed out unwrapped. A requested
// name <cuda.h> does not declare (IsKnownDriverEntryPoint) also calls the registered
// UnknownEntryPointHandler.
void NoteUnwrapped(const char* route, const char* requested, void* function);

// What a lookup of an entry point unknown to <cuda.h> sets off, passed down by the lifecycle
// (shim.cc: ordered reuse ends, the event fences synchronise the device), since the driver
// table sits below the modules that react. Registered before ordered reuse and the event fences
// are configured (before then both have nothing to end).
using UnknownEntryPointHandler = void (*)();
void SetUnknownEntryPointHandler(UnknownEntryPointHandler handler);

}  // namespace vramscope::interposer
