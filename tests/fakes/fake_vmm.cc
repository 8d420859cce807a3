// Virtual memory management (cuMemCreate / cuMemAddressReserve / cuMemMap / cuMemSetAccess) of
// the fake CUDA driver, backed for real:
// - a physical allocation is a memfd of its size (charged to prop->location.id),
// - a VA reservation is an mmap(PROT_NONE, MAP_NORESERVE) region,
// - cuMemMap maps the memfd over part of a reservation with MAP_FIXED, still PROT_NONE,
// - cuMemSetAccess mprotects it readable/writable: as on a GPU, touching mapped memory before
//   cuMemSetAccess faults (here: SIGSEGV),
// - cuMemUnmap puts PROT_NONE anonymous memory back, so the reservation stays intact.
// Physical memory is freed when it is both released (cuMemRelease) and unmapped everywhere,
// as the driver documents. Granularity is 2 MiB, as on current NVIDIA GPUs.
// Shareable handles (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR): cuMemExportToShareableHandle
// hands out a dup of the memfd, cuMemImportFromShareableHandle takes one (only a memfd this fake
// made, as the driver takes only its own descriptors), so two processes mapping it share bytes
// for real. Imported memory is not charged to the importer (the exporter's device holds it).
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda.h>

#include "fake_cuda_decls.h"
#include "fake_state.h"

