// cudaMalloc / cudaFree of a shared CUDA runtime (libcudart.so.N), served by the pool without
// going through the runtime: the runtime's own work on the pair (about 80 ns on the H200, with
// VRAMSCOPE_RUNTIME_HOOKS=0) is more than the driver-level hooks and the pool cost (about 70 ns).
//
// Only calls that reach these exports are seen: a program or library linked against the shared
// runtime (PyTorch's libtorch_cuda.so / libc10_cuda.so, `nvcc -cudart shared`). A static runtime
// (nvcc's default, CuPy, cuBLAS) calls its own copy, which a preloaded cudaMalloc never binds,
// and reaches the shim at the driver level as before. Everything the fast path does not serve
// goes to the real runtime, which then calls cuMemAlloc_v2 / cuMemFree_v2 through the
// driver-level hooks, so the runtime keeps its own state (initialisation, sticky and last errors)
// and its error codes:
//
//   cudaMalloc: served from the pool only when the runtime has answered once in this process
//     (so it is initialised), the mode pools, no stream capture is live (the driver decides what
//     a capturing thread may do), the thread has a current context and the pool holds a block
//     for the request (AllocateCachedPooled: no growth, no inline synchronisation). Anything
//     else (size 0, a null devPtr, no context, growth, out of memory, a driver error) goes to
//     the real cudaMalloc and through cuMemAlloc_v2's hook, so nothing is attempted or recorded
//     twice.
//   cudaFree: a live pooled block is freed in the pool with the mode's fence rule, exactly as
//     cuMemFree_v2 would; null, a capture being live and every other pointer go to the real
//     cudaFree (a bad pointer then gets cudaErrorInvalidValue from the runtime, its last error
//     set, as without the shim).
//
// Which runtime is "real": the exports carry the version libcudart.so.13 (libvramscope.map),
// so only references to CUDA 13's runtime bind to them; a library built against another
// runtime (libcudart.so.12) keeps calling its own. The forward target is therefore always
// libcudart.so.13's definition: dlvsym(RTLD_NEXT) from the shim (the global scope after it),
// else the loaded libcudart.so.13 itself (a runtime opened RTLD_LOCAL, e.g. by a Python
// extension). It is looked up on the first forwarded call (never on the fast path) and kept.
//
// VRAMSCOPE_RUNTIME_HOOKS=0 forwards every call. Thread safety: any thread, any time.
#include <dlfcn.h>

#include <atomic>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "capture.h"
#include "device_pools.h"
#include "driver.h"
#include "hooks.h"
#include "log.h"
#include "shim.h"
#include "state.h"

extern "C" {
VRAMSCOPE_EXPORT cudaError_t cudaMalloc(void** devPtr, size_t size);
VRAMSCOPE_EXPORT cudaError_t cudaFree(void* devPtr);
}

namespace vramscope::interposer {
namespace {

// The real runtime answered a forwarded call with success: it is initialised in this process
// (state.h, where the fork child's handler clears it).
using shim_internal::g_runtime_seen;

constexpr const char* kRuntime = "libcudart.so.13";

enum Which { kMalloc = 0, kFree = 1 };
constexpr const char* kNames[2] = {"cudaMalloc", "cudaFree"};
std::atomic<void*> g_targets[2] = {nullptr, nullptr};

// libcudart.so.13's own definition of `which`, or null when no such runtime is loaded.
void* ForwardTarget(Which which) {
  if (void* known = g_targets[which].load(std::memory_order_acquire); known != nullptr) {
    return known;
  }
  void* found = dlvsym(RTLD_NEXT, kNames[which], kRuntime);
  if (found == nullptr) {
    if (void* handle = dlopen(kRuntime, RTLD_LAZY | RTLD_NOLOAD); handle != nullptr) {
      found = dlvsym(handle, kNames[which], kRuntime);
      dlclose(handle);  // NOLOAD took a reference; the runtime stays loaded
    }
  }
  if (found != nullptr) g_targets[which].store(found, std::memory_order_release);
  return found;
}

bool Pooling() {
  return Cfg().mode != Mode::kPassthrough && Cfg().runtime_hooks && !AnyCaptureLive();
}

cudaError_t NoRuntime(Which which) {
  VRAMSCOPE_LOG_ONCE(kWarn,
                     "%s called, but no %s is loaded (the shim's export found through "
                     "dlsym(RTLD_DEFAULT)?): cudaErrorInitializationError",
                     kNames[which], kRuntime);
  return cudaErrorInitializationError;
}

// Calls libcudart.so.13's own `which`; its first success marks the runtime initialised.
template <Which which, typename Fn, typename... Args>
__attribute__((noinline)) cudaError_t Forward(Args... args) {
  void* target = ForwardTarget(which);
  if (target == nullptr) return NoRuntime(which);
  const cudaError_t result = reinterpret_cast<Fn>(target)(args...);
  if (result == cudaSuccess && !g_runtime_seen.load(std::memory_order_relaxed)) {
    g_runtime_seen.store(true, std::memory_order_relaxed);
  }
  return result;
}

}  // namespace

}  // namespace vramscope::interposer

using namespace vramscope::interposer;

VRAMSCOPE_EXPORT cudaError_t cudaMalloc(void** devPtr, size_t size) {
  if (devPtr != nullptr && size != 0 && g_runtime_seen.load(std::memory_order_relaxed) &&
      EnsureDriver() && Active() && Pooling()) {
    CUcontext ctx = nullptr;
    if (Real().cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx != nullptr) {
      std::uintptr_t address = 0;
      if (AllocateCachedPooled(ctx, size, &address) == ShimStatus::kOk) {
        *devPtr = reinterpret_cast<void*>(address);
        return cudaSuccess;
      }
    }
  }
  return Forward<kMalloc, cudaError_t (*)(void**, size_t)>(devPtr, size);
}

VRAMSCOPE_EXPORT cudaError_t cudaFree(void* devPtr) {
  if (devPtr != nullptr && CanRouteFrees() && Pooling()) {
    if (FreePooled(reinterpret_cast<std::uintptr_t>(devPtr), Cfg().mode == Mode::kStrict) ==
        ShimStatus::kOk) {
      return cudaSuccess;
    }
  }
  return Forward<kFree, cudaError_t (*)(void*)>(devPtr);
}
