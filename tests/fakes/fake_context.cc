// Initialisation, devices, contexts and error strings of the fake CUDA driver.
//
// Mimics: cuInit must come first (CUDA_ERROR_NOT_INITIALIZED otherwise); each device has one
// primary context, retained/released with a reference count, whose last release or reset
// destroys all its memory; the current context is per thread (a stack, as cuCtxPushCurrent /
// cuCtxPopCurrent use it); calls that need a context return CUDA_ERROR_INVALID_CONTEXT without
// one. Non-primary contexts (cuCtxCreate_v4 / cuCtxDestroy_v2) hold their own memory too.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>

#include <cuda.h>

#include "fake_cuda_decls.h"
#include "fake_state.h"

namespace vramscope::fake {
namespace {

CUresult CtxCreate(Call& call, CUcontext* pctx, unsigned int flags, CUdevice dev) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  (void)flags;  // scheduling flags change nothing here
  auto* ctx = new CUctx_st;
  ctx->device = dev;
  ctx->primary = false;
  ctx->refcount = 1;
  s.contexts.insert(ctx);
  // A new context is made current: pushed on the calling thread's stack.
  ContextStack().push_back(ctx);
  *pctx = ctx;
  return CUDA_SUCCESS;
}

CUresult PrimaryCtxRelease(Call& call, CUdevice dev) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (!ValidDevice(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  CUctx_st& ctx = s.devices[dev].primary;
  if (ctx.refcount <= 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--ctx.refcount == 0) DestroyContextResourcesLocked(s, &ctx);
  return CUDA_SUCCESS;
}

CUresult PrimaryCtxReset(Call& call, CUdevice dev) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (!ValidDevice(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  // cudaDeviceReset: every allocation of the primary context is gone; the context object (and
  // the handles threads hold to it) stays usable.
  DestroyContextResourcesLocked(s, &s.devices[dev].primary);
  return CUDA_SUCCESS;
}

CUresult DeviceGetUuid(Call& call, CUuuid* uuid, CUdevice dev) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(call.state(), dev)) return CUDA_ERROR_INVALID_DEVICE;
  // "GPU-f4ce0000-0000-4000-8000-00000000000<dev>"-like: stable, distinct per device.
  static constexpr unsigned char kBase[16] = {0xf4, 0xce, 0, 0, 0, 0, 0x40, 0,
                                              0x80, 0,    0, 0, 0, 0, 0,    0};
  memcpy(uuid->bytes, kBase, sizeof(kBase));
  uuid->bytes[15] = static_cast<char>(dev);
  return CUDA_SUCCESS;
}

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};

constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE",
     "the operation is not permitted in the current state"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const ErrorText* FindError(CUresult code) {
  for (const ErrorText& e : kErrors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

}  // namespace
}  // namespace vramscope::fake

using vramscope::fake::Call;
using vramscope::fake::State;

