// The importing side of CUDA IPC of pooled memory (ipc.h): a vramscope handle is checked, the
// exporter's descriptors taken (pidfd_getfd, else its service), the chunks imported and mapped
// contiguously as in the exporter, and the block's address in that mapping returned.
//
// Opens are refcounted per handle (the same address for a second open, as the driver does);
// the exporter's slot counts importing processes, not opens. Every check that can fail does so
// before any memory is mapped, and every path out of a failure undoes the importer count.
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <map>
#include <new>

#include "capture.h"
#include "config.h"
#include "counters.h"
#include "driver.h"
#include "ipc.h"
#include "log.h"
#include "registry.h"
#include "ring_events.h"
#include "state.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace vramscope::interposer {
namespace {

struct ExporterKey {
  std::uint32_t pid;
  std::uint64_t start;
  bool operator<(const ExporterKey& o) const {
    return pid != o.pid ? pid < o.pid : start < o.start;
  }
};

struct Import {
  ExporterKey exporter;
  std::uint32_t slot = 0;
  std::uint32_t generation = 0;
  std::uint64_t nonce = 0;
  CUdeviceptr base = 0;  // the reservation
  std::size_t total = 0;
  CUdeviceptr address = 0;  // what the program got
  std::uint64_t size = 0;
  int refs = 0;
  IpcTable* table = nullptr;
  std::uint32_t holder = kIpcHolders;
  std::uint32_t chunks = 0;
  IpcChunk chunk[kIpcMaxChunks];
};

constinit pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
// Exporters' tables stay mapped for the life of the process (one small mapping per exporter),
// with the way their descriptors came: once pidfd_getfd was refused, always the service.
struct Exporter {
  IpcTable* table = nullptr;
  bool via_service = false;
};
constinit std::map<ExporterKey, Exporter>* g_tables = nullptr;
constinit std::map<CUdeviceptr, Import>* g_imports = nullptr;  // by the program's address

class Fds {
 public:
  ~Fds() {
    for (int i = 0; i < count; ++i) {
      if (fd[i] >= 0) close(fd[i]);
    }
  }
  int fd[kIpcMaxChunks + 1];
  int count = 0;
};

class PidFd {
 public:
  explicit PidFd(int pid) : fd_(static_cast<int>(syscall(SYS_pidfd_open, pid, 0))) {}
  ~PidFd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }
  int GetFd(int target) const {
    const int fd = static_cast<int>(syscall(SYS_pidfd_getfd, fd_, target, 0));
    return fd >= 0 ? fd : -errno;
  }

 private:
  int fd_;
};

IpcTable* MapTable(int fd, const IpcWireHandle& h) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size != static_cast<off_t>(sizeof(IpcTable))) return nullptr;
  void* p = mmap(nullptr, sizeof(IpcTable), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return nullptr;
  auto* table = static_cast<IpcTable*>(p);
  if (memcmp(table->header.magic, kIpcTableMagic, sizeof(kIpcTableMagic)) != 0 ||
      table->header.pid != h.pid || table->header.start_time != h.start_time ||
      table->header.slots != kIpcSlots) {
    munmap(p, sizeof(IpcTable));
    return nullptr;
  }
  return table;
}

// This process's identity, for the holder entries.
constinit std::atomic<std::uint64_t> g_own_start{0};  // 0: not read yet (and in a fork child)

std::uint64_t OwnStart() {
  std::uint64_t value = g_own_start.load(std::memory_order_relaxed);
  if (value == 0) {
    value = ProcessStartTime(getpid());
    g_own_start.store(value, std::memory_order_relaxed);
  }
  return value;
}

