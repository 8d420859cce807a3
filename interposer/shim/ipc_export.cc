// The exporting side of CUDA IPC of pooled memory (ipc.h): the export table, the chunk
// descriptors, deferred frees of blocks importers hold.
//
// Why descriptors stay open in the exporter: pidfd_getfd takes a descriptor the exporter holds
// at the moment the importer asks, and handles travel between processes at the program's pace
// (a queue, a file), so each exported chunk keeps one descriptor, shared by every export over
// it and closed with the last. The export table is one memfd for the process, so an export
// costs no descriptor of its own.
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <map>
#include <new>
#include <utility>
#include <vector>

#include "capture.h"
#include "config.h"
#include "counters.h"
#include "driver.h"
#include "ipc.h"
#include "log.h"
#include "ordered.h"
#include "origin.h"
#include "ring_events.h"
#include "slots.h"
#include "state.h"
#include "vramscope/pool/upstream.h"

static_assert(vramscope::interposer::kIpcMaxChunks >= 2 * (vramscope::pool::kMaxPiecesPerMap + 2),
              "an export must hold a block that spans two mappings' pieces");

namespace vramscope::interposer {

constinit std::atomic<int> g_ipc_live_exports{0};

std::uint64_t ProcessStartTime(int pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char text[1024];
  const ssize_t n = read(fd, text, sizeof(text) - 1);
  close(fd);
  if (n <= 0) return 0;
  text[n] = '\0';
  // Field 2 (comm) may hold spaces and parentheses: fields are counted after the last ')'.
  const char* p = strrchr(text, ')');
  if (p == nullptr) return 0;
  int field = 2;
  for (++p; *p != '\0' && field < 22; ++p) {
    if (*p == ' ') ++field;
  }
  return field == 22 ? strtoull(p, nullptr, 10) : 0;
}

int IpcServiceAddress(int pid, std::uint64_t start, char* out, int capacity) {
  // Abstract namespace: nothing on disk to clean up after a crash; same network namespace only.
  out[0] = '\0';
  const int n = snprintf(out + 1, static_cast<std::size_t>(capacity - 1), "vramscope-ipc.%d.%llu",
                         pid, static_cast<unsigned long long>(start));
  return n < 0 || n >= capacity - 1 ? -1 : n + 1;
}

namespace {

struct ChunkFd {
  std::size_t size = 0;
  int fd = -1;
  int refs = 0;
};

struct Export {
  bool used = false;
  bool deferred = false;  // freed by the program while importers hold it
  std::uintptr_t block = 0;
  std::uint64_t bytes = 0;
  bool strict = false;
  std::uint32_t chunks = 0;
  std::uintptr_t chunk_va[kIpcMaxChunks] = {};
  int device = 0;
};

// The ring's key of export slot `index` (vramscope/ring.h: IPC_EXPORT records): never a device
// address, so the stats engine tracks exports beside the pooled blocks they share.
constexpr std::uint64_t kExportKeyBase = 0xFFFFFFFFFFFE0000ull;

// The export's ALLOC or FREE record (lock-free ring writes: safe under g_mu).
void RingExport(std::uint32_t index, const Export& e, bool alloc) {
  RingWriter* ring = Ring();
  if (ring == nullptr) return;
  const std::uint32_t device = static_cast<std::uint32_t>(e.device);
  if (alloc) {
    NoteRingDevice(e.device);
    const RingAllocOrigin caller = RingCallerOrigin(ring);
    (void)ring->RecordAlloc(device, kExportKeyBase + index, e.bytes, e.bytes,
                            VRAMSCOPE_RING_ALLOC_IPC_EXPORT, 0, caller.nvtx_range, caller.site);
  } else {
    (void)ring->RecordFree(device, kExportKeyBase + index, e.bytes, e.bytes,
                           VRAMSCOPE_RING_ALLOC_IPC_EXPORT, 0);
  }
}

constinit pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
constinit IpcTable* g_table = nullptr;
constinit int g_table_fd = -1;
constinit std::uint64_t g_start_time = 0;
constinit Export* g_exports = nullptr;  // kIpcSlots entries
constinit std::map<std::uintptr_t, ChunkFd>* g_chunks = nullptr;
// Live exports by block address, and the deferred ones: the free path looks up one address and
// the poll walks only what waits, not the whole table.
constinit std::map<std::uintptr_t, std::uint32_t>* g_by_block = nullptr;
constinit std::vector<std::uint32_t>* g_deferred_list = nullptr;
constinit std::atomic<std::uint32_t> g_frees_polled{0};
constinit std::atomic<int> g_deferred{0};  // deferred frees waiting for importers
__attribute__((tls_model("initial-exec"))) constinit thread_local bool t_polling = false;

bool EnsureTableLocked() {
  if (g_table != nullptr) return true;
  g_start_time = ProcessStartTime(getpid());
  if (g_start_time == 0) return false;
  const int fd = memfd_create("vramscope-ipc-table", MFD_CLOEXEC);
  if (fd < 0) return false;
  if (ftruncate(fd, sizeof(IpcTable)) != 0) {
    close(fd);
    return false;
  }
  void* p = mmap(nullptr, sizeof(IpcTable), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  auto* exports = new (std::nothrow) Export[kIpcSlots];
  auto* chunks = new (std::nothrow) std::map<std::uintptr_t, ChunkFd>();
  auto* by_block = new (std::nothrow) std::map<std::uintptr_t, std::uint32_t>();
  auto* deferred = new (std::nothrow) std::vector<std::uint32_t>();
  if (p == MAP_FAILED || exports == nullptr || chunks == nullptr || by_block == nullptr ||
      deferred == nullptr) {
    if (p != MAP_FAILED) munmap(p, sizeof(IpcTable));
    delete[] exports;
    delete chunks;
    delete by_block;
    delete deferred;
    close(fd);
    return false;
  }
  auto* table = static_cast<IpcTable*>(p);  // a fresh memfd reads as zeros
  memcpy(table->header.magic, kIpcTableMagic, sizeof(kIpcTableMagic));
  table->header.pid = static_cast<std::uint32_t>(getpid());
  table->header.slots = kIpcSlots;
  table->header.start_time = g_start_time;
  for (IpcSlot& slot : table->slots) slot.generation.store(1, std::memory_order_relaxed);
  g_table = table;
  g_table_fd = fd;
  g_exports = exports;
  g_chunks = chunks;
  g_by_block = by_block;
  g_deferred_list = deferred;
  return true;
}

// One descriptor per exported chunk (the physical allocation mapped at `va`).
int ChunkFdLocked(Slot* slot, std::uintptr_t va, std::size_t size) {
  auto it = g_chunks->find(va);
  if (it != g_chunks->end() && it->second.size == size) {
    ++it->second.refs;
    return it->second.fd;
  }
  const RealDriver& real = Real();
  if (real.cuMemRetainAllocationHandle == nullptr || real.cuMemExportToShareableHandle == nullptr ||
      real.cuMemRelease == nullptr) {
    return -1;
  }
  DriverCallScope scope(slot->ctx);
  if (!scope.ok()) return -1;
  CUmemGenericAllocationHandle handle = 0;
  if (real.cuMemRetainAllocationHandle(&handle, reinterpret_cast<void*>(va)) != CUDA_SUCCESS) {
    return -1;
  }
  int fd = -1;
  const CUresult result =
      real.cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  (void)real.cuMemRelease(handle);  // the retain's reference; the mapping keeps the memory
  if (result != CUDA_SUCCESS || fd < 0) return -1;
  (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
  ChunkFd& chunk = (*g_chunks)[va];
  chunk.size = size;
  chunk.fd = fd;
  chunk.refs = 1;
  return fd;
}

void DropChunkLocked(std::uintptr_t va) {
  auto it = g_chunks->find(va);
  if (it == g_chunks->end() || --it->second.refs > 0) return;
  close(it->second.fd);
  g_chunks->erase(it);
}

// The export ends: old handles go stale, descriptors nobody else shares are closed.
void FinishLocked(std::uint32_t index) {
  Export& e = g_exports[index];
  IpcSlot& slot = g_table->slots[index];
  slot.revoked.store(1, std::memory_order_seq_cst);
  slot.generation.fetch_add(1, std::memory_order_seq_cst);
  for (std::uint32_t i = 0; i < e.chunks; ++i) DropChunkLocked(e.chunk_va[i]);
  KindCounters& kind = Counters().kind[static_cast<int>(Kind::kIpcExport)];
  kind.bytes.Sub(e.bytes);
  kind.frees.Add(1);
  RingExport(index, e, /*alloc=*/false);
  if (e.deferred) {
    g_deferred.fetch_sub(1, std::memory_order_relaxed);
    std::erase(*g_deferred_list, index);
  }
  g_by_block->erase(e.block);
  e = Export{};
  g_ipc_live_exports.fetch_sub(1, std::memory_order_relaxed);
}

void FillHandle(CUipcMemHandle* out, std::uint32_t index, std::uint64_t offset,
                std::uint64_t size) {
  const IpcSlot& slot = g_table->slots[index];
  IpcWireHandle h{};
  memcpy(h.magic, kIpcHandleMagic, sizeof(h.magic));
  h.pid = static_cast<std::uint32_t>(getpid());
  h.table_fd = g_table_fd;
  h.start_time = g_start_time;
  h.slot = index;
  h.generation = slot.generation.load(std::memory_order_relaxed);
  h.nonce = slot.nonce;
  h.offset = offset;
  h.size = size;
  h.check = IpcHandleCheck(h);
  memcpy(out->reserved, &h, sizeof(h));
}

// The first unused export slot, or kIpcSlots when all are taken.
std::uint32_t FreeExportLocked() {
  for (std::uint32_t i = 0; i < kIpcSlots; ++i) {
    if (!g_exports[i].used) return i;
  }
  return kIpcSlots;
}

// Takes one descriptor per chunk of the block (`maps`: `count` mappings) into export `index`
// and its table slot. On failure the descriptors taken are dropped and the export cleared.
bool TakeChunksLocked(Slot* slot, const std::pair<std::uintptr_t, std::size_t>* maps, int count,
                      std::uint32_t index) {
  Export& e = g_exports[index];
  IpcSlot& s = g_table->slots[index];
  for (int i = 0; i < count; ++i) {
    const int fd = ChunkFdLocked(slot, maps[i].first, maps[i].second);
    if (fd < 0) {
      for (std::uint32_t j = 0; j < e.chunks; ++j) DropChunkLocked(e.chunk_va[j]);
      e = Export{};
      return false;
    }
    e.chunk_va[i] = maps[i].first;
    e.chunks = static_cast<std::uint32_t>(i + 1);
    s.chunks[i].offset = maps[i].first - maps[0].first;
    s.chunks[i].size = maps[i].second;
    s.chunks[i].fd = fd;
  }
  return true;
}

// Completes export `index` (its chunks taken, `first_chunk` the first one's address) of the
// block `info` and opens it to importers; counted and written to the ring.
void PublishLocked(std::uint32_t index, const Slot& slot, const pool::BlockInfo& info,
                   std::uintptr_t first_chunk, int count) {
  Export& e = g_exports[index];
  IpcSlot& s = g_table->slots[index];
  std::uint64_t nonce = 0;
  if (getrandom(&nonce, sizeof(nonce), 0) != sizeof(nonce)) {
    nonce = static_cast<std::uint64_t>(clock()) * 0x9E3779B97F4A7C15ull ^ info.address;
  }
  s.chunk_count = static_cast<std::uint32_t>(count);
  s.nonce = nonce;
  s.offset = info.address - first_chunk;
  s.size = info.requested;
  s.importers.store(0, std::memory_order_relaxed);
  for (IpcHolder& holder : s.holders) holder.pid.store(0, std::memory_order_relaxed);
  // Published last: an importer checks the generation and `revoked` after taking its count.
  s.revoked.store(0, std::memory_order_seq_cst);
  e.used = true;
  e.block = info.address;
  (*g_by_block)[info.address] = index;
  e.bytes = info.requested;
  e.device = slot.device;
  g_ipc_live_exports.fetch_add(1, std::memory_order_relaxed);
  KindCounters& kind = Counters().kind[static_cast<int>(Kind::kIpcExport)];
  kind.bytes.Add(info.requested);
  kind.allocs.Add(1);
  RingExport(index, e, /*alloc=*/true);
}

// How an export under g_mu ended; IpcExportPooled logs and answers once g_mu is released.
enum class ExportOutcome : std::uint8_t {
  kExported,       // a new export, its handle filled in
  kSameHandle,     // the live block was exported before: its handle again
  kNoTable,        // the export table could not be created (errno says why)
  kTooManyChunks,  // the block spans more physical allocations than an export holds
  kNoFreeSlot,     // too many blocks exported at once
  kDriverRefused,  // the driver did not export a chunk's memory
};

// Exports the pooled block `info` of `slot` (`maps`: its `count` chunk mappings, count <= 0 when
// they are too many) into `handle`. Takes the export table, descriptors and a slot under g_mu.
ExportOutcome ExportLocked(Slot* slot, const pool::BlockInfo& info,
                           const std::pair<std::uintptr_t, std::size_t>* maps, int count,
                           CUipcMemHandle* handle) {
  if (!EnsureTableLocked()) return ExportOutcome::kNoTable;
  // The same live block exported again: the same handle, as the driver gives.
  if (auto it = g_by_block->find(info.address); it != g_by_block->end()) {
    const Export& e = g_exports[it->second];
    if (!e.deferred && e.chunks > 0) {
      FillHandle(handle, it->second, info.address - e.chunk_va[0], e.bytes);
      return ExportOutcome::kSameHandle;
    }
  }
  if (count <= 0) return ExportOutcome::kTooManyChunks;
  const std::uint32_t index = FreeExportLocked();
  if (index == kIpcSlots) return ExportOutcome::kNoFreeSlot;
  if (!TakeChunksLocked(slot, maps, count, index)) return ExportOutcome::kDriverRefused;
  PublishLocked(index, *slot, info, maps[0].first, count);
  const IpcSlot& s = g_table->slots[index];
  FillHandle(handle, index, s.offset, s.size);
  return ExportOutcome::kExported;
}

// Says why the export of `dptr` was refused (called without g_mu).
void LogRefusal(ExportOutcome outcome, CUdeviceptr dptr) {
  switch (outcome) {
    case ExportOutcome::kNoTable:
      VRAMSCOPE_LOG_ONCE(kWarn, "cuIpcGetMemHandle: cannot create the IPC export table (%s)",
                         strerror(errno));
      break;
    case ExportOutcome::kTooManyChunks:
    case ExportOutcome::kNoFreeSlot:
      VRAMSCOPE_LOG_ONCE(kWarn,
                         "cuIpcGetMemHandle(%#llx): %s; refused with CUDA_ERROR_NOT_SUPPORTED "
                         "(VRAMSCOPE_MODE=passthrough shares any allocation by legacy IPC)",
                         static_cast<unsigned long long>(dptr),
                         outcome == ExportOutcome::kTooManyChunks
                             ? "the block spans more physical allocations than an export holds"
                             : "too many blocks exported at once");
      Counters().ipc_refused.Add(1);
      break;
    case ExportOutcome::kDriverRefused:
      VRAMSCOPE_LOG_ONCE(kWarn,
                         "cuIpcGetMemHandle(%#llx): the driver did not export the pool's "
                         "memory; refused with CUDA_ERROR_NOT_SUPPORTED",
                         static_cast<unsigned long long>(dptr));
      break;
    case ExportOutcome::kExported:
    case ExportOutcome::kSameHandle:
      break;
  }
}

}  // namespace

bool IpcSlotHeld(IpcSlot& slot, bool check_alive) {
  bool held = slot.importers.load(std::memory_order_seq_cst) > 0;
  for (IpcHolder& holder : slot.holders) {
    const std::uint32_t pid = holder.pid.load(std::memory_order_seq_cst);
    if (pid == 0) continue;
    if (!check_alive) return true;
    const std::uint64_t start = holder.start.load(std::memory_order_seq_cst);
    // A holder still filling in its start time is alive. One that is gone (or whose pid now
    // names another process) closed nothing and never will: its entry is cleared.
    if (start == 0 || ProcessStartTime(static_cast<int>(pid)) == start) {
      held = true;
    } else {
      std::uint32_t expected = pid;
      (void)holder.pid.compare_exchange_strong(expected, 0, std::memory_order_seq_cst);
    }
  }
  return held;
}

bool IpcExportPooled(CUipcMemHandle* handle, CUdeviceptr dptr, CUresult* result,
                     PooledFree free_pooled) {
  pool::BlockInfo info;
  Slot* slot = FindPooledBlock(dptr, &info);
  if (slot == nullptr || !slot->upstream.vmm() ||
      slot->upstream.shareable_type() != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return false;
  }
  if (handle == nullptr) {
    *result = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  // Another process's work on the block is invisible to ordered reuse: it ends here, after the
  // work queued so far finished.
  BreakOrderedAndWait("cuIpcGetMemHandle");
  IpcPollDeferred(free_pooled);
  std::pair<std::uintptr_t, std::size_t> maps[kIpcMaxChunks];
  const int count = slot->upstream.MappingsCovering(info.address, info.requested, maps,
                                                    static_cast<int>(kIpcMaxChunks));
  pthread_mutex_lock(&g_mu);
  const ExportOutcome outcome = ExportLocked(slot, info, maps, count, handle);
  const std::uint64_t start = g_start_time;
  pthread_mutex_unlock(&g_mu);
  if (outcome == ExportOutcome::kSameHandle) {
    *result = CUDA_SUCCESS;
    return true;
  }
  if (outcome != ExportOutcome::kExported) {
    LogRefusal(outcome, dptr);
    *result = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  if (!IpcStartService(start)) {
    VRAMSCOPE_LOG_ONCE(kWarn,
                       "cuIpcGetMemHandle: the IPC descriptor service did not start (%s); "
                       "importers need pidfd_getfd (same user, ptrace allowed)",
                       strerror(errno));
  }
  VRAMSCOPE_LOG_ONCE(kInfo,
                     "cuIpcGetMemHandle on pooled memory: a vramscope handle; the importing "
                     "process must run under vramscope too (without it cuIpcOpenMemHandle fails "
                     "with CUDA_ERROR_INVALID_VALUE), or run both with VRAMSCOPE_MODE=passthrough");
  *result = CUDA_SUCCESS;
  return true;
}

namespace {

// Frees deferred blocks that no importer holds any more. `check_alive`: also look whether the
// holders are still alive (a read of /proc per holder), which the free path does only every
// kAliveEvery frees.
void PollDeferred(bool check_alive, PooledFree free_pooled) {
  if (g_deferred.load(std::memory_order_relaxed) == 0 || t_polling) return;
  t_polling = true;
  std::uintptr_t ready[64];
  bool strict[64];
  int count = 0;
  pthread_mutex_lock(&g_mu);
  for (std::size_t k = 0;
       g_deferred_list != nullptr && k < g_deferred_list->size() && count < 64;) {
    const std::uint32_t i = (*g_deferred_list)[k];
    if (IpcSlotHeld(g_table->slots[i], check_alive)) {
      ++k;
      continue;
    }
    ready[count] = g_exports[i].block;
    strict[count++] = g_exports[i].strict;
    FinishLocked(i);  // removes entry k
  }
  pthread_mutex_unlock(&g_mu);
  // Every importer closed (and synchronised before unmapping): the block is the pool's again,
  // under the usual fence of a free happening now.
  for (int i = 0; i < count; ++i) (void)free_pooled(ready[i], strict[i]);
  t_polling = false;
}

constexpr std::uint32_t kAliveEvery = 64;

}  // namespace

int IpcDeferFree(std::uintptr_t address, PooledFree free_pooled) {
  int verdict = 0;
  pthread_mutex_lock(&g_mu);
  auto it = g_by_block == nullptr ? decltype(g_by_block->end()){} : g_by_block->find(address);
  if (g_by_block != nullptr && it != g_by_block->end()) {
    const std::uint32_t i = it->second;
    Export& e = g_exports[i];
    IpcSlot& slot = g_table->slots[i];
    if (e.deferred) {
      verdict = -1;  // freed twice
    } else {
      // Dekker with the importer's open: it takes a holder entry, then reads `revoked`.
      slot.revoked.store(1, std::memory_order_seq_cst);
      if (IpcSlotHeld(slot, /*check_alive=*/true)) {
        e.deferred = true;
        e.strict = Cfg().mode == Mode::kStrict;
        g_deferred.fetch_add(1, std::memory_order_relaxed);
        g_deferred_list->push_back(i);
        verdict = 1;
      } else {
        FinishLocked(i);
      }
    }
  }
  pthread_mutex_unlock(&g_mu);
  if (g_deferred.load(std::memory_order_relaxed) != 0) {
    const std::uint32_t n = g_frees_polled.fetch_add(1, std::memory_order_relaxed);
    PollDeferred(/*check_alive=*/n % kAliveEvery == 0, free_pooled);
  }
  return verdict;
}

void IpcPollDeferred(PooledFree free_pooled) { PollDeferred(/*check_alive=*/true, free_pooled); }

int IpcServeRequest(const IpcRequest& request, int (*send)(int socket, const int* fds, int n),
                    int socket) {
  pthread_mutex_lock(&g_mu);
  int answer = -EINVAL;
  if (g_table != nullptr && request.slot < kIpcSlots && g_exports[request.slot].used) {
    const IpcSlot& slot = g_table->slots[request.slot];
    if (slot.generation.load(std::memory_order_acquire) == request.generation &&
        slot.nonce == request.nonce && slot.revoked.load(std::memory_order_acquire) == 0) {
      int fds[kIpcMaxChunks + 1];
      fds[0] = g_table_fd;
      for (std::uint32_t i = 0; i < slot.chunk_count; ++i) fds[i + 1] = slot.chunks[i].fd;
      answer = send(socket, fds, static_cast<int>(slot.chunk_count) + 1);
    }
  }
  pthread_mutex_unlock(&g_mu);
  return answer;
}

void IpcForgetInChild() {
  // The parent's exports are not the child's: its descriptors and table copies are closed (the
  // shared table mapping is dropped without touching the parent's slots).
  pthread_mutex_init(&g_mu, nullptr);
  if (g_table != nullptr) munmap(g_table, sizeof(IpcTable));
  if (g_table_fd >= 0) close(g_table_fd);
  if (g_chunks != nullptr) {
    for (auto& [va, chunk] : *g_chunks) close(chunk.fd);
    g_chunks->clear();
  }
  if (g_exports != nullptr) {
    for (std::uint32_t i = 0; i < kIpcSlots; ++i) g_exports[i] = Export{};
  }
  g_table = nullptr;
  g_table_fd = -1;
  g_start_time = 0;
  g_ipc_live_exports.store(0, std::memory_order_relaxed);
  g_deferred.store(0, std::memory_order_relaxed);
  delete[] g_exports;
  delete g_chunks;
  delete g_by_block;
  delete g_deferred_list;
  g_exports = nullptr;
  g_chunks = nullptr;
  g_by_block = nullptr;
  g_deferred_list = nullptr;
  IpcServiceForgetInChild();
  IpcImportsForgetInChild();
}

}  // namespace vramscope::interposer
