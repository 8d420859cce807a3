// A fake shared CUDA runtime (libcudart.so.N, N = FAKE_CUDART_MAJOR) for the runtime-level hooks
// (interposer/shim/hooks_runtime.cc): cudaMalloc, cudaFree and cudaGetLastError, exported with
// the real runtime's symbol version ("libcudart.so.N"), reaching the driver the way the real
// one does (docs/driver-notes.md): dlopen("libcuda.so.1"), dlsym of cuGetProcAddress_v2,
// then every entry point through it. It initialises lazily, makes device 0's primary context
// current for a thread that has none, maps driver errors to runtime errors and keeps a sticky
// per-thread last error, like the real runtime.
//
// vramscope_fake_cudartN_calls(name) counts the calls that reached this runtime ("cudaMalloc",
// "cudaFree"), so a test sees which calls the shim served itself and which runtime it forwarded
// the others to.
#include <dlfcn.h>
#include <string.h>

#include <atomic>
#include <mutex>

#include <cuda.h>
#include <cuda_runtime_api.h>

#ifndef FAKE_CUDART_MAJOR
#error "FAKE_CUDART_MAJOR must be defined"
#endif
#define FAKE_CAT2(a, b, c) a##b##c
#define FAKE_CAT(a, b, c) FAKE_CAT2(a, b, c)
#define FAKE_CALLS FAKE_CAT(vramscope_fake_cudart, FAKE_CUDART_MAJOR, _calls)
#define FAKE_RESET FAKE_CAT(vramscope_fake_cudart, FAKE_CUDART_MAJOR, _reset)

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);

struct Driver {
  CUresult (*cuInit)(unsigned int) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
};

Driver g_driver;
std::once_flag g_once;
bool g_ready = false;
std::atomic<unsigned long long> g_malloc_calls{0};
std::atomic<unsigned long long> g_free_calls{0};
thread_local cudaError_t t_last_error = cudaSuccess;

template <typename F>
bool Get(GetProcAddress gpa, const char* name, F* out) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  if (gpa(name, &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS || !fn) {
    return false;
  }
  static_assert(sizeof(F) == sizeof(fn));
  memcpy(out, &fn, sizeof(fn));
  return true;
}

void Load() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return;
  void* sym = dlsym(h, "cuGetProcAddress_v2");
  if (sym == nullptr) return;
  GetProcAddress gpa = nullptr;
  memcpy(&gpa, &sym, sizeof(sym));
  Driver d;
  if (!Get(gpa, "cuInit", &d.cuInit) || !Get(gpa, "cuCtxGetCurrent", &d.cuCtxGetCurrent) ||
      !Get(gpa, "cuCtxSetCurrent", &d.cuCtxSetCurrent) ||
      !Get(gpa, "cuDevicePrimaryCtxRetain", &d.cuDevicePrimaryCtxRetain) ||
      !Get(gpa, "cuMemAlloc", &d.cuMemAlloc) || !Get(gpa, "cuMemFree", &d.cuMemFree)) {
    return;
  }
  if (d.cuInit(0) != CUDA_SUCCESS) return;
  g_driver = d;
  g_ready = true;
}

cudaError_t Fail(cudaError_t error) {
  t_last_error = error;
  return error;
}

cudaError_t FromDriver(CUresult result) {
  switch (result) {
    case CUDA_SUCCESS:
      return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE:
      return Fail(cudaErrorInvalidValue);
    case CUDA_ERROR_OUT_OF_MEMORY:
      return Fail(cudaErrorMemoryAllocation);
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
      return Fail(cudaErrorStreamCaptureUnsupported);
    case CUDA_ERROR_INVALID_CONTEXT:
      return Fail(cudaErrorDeviceUninitialized);
    default:
      return Fail(cudaErrorUnknown);
  }
}

// The runtime's lazy initialisation: the driver, then device 0's primary context for a thread
// with no current context.
cudaError_t Ready() {
  std::call_once(g_once, Load);
  if (!g_ready) return Fail(cudaErrorInitializationError);
  CUcontext ctx = nullptr;
  if (g_driver.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) return Fail(cudaErrorUnknown);
  if (ctx == nullptr) {
    if (g_driver.cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
        g_driver.cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
      return Fail(cudaErrorInitializationError);
    }
  }
  return cudaSuccess;
}

}  // namespace

FAKE_EXPORT cudaError_t cudaMalloc(void** devPtr, size_t size) {
  g_malloc_calls.fetch_add(1, std::memory_order_relaxed);
  if (devPtr == nullptr) return Fail(cudaErrorInvalidValue);
  if (const cudaError_t e = Ready(); e != cudaSuccess) return e;
  if (size == 0) {
    *devPtr = nullptr;
    return cudaSuccess;
  }
  CUdeviceptr p = 0;
  const cudaError_t e = FromDriver(g_driver.cuMemAlloc(&p, size));
  if (e == cudaSuccess) *devPtr = reinterpret_cast<void*>(p);
  return e;
}

FAKE_EXPORT cudaError_t cudaFree(void* devPtr) {
  g_free_calls.fetch_add(1, std::memory_order_relaxed);
  if (const cudaError_t e = Ready(); e != cudaSuccess) return e;
  if (devPtr == nullptr) return cudaSuccess;
  return FromDriver(g_driver.cuMemFree(reinterpret_cast<CUdeviceptr>(devPtr)));
}

FAKE_EXPORT cudaError_t cudaGetLastError() {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

FAKE_EXPORT unsigned long long FAKE_CALLS(const char* name) {
  if (strcmp(name, "cudaMalloc") == 0) return g_malloc_calls.load();
  if (strcmp(name, "cudaFree") == 0) return g_free_calls.load();
  return 0;
}

FAKE_EXPORT void FAKE_RESET() {
  g_malloc_calls.store(0);
  g_free_calls.store(0);
}