VRAMSCOPE_FAKE_EXPORT CUresult cuInit(unsigned int Flags) {
  {
    Call call("cuInit");
    State& s = call.state();
    if (s.forked_after_init) return CUDA_ERROR_NOT_INITIALIZED;
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    s.initialized = true;
  }
  // As the driver does at its first cuInit: the tool named by CUDA_INJECTION64_PATH is loaded
  // and its InitializeInjection called (outside the fake's lock: it may call the driver).
  static std::once_flag injected;
  std::call_once(injected, [] {
    const char* path = getenv("CUDA_INJECTION64_PATH");
    if (path == nullptr || path[0] == '\0') return;
    void* tool = dlopen(path, RTLD_NOW);
    auto initialize =
        tool != nullptr ? reinterpret_cast<int (*)()>(dlsym(tool, "InitializeInjection")) : nullptr;
    if (initialize == nullptr) {
      fprintf(stderr, "fake libcuda: cannot load the injection %s\n", path);
      return;
    }
    (void)initialize();
  });
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuDriverGetVersion(int* driverVersion) {
  Call call("cuDriverGetVersion");
  // Works before cuInit, as in the real driver.
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = vramscope::fake::kDriverVersion;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  Call call("cuDeviceGet");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!vramscope::fake::ValidDevice(call.state(), ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuDeviceGetCount(int* count) {
  Call call("cuDeviceGetCount");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = call.state().device_count;
  return CUDA_SUCCESS;
}

// Every pair of distinct devices is peer-capable, as on an NVLink/NVSwitch node.
VRAMSCOPE_FAKE_EXPORT CUresult cuDeviceCanAccessPeer(int* can_access, CUdevice dev, CUdevice peer) {
  Call call("cuDeviceCanAccessPeer");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  if (can_access == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!vramscope::fake::ValidDevice(call.state(), dev) ||
      !vramscope::fake::ValidDevice(call.state(), peer)) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  *can_access = dev != peer ? 1 : 0;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  Call call("cuDeviceGetName");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!vramscope::fake::ValidDevice(call.state(), dev)) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, static_cast<size_t>(len), "vramscope fake GPU %d", dev);
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  Call call("cuDeviceGetUuid_v2");
  return vramscope::fake::DeviceGetUuid(call, uuid, dev);
}

VRAMSCOPE_FAKE_EXPORT CUresult vramscope_fake_cuDeviceGetUuid_v9020(CUuuid* uuid, CUdevice dev) {
  Call call("cuDeviceGetUuid");
  return vramscope::fake::DeviceGetUuid(call, uuid, dev);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  Call call("cuDeviceTotalMem_v2");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!vramscope::fake::ValidDevice(call.state(), dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = call.state().devices[dev].capacity;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib,
                                                    CUdevice dev) {
  Call call("cuDeviceGetAttribute");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  if (pi == nullptr || attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!vramscope::fake::ValidDevice(call.state(), dev)) return CUDA_ERROR_INVALID_DEVICE;
  // An H100-like device; attributes not listed read 0 (unsupported feature).
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *pi = 9;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *pi = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *pi = 132;
      break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
      *pi = 32;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      *pi = 1024;
      break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT:
      *pi = 512;
      break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT:
      *pi = 32;
      break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      *pi = 0x18 + dev;
      break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
      *pi = 1;
      break;
    default:
      *pi = 0;
      break;
  }
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  Call call("cuDevicePrimaryCtxRetain");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = call.state();
  if (!vramscope::fake::ValidDevice(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  ++s.devices[dev].primary.refcount;
  *pctx = &s.devices[dev].primary;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  Call call("cuDevicePrimaryCtxRelease_v2");
  return vramscope::fake::PrimaryCtxRelease(call, dev);
}

VRAMSCOPE_FAKE_EXPORT CUresult vramscope_fake_cuDevicePrimaryCtxRelease_v7000(CUdevice dev) {
  Call call("cuDevicePrimaryCtxRelease");
  return vramscope::fake::PrimaryCtxRelease(call, dev);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  Call call("cuDevicePrimaryCtxReset_v2");
  return vramscope::fake::PrimaryCtxReset(call, dev);
}

VRAMSCOPE_FAKE_EXPORT CUresult vramscope_fake_cuDevicePrimaryCtxReset_v7000(CUdevice dev) {
  Call call("cuDevicePrimaryCtxReset");
  return vramscope::fake::PrimaryCtxReset(call, dev);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags,
                                                          int* active) {
  Call call("cuDevicePrimaryCtxGetState");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = call.state();
  if (!vramscope::fake::ValidDevice(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = s.devices[dev].primary.refcount > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

// Non-primary contexts: created current, destroyed with all their memory. The stream-ordered
// pool and VMM allocations belong to the device, not the context.
VRAMSCOPE_FAKE_EXPORT CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* ctxCreateParams,
                                              unsigned int flags, CUdevice dev) {
  Call call("cuCtxCreate_v4");
  (void)ctxCreateParams;  // execution affinity / CIG parameters are not modelled
  return vramscope::fake::CtxCreate(call, pctx, flags, dev);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  Call call("cuCtxCreate_v2");
  return vramscope::fake::CtxCreate(call, pctx, flags, dev);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* paramsArray,
                                              int numParams, unsigned int flags, CUdevice dev) {
  Call call("cuCtxCreate_v3");
  (void)paramsArray;  // execution affinity is not modelled
  (void)numParams;
  return vramscope::fake::CtxCreate(call, pctx, flags, dev);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  Call call("cuCtxDestroy_v2");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  // Primary contexts are not destroyed this way (cuDevicePrimaryCtxRelease / Reset are).
  if (ctx == nullptr || s.contexts.count(ctx) == 0 || ctx->destroyed) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  vramscope::fake::DestroyContextResourcesLocked(s, ctx);
  ctx->destroyed = true;
  ctx->refcount = 0;
  // Popped from the calling thread's stack if it is current there.
  auto& stack = vramscope::fake::ContextStack();
  if (!stack.empty() && stack.back() == ctx) stack.pop_back();
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
  Call call("cuCtxGetCurrent");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto& stack = vramscope::fake::ContextStack();
  *pctx = stack.empty() ? nullptr : stack.back();
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  Call call("cuCtxSetCurrent");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  if (ctx != nullptr && vramscope::fake::ValidContext(call.state(), ctx) == nullptr) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  // Replaces the top of the thread's stack (pushes onto an empty one); NULL unbinds.
  auto& stack = vramscope::fake::ContextStack();
  if (stack.empty()) {
    if (ctx != nullptr) stack.push_back(ctx);
  } else {
    stack.back() = ctx;
  }
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  Call call("cuCtxGetDevice");
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = ctx->device;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  Call call("cuCtxPushCurrent_v2");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr || vramscope::fake::ValidContext(call.state(), ctx) == nullptr) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  vramscope::fake::ContextStack().push_back(ctx);
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  Call call("cuCtxPopCurrent_v2");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  auto& stack = vramscope::fake::ContextStack();
  if (stack.empty() || stack.back() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx != nullptr) *pctx = stack.back();
  stack.pop_back();
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuCtxSynchronize(void) {
  Call call("cuCtxSynchronize");
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  // Waiting for the whole device is "potentially unsafe" during a capture.
  if (CUresult r = vramscope::fake::CheckCaptureUnsafeLocked(call.state()); r != CUDA_SUCCESS) {
    return r;
  }
  vramscope::fake::WaitContextLocked(call, ctx);
  return CUDA_SUCCESS;
}

// CUDA 13: the context to wait for is named (NULL: the current one). The runtime's
// cudaDeviceSynchronize reaches this variant through cuGetProcAddress at version 13000.
VRAMSCOPE_FAKE_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  Call call("cuCtxSynchronize_v2");
  CUctx_st* target = nullptr;
  if (ctx == nullptr) {
    if (CUresult r = call.RequireContext(&target); r != CUDA_SUCCESS) return r;
  } else {
    if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
    target = vramscope::fake::ValidContext(call.state(), ctx);
    if (target == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (CUresult r = vramscope::fake::CheckCaptureUnsafeLocked(call.state()); r != CUDA_SUCCESS) {
    return r;
  }
  vramscope::fake::WaitContextLocked(call, target);
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuGetErrorString(CUresult error, const char** pStr) {
  Call call("cuGetErrorString");
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const vramscope::fake::ErrorText* e = vramscope::fake::FindError(error);
  *pStr = e == nullptr ? nullptr : e->text;
  return e == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuGetErrorName(CUresult error, const char** pStr) {
  Call call("cuGetErrorName");
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const vramscope::fake::ErrorText* e = vramscope::fake::FindError(error);
  *pStr = e == nullptr ? nullptr : e->name;
  return e == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

// The runtime and NVML fetch private tables through cuGetExportTable. The fake has none; the
// shim must never wrap or depend on it (docs/driver-notes.md).
VRAMSCOPE_FAKE_EXPORT CUresult cuGetExportTable(const void** ppExportTable,
                                                const CUuuid* pExportTableId) {
  Call call("cuGetExportTable");
  (void)pExportTableId;
  if (ppExportTable != nullptr) *ppExportTable = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}