// Releases what Enter took: a holder entry (index < kIpcHolders) or the overflow count.
void Leave(IpcSlot& slot, std::uint32_t holder) {
  if (holder < kIpcHolders) {
    slot.holders[holder].start.store(0, std::memory_order_seq_cst);
    slot.holders[holder].pid.store(0, std::memory_order_seq_cst);
  } else {
    slot.importers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

// Takes a holder entry on the handle's slot (the overflow count if all are taken) if the export
// is live; false if stale. `*holder` says which, for Leave.
bool Enter(IpcSlot& slot, const IpcWireHandle& h, std::uint32_t* holder) {
  const auto pid = static_cast<std::uint32_t>(getpid());
  *holder = kIpcHolders;
  for (std::uint32_t i = 0; i < kIpcHolders; ++i) {
    std::uint32_t expected = 0;
    if (slot.holders[i].pid.compare_exchange_strong(expected, pid, std::memory_order_seq_cst)) {
      slot.holders[i].start.store(OwnStart(), std::memory_order_seq_cst);
      *holder = i;
      break;
    }
  }
  if (*holder == kIpcHolders) slot.importers.fetch_add(1, std::memory_order_seq_cst);
  if (slot.generation.load(std::memory_order_seq_cst) == h.generation &&
      slot.revoked.load(std::memory_order_seq_cst) == 0 && slot.nonce == h.nonce) {
    return true;
  }
  Leave(slot, *holder);
  return false;
}

// Imports the chunk descriptors and maps them as one range; the block's address on success.
CUresult MapChunks(const IpcChunk* chunks, std::uint32_t count, const int* fds,
                   CUdeviceptr* base_out, std::size_t* total_out) {
  const RealDriver& real = Real();
  if (real.cuMemImportFromShareableHandle == nullptr || real.cuMemAddressReserve == nullptr ||
      real.cuMemMap == nullptr || real.cuMemSetAccess == nullptr ||
      real.cuMemGetAllocationPropertiesFromHandle == nullptr) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  CUmemGenericAllocationHandle handles[kIpcMaxChunks] = {};
  std::uint32_t imported = 0;
  CUresult result = CUDA_SUCCESS;
  for (; imported < count; ++imported) {
    result = real.cuMemImportFromShareableHandle(
        &handles[imported], reinterpret_cast<void*>(static_cast<std::intptr_t>(fds[imported])),
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (result != CUDA_SUCCESS) break;
  }
  CUmemAllocationProp prop{};
  std::size_t granularity = 0;
  std::size_t total = chunks[count - 1].offset + chunks[count - 1].size;
  CUdeviceptr base = 0;
  std::uint32_t mapped = 0;
  if (result == CUDA_SUCCESS)
    result = real.cuMemGetAllocationPropertiesFromHandle(&prop, handles[0]);
  if (result == CUDA_SUCCESS) {
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    result =
        real.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  }
  if (result == CUDA_SUCCESS) result = real.cuMemAddressReserve(&base, total, granularity, 0, 0);
  for (; result == CUDA_SUCCESS && mapped < count; ++mapped) {
    result =
        real.cuMemMap(base + chunks[mapped].offset, chunks[mapped].size, 0, handles[mapped], 0);
    if (result != CUDA_SUCCESS) break;
  }
  if (result == CUDA_SUCCESS) {
    // The memory's device (in this process's numbering), and the current device if another.
    CUmemAccessDesc access[2] = {};
    int n = 0;
    access[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[n].location.id = prop.location.id;
    access[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUdevice current = 0;
    if (real.cuCtxGetDevice(&current) == CUDA_SUCCESS && current != prop.location.id) {
      access[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access[n].location.id = current;
      access[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    for (std::uint32_t i = 0; result == CUDA_SUCCESS && i < count; ++i) {
      const CUdeviceptr at = base + chunks[i].offset;
      result = real.cuMemSetAccess(at, chunks[i].size, access, static_cast<std::size_t>(n));
      if (result != CUDA_SUCCESS && n > 1) {
        result = real.cuMemSetAccess(at, chunks[i].size, access, 1);  // no peer access
      }
    }
  }
  // The mappings keep the memory; the handles go now so cuMemUnmap alone releases it.
  for (std::uint32_t i = 0; i < imported; ++i) (void)real.cuMemRelease(handles[i]);
  if (result != CUDA_SUCCESS) {
    for (std::uint32_t i = 0; i < mapped; ++i) {
      (void)real.cuMemUnmap(base + chunks[i].offset, chunks[i].size);
    }
    if (base != 0) (void)real.cuMemAddressFree(base, total);
    return result;
  }
  *base_out = base;
  *total_out = total;
  return CUDA_SUCCESS;
}

// An open of the same export by this process: counts one more open and sets `*pdptr` to the
// address it got; false if there is none.
bool ReopenLocked(const IpcWireHandle& h, CUdeviceptr* pdptr) {
  for (auto& [address, import] : *g_imports) {
    if (import.exporter.pid == h.pid && import.exporter.start == h.start_time &&
        import.slot == h.slot && import.generation == h.generation && import.nonce == h.nonce) {
      ++import.refs;
      *pdptr = address;
      return true;
    }
  }
  return false;
}

// The exporter's table, mapped once per exporter: through `pidfd`, or from the exporter's
// service (pidfd_getfd refused or off), which answers the handle's descriptors into `fds` too
// (`*from_service`). Null for a handle or exporter that is no good.
IpcTable* ExporterTableLocked(const IpcWireHandle& h, const PidFd& pidfd, Fds* fds,
                              bool* from_service) {
  const ExporterKey key{h.pid, h.start_time};
  Exporter& exporter = (*g_tables)[key];
  bool use_pidfd = Cfg().ipc_pidfd && pidfd.get() >= 0 && !exporter.via_service;
  if (use_pidfd && exporter.table == nullptr) {
    const int fd = pidfd.GetFd(h.table_fd);
    if (fd >= 0) {
      IpcTable* table = MapTable(fd, h);
      close(fd);
      if (table == nullptr) {
        g_tables->erase(key);
        return nullptr;
      }
      exporter.table = table;
    } else {
      use_pidfd = false;  // refused (ptrace rules): the service from now on
    }
  }
  *from_service = !use_pidfd;
  if (!use_pidfd) {
    const IpcRequest request{
        {'V', 'R', 'S', 'C', 'R', 'E', 'Q', '1'}, h.slot, h.generation, h.nonce};
    const int n = IpcRequestFds(static_cast<int>(h.pid), h.start_time, request, fds->fd,
                                static_cast<int>(kIpcMaxChunks + 1));
    if (n > 0) fds->count = n;
    if (n > 0 && exporter.table == nullptr) exporter.table = MapTable(fds->fd[0], h);
    if (exporter.table == nullptr) {
      g_tables->erase(key);
      return nullptr;
    }
    exporter.via_service = true;
    if (n <= 0) return nullptr;  // stale, forged, or no service
  }
  return exporter.table;
}

// Copies the slot's chunk layout into `chunks` (`*count` of them); false unless the chunks are
// contiguous from 0 and hold the handle's range.
bool ReadLayout(const IpcSlot& slot, const IpcWireHandle& h, IpcChunk* chunks,
                std::uint32_t* count) {
  *count = slot.chunk_count;
  bool valid =
      *count >= 1 && *count <= kIpcMaxChunks && slot.offset == h.offset && slot.size == h.size;
  std::uint64_t at = 0;
  for (std::uint32_t i = 0; valid && i < *count; ++i) {
    chunks[i] = slot.chunks[i];
    valid = chunks[i].offset == at && chunks[i].size != 0;
    at += chunks[i].size;
  }
  return valid && h.offset < at && h.size <= at - h.offset;
}

// The chunks' descriptors in `fds`, laid out as the service answers (fd[0] the table, then one
// per chunk): there already when they came from the service, else taken through `pidfd`.
bool ChunkFds(const PidFd& pidfd, bool from_service, const IpcChunk* chunks, std::uint32_t count,
              Fds* fds) {
  if (from_service) return fds->count == static_cast<int>(count) + 1;
  fds->fd[0] = -1;  // the table's place (closed already)
  fds->count = 1;
  for (std::uint32_t i = 0; i < count; ++i) {
    const int fd = pidfd.GetFd(chunks[i].fd);
    if (fd < 0) return false;
    fds->fd[fds->count++] = fd;
  }
  return true;
}

// Records a new open of handle `h` mapped at `base` (`total` bytes); the program's address.
CUdeviceptr AddImportLocked(const IpcWireHandle& h, IpcTable* table, std::uint32_t holder,
                            const IpcChunk* chunks, std::uint32_t count, CUdeviceptr base,
                            std::size_t total) {
  Import import;
  import.exporter = ExporterKey{h.pid, h.start_time};
  import.slot = h.slot;
  import.generation = h.generation;
  import.nonce = h.nonce;
  import.base = base;
  import.total = total;
  import.address = base + h.offset;
  import.size = h.size;
  import.refs = 1;
  import.table = table;
  import.holder = holder;
  import.chunks = count;
  for (std::uint32_t i = 0; i < count; ++i) import.chunk[i] = chunks[i];
  (*g_imports)[import.address] = import;
  return import.address;
}

CUresult OpenLocked(CUdeviceptr* pdptr, const IpcWireHandle& h) {
  // Opened already by this process: the same address.
  if (ReopenLocked(h, pdptr)) return CUDA_SUCCESS;
  // The exporter's identity: a pidfd, then its start time (a recycled pid has another one).
  // Without pidfds (a kernel before 5.3, a seccomp profile) the start time alone, and the
  // service, which checks the peer's pid itself.
  PidFd pidfd(static_cast<int>(h.pid));
  if (pidfd.get() < 0 && errno == ESRCH) return CUDA_ERROR_INVALID_HANDLE;  // the exporter is gone
  if (ProcessStartTime(static_cast<int>(h.pid)) != h.start_time) return CUDA_ERROR_INVALID_HANDLE;
  Fds fds;
  bool from_service = false;
  IpcTable* table = ExporterTableLocked(h, pidfd, &fds, &from_service);
  if (table == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  IpcSlot& slot = table->slots[h.slot];
  std::uint32_t holder = kIpcHolders;
  if (!Enter(slot, h, &holder)) return CUDA_ERROR_INVALID_HANDLE;
  // From here the exporter keeps the export (and its descriptors) until we leave the slot.
  IpcChunk chunks[kIpcMaxChunks];
  std::uint32_t count = 0;
  const bool valid =
      ReadLayout(slot, h, chunks, &count) && ChunkFds(pidfd, from_service, chunks, count, &fds);
  CUdeviceptr base = 0;
  std::size_t total = 0;
  const CUresult result =
      valid ? MapChunks(chunks, count, fds.fd + 1, &base, &total) : CUDA_ERROR_INVALID_HANDLE;
  if (result != CUDA_SUCCESS) {
    Leave(slot, holder);
    return result == CUDA_ERROR_OUT_OF_MEMORY ? result : CUDA_ERROR_INVALID_HANDLE;
  }
  *pdptr = AddImportLocked(h, table, holder, chunks, count, base, total);
  return CUDA_SUCCESS;
}

bool EnsureTablesLocked() {
  if (g_tables == nullptr) g_tables = new (std::nothrow) std::map<ExporterKey, Exporter>();
  if (g_imports == nullptr) g_imports = new (std::nothrow) std::map<CUdeviceptr, Import>();
  return g_tables != nullptr && g_imports != nullptr;
}

}  // namespace

bool IpcOpenPooled(CUdeviceptr* pdptr, const CUipcMemHandle& handle, unsigned int flags,
                   CUresult* result) {
  IpcWireHandle h;
  memcpy(&h, handle.reserved, sizeof(h));
  if (memcmp(h.magic, kIpcHandleMagic, sizeof(h.magic)) != 0) return false;
  const RealDriver& real = Real();
  CUcontext ctx = nullptr;
  if (pdptr == nullptr || (flags & ~CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != 0 ||
      h.check != IpcHandleCheck(h) || h.slot >= kIpcSlots || h.size == 0 || h.table_fd < 0) {
    *result = CUDA_ERROR_INVALID_VALUE;  // malformed, truncated or damaged
    return true;
  }
  if (real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) {
    *result = CUDA_ERROR_INVALID_CONTEXT;
    return true;
  }
  DriverCallScope scope(nullptr);  // relaxed capture mode for the shim's own calls
  pthread_mutex_lock(&g_mu);
  *result = EnsureTablesLocked() ? OpenLocked(pdptr, h) : CUDA_ERROR_OUT_OF_MEMORY;
  const bool first = *result == CUDA_SUCCESS && (*g_imports)[*pdptr].refs == 1;
  pthread_mutex_unlock(&g_mu);
  if (first && Active()) RecordAlloc(RegistryId::kDevicePointers, *pdptr, h.size, Kind::kIpcImport);
  return true;
}

bool IpcClosePooled(CUdeviceptr dptr, CUresult* result) {
  pthread_mutex_lock(&g_mu);
  auto it = g_imports == nullptr ? decltype(g_imports->end()){} : g_imports->find(dptr);
  if (g_imports == nullptr || it == g_imports->end()) {
    pthread_mutex_unlock(&g_mu);
    return false;
  }
  if (--it->second.refs > 0) {
    pthread_mutex_unlock(&g_mu);
    *result = CUDA_SUCCESS;
    return true;
  }
  const Import import = it->second;
  g_imports->erase(it);
  pthread_mutex_unlock(&g_mu);
  const RealDriver& real = Real();
  {
    DriverCallScope scope(nullptr);
    // Work this process queued on the memory ends before the exporter may reuse it, as the
    // driver's close waits for it.
    CUcontext ctx = nullptr;
    if (real.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx != nullptr) (void)real.cuCtxSynchronize();
    for (std::uint32_t i = 0; i < import.chunks; ++i) {
      (void)real.cuMemUnmap(import.base + import.chunk[i].offset, import.chunk[i].size);
    }
    (void)real.cuMemAddressFree(import.base, import.total);
  }
  Leave(import.table->slots[import.slot], import.holder);
  if (Active()) (void)RecordFree(RegistryId::kDevicePointers, dptr);
  *result = CUDA_SUCCESS;
  return true;
}

void IpcImportsForgetInChild() {
  // The child inherits the mappings but not the parent's counts on the exporters' slots: its
  // table of opens starts empty (the parent still holds and closes its own).
  pthread_mutex_init(&g_mu, nullptr);
  if (g_imports != nullptr) g_imports->clear();
  g_own_start.store(0, std::memory_order_relaxed);
}

}  // namespace vramscope::interposer
