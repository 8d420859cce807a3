// NVTX ranges without linking the application to anything: libvramscope.so is an NVTX v3
// injection library. It exports InitializeInjectionNvtx2, which every header-only NVTX copy in
// the process (the application's, PyTorch's, each library's own) looks up in the library named
// by NVTX_INJECTION64_PATH (`vramscope run` points it at the shim itself; dlopen of the already
// preloaded path returns the same instance). Each copy hands over its export table; we fill in
// its CORE and CORE2 callback slots (push/pop, start/end, domains, registered strings). Calling
// it again, or from several copies, only assigns the same pointers again: idempotent.
//
// What is recorded (into the event ring, when one is open): NVTX_PUSH with a process-unique
// range id, the parent (the thread's innermost open range), the category, the message
// (ASCII, wide converted to UTF-8, or a registered string) and the domain name; NVTX_POP with
// the id. Start/end ranges are recorded the same way, outside the thread's stack (parent 0).
// Marks, category and thread names are not recorded.
//
// Per-thread range stacks (nvtx_ranges.h): a pop of domain D removes the innermost entry of D.
// Deeper pushes are counted and popped without records. InnermostRange() is what the ALLOC
// records carry in `aux`.
//
// Thread safety: every callback may run on any thread at any time. Domains and registered
// strings live in fixed-size static tables claimed with an atomic counter, never freed (handles
// stay valid for the life of the process); a full table yields the default domain / a null
// string handle. Costs: a push is a thread_local access, an atomic increment and the ring's
// record (~100 ns with the ring's clock); no lock, no allocation (except glibc's first-use TLS
// block for this library in a thread when the shim was dlopen'ed rather than preloaded).
#pragma once

#include <cstdint>

extern "C" {
// NVTX v3's injection entry point (nvtxDetail/nvtxInit.h). Returns 1 (success).
__attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    const void* (*get_export_table)(std::uint32_t export_table_id));
}