namespace vramscope::fake {
namespace {

bool Aligned(size_t v) { return v % kVmmGranularity == 0; }

CUresult CheckProp(const State& s, const CUmemAllocationProp* prop) {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!ValidDevice(s, prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

void DestroyPhysicalIfDone(State& s,
                           std::map<CUmemGenericAllocationHandle, Physical>::iterator it) {
  Physical& p = it->second;
  if (!p.released || p.mappings > 0) return;
  close(p.fd);
  if (!p.imported) {
    Uncharge(s, p.device, p.size);
    --s.devices[p.device].live_allocations;
    NotifyMemory(VRAMSCOPE_FAKE_MEMORY_RELEASE, p.device, it->first, p.size,
                 VRAMSCOPE_FAKE_MEMORY_VMM, 0);
  }
  s.physical.erase(it);
}

// The mappings that exactly tile [ptr, ptr+size), in address order; empty if they do not.
std::vector<std::map<CUdeviceptr, Mapping>::iterator> Tiling(State& s, CUdeviceptr ptr,
                                                             size_t size) {
  std::vector<std::map<CUdeviceptr, Mapping>::iterator> out;
  CUdeviceptr at = ptr;
  CUdeviceptr end = ptr + size;
  while (at < end) {
    auto it = s.mappings.find(at);
    if (it == s.mappings.end() || it->second.size > end - at) return {};
    out.push_back(it);
    at += it->second.size;
  }
  return out;
}

// Reservation containing [ptr, ptr+size), or end().
std::map<CUdeviceptr, size_t>::iterator ReservationOf(State& s, CUdeviceptr ptr, size_t size) {
  auto it = s.reservations.upper_bound(ptr);
  if (it == s.reservations.begin()) return s.reservations.end();
  --it;
  if (ptr - it->first >= it->second || it->second - (ptr - it->first) < size) {
    return s.reservations.end();
  }
  return it;
}

int Prot(CUmemAccess_flags flags) {
  switch (flags) {
    case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
      return PROT_READ | PROT_WRITE;
    case CU_MEM_ACCESS_FLAGS_PROT_READ:
      return PROT_READ;
    default:
      return PROT_NONE;
  }
}

}  // namespace
}  // namespace vramscope::fake

using vramscope::fake::Call;
using vramscope::fake::State;
namespace fake = vramscope::fake;

VRAMSCOPE_FAKE_EXPORT CUresult cuMemGetAllocationGranularity(
    size_t* granularity, const CUmemAllocationProp* prop, CUmemAllocationGranularity_flags option) {
  Call call("cuMemGetAllocationGranularity");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  if (granularity == nullptr || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                                 option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult r = fake::CheckProp(call.state(), prop); r != CUDA_SUCCESS) return r;
  *granularity = fake::kVmmGranularity;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                           const CUmemAllocationProp* prop,
                                           unsigned long long flags) {
  Call call("cuMemCreate");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (handle == nullptr || flags != 0 || size == 0 || !fake::Aligned(size)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult r = fake::CheckProp(s, prop); r != CUDA_SUCCESS) return r;
  if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE &&
      prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  // VRAMSCOPE_FAKE_SHAREABLE=refuse: the device reports POSIX descriptors but will not create
  // such memory (a driver or container that lacks what they need).
  if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE) {
    const char* shareable = getenv("VRAMSCOPE_FAKE_SHAREABLE");
    if (shareable != nullptr && strcmp(shareable, "refuse") == 0) return CUDA_ERROR_NOT_PERMITTED;
  }
  int device = prop->location.id;
  if (!fake::Charge(s, device, size)) return CUDA_ERROR_OUT_OF_MEMORY;
  // The name carries the device, so an importer knows where the memory lives.
  char name[48];
  snprintf(name, sizeof(name), "vramscope-fake-vmm.%d", device);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (fd >= 0) close(fd);
    fake::Uncharge(s, device, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  fake::Physical p;
  p.fd = fd;
  p.size = size;
  p.device = device;
  p.shareable = prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h = s.next_physical++;
  s.physical.emplace(h, p);
  ++s.devices[device].live_allocations;
  *handle = h;
  fake::NotifyMemory(VRAMSCOPE_FAKE_MEMORY_ALLOCATION, device, h, size, VRAMSCOPE_FAKE_MEMORY_VMM,
                     0);
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  Call call("cuMemRelease");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  auto it = s.physical.find(handle);
  if (it == s.physical.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
  if (--it->second.refs == 0) it->second.released = true;
  fake::DestroyPhysicalIfDone(s, it);
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(
    CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  Call call("cuMemGetAllocationPropertiesFromHandle");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  auto it = s.physical.find(handle);
  if (prop == nullptr || it == s.physical.end() || it->second.released) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *prop = CUmemAllocationProp{};
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = it->second.device;
  if (it->second.shareable) prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle,
                                                           void* addr) {
  Call call("cuMemRetainAllocationHandle");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto ptr = reinterpret_cast<CUdeviceptr>(addr);
  auto m = s.mappings.upper_bound(ptr);
  if (m == s.mappings.begin()) return CUDA_ERROR_INVALID_VALUE;
  --m;
  if (ptr - m->first >= m->second.size) return CUDA_ERROR_INVALID_VALUE;
  auto phys = s.physical.find(m->second.handle);
  if (phys->second.released) {
    phys->second.released = false;
    phys->second.refs = 1;
  } else {
    ++phys->second.refs;
  }
  *handle = m->second.handle;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemExportToShareableHandle(void* shareableHandle,
                                                            CUmemGenericAllocationHandle handle,
                                                            CUmemAllocationHandleType handleType,
                                                            unsigned long long flags) {
  Call call("cuMemExportToShareableHandle");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  auto it = s.physical.find(handle);
  if (shareableHandle == nullptr || flags != 0 || it == s.physical.end() || it->second.released) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !it->second.shareable) {
    return CUDA_ERROR_INVALID_VALUE;  // not requested at cuMemCreate
  }
  const int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareableHandle) = fd;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemImportFromShareableHandle(
    CUmemGenericAllocationHandle* handle, void* osHandle, CUmemAllocationHandleType shHandleType) {
  Call call("cuMemImportFromShareableHandle");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (handle == nullptr || shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int source = static_cast<int>(reinterpret_cast<std::intptr_t>(osHandle));
  // Only a descriptor of this fake's physical memory (the driver takes only its own).
  char link[64];
  char target[128] = {};
  snprintf(link, sizeof(link), "/proc/self/fd/%d", source);
  const ssize_t n = readlink(link, target, sizeof(target) - 1);
  constexpr char kPrefix[] = "/memfd:vramscope-fake-vmm.";
  struct stat st {};
  if (source < 0 || n <= 0 || strncmp(target, kPrefix, sizeof(kPrefix) - 1) != 0 ||
      fstat(source, &st) != 0 || st.st_size <= 0 ||
      !fake::Aligned(static_cast<size_t>(st.st_size))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int device = atoi(target + sizeof(kPrefix) - 1);
  if (!fake::ValidDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
  const int fd = fcntl(source, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  fake::Physical p;
  p.fd = fd;
  p.size = static_cast<size_t>(st.st_size);
  p.device = device;
  p.shareable = true;
  p.imported = true;
  CUmemGenericAllocationHandle h = s.next_physical++;
  s.physical.emplace(h, p);
  *handle = h;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                                   CUdeviceptr addr, unsigned long long flags) {
  Call call("cuMemAddressReserve");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (ptr == nullptr || flags != 0 || size == 0 || !fake::Aligned(size) ||
      (alignment & (alignment - 1)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (alignment < fake::kVmmGranularity) alignment = fake::kVmmGranularity;
  // Over-reserve by the alignment and trim both ends. The address hint is honoured only if it
  // is free and aligned, as the driver treats it as a hint.
  void* base = MAP_FAILED;
  if (addr != 0 && addr % alignment == 0) {
    base = mmap(reinterpret_cast<void*>(addr), size, PROT_NONE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  }
  if (base == MAP_FAILED) {
    void* raw = mmap(nullptr, size + alignment, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    auto start = reinterpret_cast<uintptr_t>(raw);
    uintptr_t aligned = (start + alignment - 1) / alignment * alignment;
    if (aligned > start) munmap(raw, aligned - start);
    uintptr_t tail = aligned + size;
    uintptr_t raw_end = start + size + alignment;
    if (raw_end > tail) munmap(reinterpret_cast<void*>(tail), raw_end - tail);
    base = reinterpret_cast<void*>(aligned);
  }
  *ptr = reinterpret_cast<CUdeviceptr>(base);
  s.reservations.emplace(*ptr, size);
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  Call call("cuMemAddressFree");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  auto it = s.reservations.find(ptr);
  if (it == s.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  // Stricter than documented: a reservation with live mappings is refused, which catches
  // callers (or shims) that leak mappings.
  auto m = s.mappings.lower_bound(ptr);
  if (m != s.mappings.end() && m->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(ptr), size);
  s.reservations.erase(it);
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                        CUmemGenericAllocationHandle handle,
                                        unsigned long long flags) {
  Call call("cuMemMap");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  auto phys = s.physical.find(handle);
  if (flags != 0 || size == 0 || !fake::Aligned(ptr) || !fake::Aligned(size) ||
      !fake::Aligned(offset) || phys == s.physical.end() || phys->second.released ||
      offset > phys->second.size || phys->second.size - offset < size) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (fake::ReservationOf(s, ptr, size) == s.reservations.end()) return CUDA_ERROR_INVALID_VALUE;
  // No overlap with an existing mapping.
  auto next = s.mappings.lower_bound(ptr);
  if (next != s.mappings.end() && next->first < ptr + size) return CUDA_ERROR_ALREADY_MAPPED;
  if (next != s.mappings.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > ptr) return CUDA_ERROR_ALREADY_MAPPED;
  }
  void* p = mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED,
                 phys->second.fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  fake::Mapping m;
  m.size = size;
  m.handle = handle;
  m.offset = offset;
  s.mappings.emplace(ptr, m);
  ++phys->second.mappings;
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  Call call("cuMemUnmap");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (size == 0) return CUDA_ERROR_INVALID_VALUE;
  auto tiles = fake::Tiling(s, ptr, size);
  if (tiles.empty()) return CUDA_ERROR_INVALID_VALUE;
  for (CUevent_st* ev : s.events) {
    if (ev->status == CUevent_st::Status::kPending) {
      ++s.unmaps_under_pending_work;
      break;
    }
  }
  mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE,
       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  for (auto it : tiles) {
    auto phys = s.physical.find(it->second.handle);
    --phys->second.mappings;
    s.mappings.erase(it);
    fake::DestroyPhysicalIfDone(s, phys);
  }
  return CUDA_SUCCESS;
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size,
                                              const CUmemAccessDesc* desc, size_t count) {
  Call call("cuMemSetAccess");
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (desc == nullptr || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  auto tiles = fake::Tiling(s, ptr, size);
  if (tiles.empty()) return CUDA_ERROR_INVALID_VALUE;
  // The host stands in for every device: the widest access granted to any device applies.
  CUmemAccess_flags access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  uint32_t devices = 0;  // recorded for vramscope_fake_access_devices
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !fake::ValidDevice(s, desc[i].location.id)) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    access = static_cast<CUmemAccess_flags>(access | desc[i].flags);
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) devices |= 1u << desc[i].location.id;
  }
  if (mprotect(reinterpret_cast<void*>(ptr), size, fake::Prot(access)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (auto it : tiles) {
    it->second.access = access;
    it->second.access_devices = devices;
  }
  return CUDA_SUCCESS;
}
