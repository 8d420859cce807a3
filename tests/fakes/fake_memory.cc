// Synchronous device, managed and host memory, copies, pointer attributes and IPC of the fake
// CUDA driver.
//
// Mimics: cuMemAlloc_v2 needs a current context, rejects 0 bytes, fails with
// CUDA_ERROR_OUT_OF_MEMORY beyond the device capacity and with
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED when a capture forbids it (docs/driver-notes.md);
// cuMemFree_v2(0) succeeds, a pointer that is not an allocation base fails with
// CUDA_ERROR_INVALID_VALUE; cuMemGetAddressRange_v2 and IPC handles name the whole allocation
// (an importer maps the allocation's base).
//
// Deviations: memory is host memory; cuIpcOpenMemHandle_v2 accepts handles of its own process
// (the real driver refuses them) and refuses other processes' (it cannot share their memory).
#include <string.h>
#include <unistd.h>

#include <cuda.h>

#include "fake_cuda_decls.h"
#include "fake_state.h"

namespace vramscope::fake {
namespace {

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Allocates host storage for a new allocation and records it. Charges `charged` bytes to the
// context's device first. Caller holds the mutex.
CUresult NewAllocation(State& s, CUctx_st* ctx, size_t size, size_t charged, AllocKind kind,
                       CUdeviceptr* out) {
  if (charged > 0 && !Charge(s, ctx->device, charged)) return CUDA_ERROR_OUT_OF_MEMORY;
  void* p = AllocStorage(size);
  if (p == nullptr) {
    if (charged > 0) Uncharge(s, ctx->device, charged);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Allocation a;
  a.size = size;
  a.charged = charged;
  a.device = ctx->device;
  a.ctx = ctx;
  a.kind = kind;
  a.buffer_id = s.next_buffer_id++;
  a.storage = p;
  if (charged > 0) ++s.devices[ctx->device].live_allocations;
  *out = reinterpret_cast<CUdeviceptr>(p);
  if (charged > 0) {
    NotifyMemory(VRAMSCOPE_FAKE_MEMORY_ALLOCATION, ctx->device, *out, charged,
                 VRAMSCOPE_FAKE_MEMORY_DEVICE, 0);
  }
  s.allocations.emplace(*out, a);
  return CUDA_SUCCESS;
}

// Device-side range check for copies and memsets: an allocation (any kind: pinned host memory
// is device-accessible under unified addressing) or a readable/writable VMM mapping.
bool DeviceRangeValid(State& s, CUdeviceptr p, size_t n, bool write) {
  if (FindContaining(s, p, n, nullptr) != nullptr) return true;
  return InMapping(s, p, n,
                   write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ);
}

CUresult MemAllocLocked(Call& call, CUdeviceptr* dptr, size_t bytesize, AllocKind kind,
                        size_t size_charged) {
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckCaptureUnsafeLocked(call.state()); r != CUDA_SUCCESS) return r;
  return NewAllocation(call.state(), ctx, bytesize, size_charged, kind, dptr);
}

CUresult HostAllocLocked(Call& call, void** pp, size_t bytesize) {
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  if (pp == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckCaptureUnsafeLocked(call.state()); r != CUDA_SUCCESS) return r;
  CUdeviceptr p = 0;
  CUresult r = NewAllocation(call.state(), ctx, bytesize, 0, AllocKind::kHost, &p);
  if (r == CUDA_SUCCESS) *pp = reinterpret_cast<void*>(p);
  return r;
}

CUresult MemcpyLocked(Call& call, void* dst, const void* src, size_t n, CUdeviceptr dev_dst,
                      CUdeviceptr dev_src) {
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  if (n == 0) return CUDA_SUCCESS;
  State& s = call.state();
  if (dev_dst != 0 && !DeviceRangeValid(s, dev_dst, n, true)) return CUDA_ERROR_INVALID_VALUE;
  if (dev_src != 0 && !DeviceRangeValid(s, dev_src, n, false)) return CUDA_ERROR_INVALID_VALUE;
  if (dst == nullptr || src == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Synchronous copies go to the legacy stream (the _ptds forms are counted there too).
  NoteWorkLocked(call, reinterpret_cast<uintptr_t>(CU_STREAM_LEGACY));
  memmove(dst, src, n);
  return CUDA_SUCCESS;
}

CUresult MemsetD8Locked(Call& call, CUdeviceptr dst, unsigned char uc, size_t n) {
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  if (n == 0) return CUDA_SUCCESS;
  if (!DeviceRangeValid(call.state(), dst, n, true)) return CUDA_ERROR_INVALID_VALUE;
  NoteWorkLocked(call, reinterpret_cast<uintptr_t>(CU_STREAM_LEGACY));
  memset(reinterpret_cast<void*>(dst), uc, n);
  return CUDA_SUCCESS;
}

// Fake IPC handle layout (64 bytes, opaque to programs).
struct IpcPayload {
  char magic[16];
  uint64_t pid;
  uint64_t base;
  uint64_t size;
  uint64_t buffer_id;
};
static_assert(sizeof(IpcPayload) <= sizeof(CUipcMemHandle));
constexpr char kIpcMagic[16] = "vramscope-ipc";

CUresult IpcOpenLocked(Call& call, CUdeviceptr* pdptr, const CUipcMemHandle& handle,
                       unsigned int flags) {
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  if (pdptr == nullptr || (flags & ~CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  IpcPayload p;
  memcpy(&p, handle.reserved, sizeof(p));
  if (memcmp(p.magic, kIpcMagic, sizeof(kIpcMagic)) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (p.pid != static_cast<uint64_t>(getpid())) return CUDA_ERROR_NOT_SUPPORTED;
  State& s = call.state();
  auto it = s.allocations.find(p.base);
  if (it == s.allocations.end() || it->second.buffer_id != p.buffer_id) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  ++s.ipc_opens[p.base];
  *pdptr = p.base;
  return CUDA_SUCCESS;
}

// What cuPointerGetAttribute knows about a pointer.
struct PointerInfo {
  bool found = false;
  CUctx_st* ctx = nullptr;
  int device = 0;
  CUmemorytype type = CU_MEMORYTYPE_DEVICE;
  bool managed = false;
  bool host_accessible = false;
  CUdeviceptr range_start = 0;
  size_t range_size = 0;
  uint64_t buffer_id = 0;
  bool ipc_capable = false;
  CUmemoryPool pool = nullptr;
};

PointerInfo Describe(State& s, CUdeviceptr ptr) {
  PointerInfo info;
  CUdeviceptr base = 0;
  if (Allocation* a = FindContaining(s, ptr, 1, &base)) {
    info.found = true;
    info.ctx = a->ctx;
    info.device = a->device;
    bool host = a->kind == AllocKind::kHost || a->kind == AllocKind::kHostRegistered;
    info.type = host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
    info.managed = a->kind == AllocKind::kManaged;
    info.host_accessible = host || a->kind == AllocKind::kManaged;
    info.range_start = base;
    info.range_size = a->size;
    info.buffer_id = a->buffer_id;
    info.ipc_capable = a->kind == AllocKind::kDevice || a->kind == AllocKind::kPitch;
    info.pool = a->pool;
    return info;
  }
  // VMM: the range attributes describe the reservation (see the cuPointerGetAttribute docs).
  auto r = s.reservations.upper_bound(ptr);
  if (r != s.reservations.begin()) {
    --r;
    if (ptr - r->first < r->second && InMapping(s, ptr, 1, CU_MEM_ACCESS_FLAGS_PROT_NONE)) {
      auto m = std::prev(s.mappings.upper_bound(ptr));
      info.found = true;
      info.device = s.physical[m->second.handle].device;
      info.ctx = &s.devices[info.device].primary;
      info.range_start = r->first;
      info.range_size = r->second;
      info.buffer_id = m->second.handle;  // stable per physical allocation
    }
  }
  return info;
}

CUresult PointerAttribute(State& s, void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  PointerInfo info = Describe(s, ptr);
  if (attribute == CU_POINTER_ATTRIBUTE_MAPPED) {
    *static_cast<bool*>(data) = info.found;
    return CUDA_SUCCESS;
  }
  if (!info.found) return CUDA_ERROR_INVALID_VALUE;
  // Boolean attributes are written as C++ bool (1 byte), as the docs type them.
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = info.ctx;
      break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned int*>(data) = static_cast<unsigned int>(info.type);
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *static_cast<CUdeviceptr*>(data) = ptr;
      break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (!info.host_accessible) return CUDA_ERROR_INVALID_VALUE;
      *static_cast<void**>(data) = reinterpret_cast<void*>(ptr);
      break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      *static_cast<unsigned long long*>(data) = info.buffer_id;
      break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *static_cast<bool*>(data) = info.managed;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = info.device;
      break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      *static_cast<bool*>(data) = info.ipc_capable;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = info.range_start;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = info.range_size;
      break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      *static_cast<CUmemoryPool*>(data) = info.pool;
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace vramscope::fake

using vramscope::fake::AllocKind;
using vramscope::fake::Call;
using vramscope::fake::State;

VRAMSCOPE_FAKE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  Call call("cuMemAlloc_v2");
  return vramscope::fake::MemAllocLocked(call, dptr, bytesize, AllocKind::kDevice, bytesize);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch,
                                                  size_t WidthInBytes, size_t Height,
                                                  unsigned int ElementSizeBytes) {
  Call call("cuMemAllocPitch_v2");
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  if (pPitch == nullptr || WidthInBytes == 0 || Height == 0 ||
      (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Rows are padded to the pitch alignment; the allocation is pitch * height bytes.
  size_t pitch = vramscope::fake::RoundUp(WidthInBytes, vramscope::fake::kPitchAlignment);
  size_t bytes = pitch * Height;
  CUresult r = vramscope::fake::MemAllocLocked(call, dptr, bytes, AllocKind::kPitch, bytes);
  if (r == CUDA_SUCCESS) *pPitch = pitch;
  return r;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  Call call("cuMemFree_v2");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  // cudaFree(0), the runtime's context-initialisation idiom, reaches here as cuMemFree_v2(0).
  if (dptr == 0) return CUDA_SUCCESS;
  State& s = call.state();
  if (CUresult r = vramscope::fake::CheckCaptureUnsafeLocked(s); r != CUDA_SUCCESS) return r;
  // Frees by address, whatever the current context (unified addressing), like the driver.
  auto it = s.allocations.find(dptr);
  if (it == s.allocations.end() || it->second.kind == AllocKind::kHost ||
      it->second.kind == AllocKind::kHostRegistered) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  vramscope::fake::FreeAllocationLocked(s, it);
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  Call call("cuMemGetInfo_v2");
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const vramscope::fake::Device& d = call.state().devices[ctx->device];
  *total = d.capacity;
  *free = d.used >= d.capacity ? 0 : d.capacity - d.used;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize,
                                                       CUdeviceptr dptr) {
  Call call("cuMemGetAddressRange_v2");
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  CUdeviceptr base = 0;
  size_t size = 0;
  if (vramscope::fake::Allocation* a = vramscope::fake::FindContaining(s, dptr, 1, &base)) {
    size = a->size;
  } else if (vramscope::fake::InMapping(s, dptr, 1, CU_MEM_ACCESS_FLAGS_PROT_NONE)) {
    // For VMM memory the range is the mapping that contains the pointer.
    auto m = std::prev(s.mappings.upper_bound(dptr));
    base = m->first;
    size = m->second.size;
  } else {
    return CUDA_ERROR_NOT_FOUND;
  }
  if (pbase != nullptr) *pbase = base;
  if (psize != nullptr) *psize = size;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize,
                                                 unsigned int flags) {
  Call call("cuMemAllocManaged");
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) {
    if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Managed memory is not charged to the device: pages migrate on demand.
  return vramscope::fake::MemAllocLocked(call, dptr, bytesize, AllocKind::kManaged, 0);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  Call call("cuMemHostAlloc");
  if ((Flags & ~(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                 CU_MEMHOSTALLOC_WRITECOMBINED)) != 0) {
    if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
    return CUDA_ERROR_INVALID_VALUE;
  }
  return vramscope::fake::HostAllocLocked(call, pp, bytesize);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) {
  Call call("cuMemAllocHost_v2");
  return vramscope::fake::HostAllocLocked(call, pp, bytesize);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemFreeHost(void* p) {
  Call call("cuMemFreeHost");
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (CUresult r = vramscope::fake::CheckCaptureUnsafeLocked(s); r != CUDA_SUCCESS) return r;
  auto it = s.allocations.find(reinterpret_cast<CUdeviceptr>(p));
  if (it == s.allocations.end() || it->second.kind != AllocKind::kHost) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  vramscope::fake::FreeAllocationLocked(s, it);
  return CUDA_SUCCESS;
}

// cudaHostRegister: the caller's memory becomes pinned (here: known to the driver) until
// cuMemHostUnregister. Overlapping registrations fail as in the driver.
VRAMSCOPE_FAKE_EXPORT CUresult cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  Call call("cuMemHostRegister_v2");
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  constexpr unsigned int kKnown = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                  CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
  if (p == nullptr || bytesize == 0 || (Flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = call.state();
  auto base = reinterpret_cast<CUdeviceptr>(p);
  auto next = s.allocations.lower_bound(base);
  bool overlaps = (next != s.allocations.end() && next->first < base + bytesize) ||
                  vramscope::fake::FindContaining(s, base, 1, nullptr) != nullptr;
  if (overlaps) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  vramscope::fake::Allocation a;
  a.size = bytesize;
  a.device = ctx->device;
  a.ctx = ctx;
  a.kind = AllocKind::kHostRegistered;
  a.buffer_id = s.next_buffer_id++;
  s.allocations.emplace(base, a);
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemHostUnregister(void* p) {
  Call call("cuMemHostUnregister");
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  auto it = s.allocations.find(reinterpret_cast<CUdeviceptr>(p));
  if (it == s.allocations.end() || it->second.kind != AllocKind::kHostRegistered) {
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  }
  vramscope::fake::FreeAllocationLocked(s, it);
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p,
                                                            unsigned int Flags) {
  Call call("cuMemHostGetDevicePointer_v2");
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  if (pdptr == nullptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  vramscope::fake::Allocation* a =
      vramscope::fake::FindContaining(call.state(), reinterpret_cast<CUdeviceptr>(p), 1, nullptr);
  if (a == nullptr || (a->kind != AllocKind::kHost && a->kind != AllocKind::kHostRegistered)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Unified addressing: the device pointer is the host pointer.
  *pdptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost,
                                               size_t ByteCount) {
  Call call("cuMemcpyHtoD_v2");
  return vramscope::fake::MemcpyLocked(call, reinterpret_cast<void*>(dstDevice), srcHost, ByteCount,
                                       dstDevice, 0);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void* srcHost,
                                                    size_t ByteCount) {
  Call call("cuMemcpyHtoD_v2_ptds");
  return vramscope::fake::MemcpyLocked(call, reinterpret_cast<void*>(dstDevice), srcHost, ByteCount,
                                       dstDevice, 0);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice,
                                               size_t ByteCount) {
  Call call("cuMemcpyDtoH_v2");
  return vramscope::fake::MemcpyLocked(call, dstHost, reinterpret_cast<const void*>(srcDevice),
                                       ByteCount, 0, srcDevice);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void* dstHost, CUdeviceptr srcDevice,
                                                    size_t ByteCount) {
  Call call("cuMemcpyDtoH_v2_ptds");
  return vramscope::fake::MemcpyLocked(call, dstHost, reinterpret_cast<const void*>(srcDevice),
                                       ByteCount, 0, srcDevice);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                               size_t ByteCount) {
  Call call("cuMemcpyDtoD_v2");
  return vramscope::fake::MemcpyLocked(call, reinterpret_cast<void*>(dstDevice),
                                       reinterpret_cast<const void*>(srcDevice), ByteCount,
                                       dstDevice, srcDevice);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                                    size_t ByteCount) {
  Call call("cuMemcpyDtoD_v2_ptds");
  return vramscope::fake::MemcpyLocked(call, reinterpret_cast<void*>(dstDevice),
                                       reinterpret_cast<const void*>(srcDevice), ByteCount,
                                       dstDevice, srcDevice);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  Call call("cuMemsetD8_v2");
  return vramscope::fake::MemsetD8Locked(call, dstDevice, uc, N);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc,
                                                  size_t N) {
  Call call("cuMemsetD8_v2_ptds");
  return vramscope::fake::MemsetD8Locked(call, dstDevice, uc, N);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute,
                                                     CUdeviceptr ptr) {
  Call call("cuPointerGetAttribute");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return vramscope::fake::PointerAttribute(call.state(), data, attribute, ptr);
}

// cudaPointerGetAttributes reaches this with 6 attributes. Unlike the singular call, an unknown
// pointer is not an error: each attribute reads as "not a CUDA pointer" (zero/NULL), as the
// driver documents.
VRAMSCOPE_FAKE_EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes,
                                                      CUpointer_attribute* attributes, void** data,
                                                      CUdeviceptr ptr) {
  Call call("cuPointerGetAttributes");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  if (attributes == nullptr || data == nullptr || numAttributes == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  State& s = call.state();
  bool known = vramscope::fake::Describe(s, ptr).found;
  for (unsigned int i = 0; i < numAttributes; ++i) {
    if (data[i] == nullptr) continue;
    if (!known) {
      switch (attributes[i]) {
        case CU_POINTER_ATTRIBUTE_CONTEXT:
          *static_cast<CUcontext*>(data[i]) = nullptr;
          break;
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
          *static_cast<unsigned int*>(data[i]) = 0;
          break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
          *static_cast<int*>(data[i]) = -2;
          break;
        case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        case CU_POINTER_ATTRIBUTE_MAPPED:
          *static_cast<bool*>(data[i]) = false;
          break;
        case CU_POINTER_ATTRIBUTE_BUFFER_ID:
          *static_cast<unsigned long long*>(data[i]) = 0;
          break;
        default:
          *static_cast<void**>(data[i]) = nullptr;
          break;
      }
      continue;
    }
    if (CUresult r = vramscope::fake::PointerAttribute(s, data[i], attributes[i], ptr);
        r != CUDA_SUCCESS) {
      return r;
    }
  }
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  Call call("cuIpcGetMemHandle");
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  if (pHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr base = 0;
  vramscope::fake::Allocation* a = vramscope::fake::FindContaining(call.state(), dptr, 1, &base);
  // Only cuMemAlloc-family memory is legacy-IPC capable; an interior pointer yields the handle
  // of the whole allocation.
  if (a == nullptr || (a->kind != AllocKind::kDevice && a->kind != AllocKind::kPitch)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  vramscope::fake::IpcPayload p{};
  memcpy(p.magic, vramscope::fake::kIpcMagic, sizeof(p.magic));
  p.pid = static_cast<uint64_t>(getpid());
  p.base = base;
  p.size = a->size;
  p.buffer_id = a->buffer_id;
  memset(pHandle, 0, sizeof(*pHandle));
  memcpy(pHandle->reserved, &p, sizeof(p));
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                                     unsigned int Flags) {
  Call call("cuIpcOpenMemHandle_v2");
  return vramscope::fake::IpcOpenLocked(call, pdptr, handle, Flags);
}

VRAMSCOPE_FAKE_EXPORT CUresult vramscope_fake_cuIpcOpenMemHandle_v4010(CUdeviceptr* pdptr,
                                                                       CUipcMemHandle handle,
                                                                       unsigned int Flags) {
  Call call("cuIpcOpenMemHandle");
  return vramscope::fake::IpcOpenLocked(call, pdptr, handle, Flags);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  Call call("cuIpcCloseMemHandle");
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  auto it = s.ipc_opens.find(dptr);
  if (it == s.ipc_opens.end()) return CUDA_ERROR_INVALID_VALUE;
  if (--it->second == 0) s.ipc_opens.erase(it);
  return CUDA_SUCCESS;
}
