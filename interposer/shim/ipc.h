// CUDA IPC of pooled memory (ipc_export.cc, ipc_import.cc, ipc_service.cc).
//
// A legacy IPC handle names a whole cuMemAlloc allocation, and VMM memory (the pool's default
// upstream) cannot be exported by legacy IPC at all. So cuIpcGetMemHandle on a pooled block of a
// VMM pool whose physical memory was created shareable (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
// returns a vramscope handle: a magic, the exporter's identity (pid + process start time), a
// slot of the exporter's export table with its generation and a random nonce, the block's offset
// and size. The export table is a memfd of the exporter (IpcTable): per slot, the physical
// allocations (the pool's Map chunks) that cover the block, as file descriptors of the exporter
// (cuMemExportToShareableHandle), and the importing processes that hold it open. An importing
// shim recognises the magic, takes the table's and the chunks' descriptors from the exporter
// (pidfd_getfd, or the exporter's Unix-socket service with SCM_RIGHTS where ptrace rules refuse
// that), imports, reserves, maps, sets access and returns the block's address in its mapping.
// A handle without the magic goes to the driver (legacy IPC of a process without the shim).
//
// Lifetime (what cudaFree promises for IPC memory, kept): a block freed by the exporter while an
// importer holds it open is not reused (or unmapped) until the last importer closed it, as the
// driver keeps a legacy IPC allocation's memory until its last mapping goes; once freed, its
// handle no longer opens (CUDA_ERROR_INVALID_HANDLE). The exporter's exit loses nothing for
// importers: their imported physical handles keep the memory alive in the driver.
//
// Thread safety: every function may be called from any thread; the tables have one mutex each.
// Error convention: CUresult of the CUDA call being served.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include <cuda.h>

#include "status.h"

namespace vramscope::interposer {

// --- wire formats (shared between exporter and importer; versioned by the magics) -----------

inline constexpr char kIpcHandleMagic[8] = {'V', 'R', 'S', 'C', 'I', 'P', 'C', '1'};
inline constexpr char kIpcTableMagic[8] = {'V', 'R', 'S', 'C', 'T', 'B', 'L', '1'};
inline constexpr char kIpcRequestMagic[8] = {'V', 'R', 'S', 'C', 'R', 'E', 'Q', '1'};

// The 64 bytes of CUipcMemHandle::reserved.
struct IpcWireHandle {
  char magic[8];
  std::uint32_t pid;
  std::int32_t table_fd;     // the export table's descriptor number in the exporter
  std::uint64_t start_time;  // the exporter's start (/proc/PID/stat field 22)
  std::uint32_t slot;
  std::uint32_t generation;
  std::uint64_t nonce;   // random, also in the slot: a forged handle cannot name a slot
  std::uint64_t offset;  // of the block from the start of its first chunk
  std::uint64_t size;    // the block's requested bytes
  std::uint64_t check;   // IpcHandleCheck of the bytes before it (truncated or damaged handles)
};
static_assert(sizeof(IpcWireHandle) == sizeof(CUipcMemHandle));

inline constexpr std::uint32_t kIpcSlots = 1024;
// Chunks (physical handles) a block may span to be exported: a block inside one mapping spans at
// most pool::kMaxPiecesPerMap + 2 pieces (driver_upstream.h), one across two mappings twice that.
inline constexpr std::uint32_t kIpcMaxChunks = 132;  // 2 x (64 + 2): checked in ipc_export.cc

struct IpcChunk {
  std::uint64_t offset;  // from the first chunk's start
  std::uint64_t size;
  std::int32_t fd;  // in the exporter
  std::uint32_t pad;
};

inline constexpr std::uint32_t kIpcHolders = 16;

// An importing process that holds a slot open, by identity, so the exporter can tell a holder
// that died without closing (its pid gone, or another process's start time) and stop waiting.
struct IpcHolder {
  std::atomic<std::uint32_t> pid;  // 0: free
  std::uint32_t pad;
  std::atomic<std::uint64_t> start;  // 0 while the holder is filling it in
};

struct IpcSlot {
  std::atomic<std::uint32_t> generation;  // bumped when an export ends: old handles are stale
  std::atomic<std::uint32_t> revoked;     // the exporter freed the block
  // Importing processes beyond kIpcHolders (not checked for being alive).
  std::atomic<std::int32_t> importers;
  std::uint32_t chunk_count;
  std::uint64_t nonce;
  std::uint64_t offset;
  std::uint64_t size;
  IpcChunk chunks[kIpcMaxChunks];
  IpcHolder holders[kIpcHolders];
};
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

// Whether an importing process holds the slot (ipc_export.cc). `check_alive`: holders that
// died (pid gone, or another process's start time) are cleared rather than counted.
bool IpcSlotHeld(IpcSlot& slot, bool check_alive);

struct IpcTableHeader {
  char magic[8];
  std::uint32_t pid;
  std::uint32_t slots;
  std::uint64_t start_time;
  std::uint64_t pad;
};

struct IpcTable {
  IpcTableHeader header;
  IpcSlot slots[kIpcSlots];
};

// A request to the exporter's descriptor service (SCM_RIGHTS fallback); the answer is an
// IpcReply with the table's descriptor and the slot's chunk descriptors attached.
struct IpcRequest {
  char magic[8];
  std::uint32_t slot;
  std::uint32_t generation;
  std::uint64_t nonce;
};
struct IpcReply {
  std::int32_t status;  // 0, or an errno
  std::uint32_t fds;
};

// FNV-1a over the bytes before `check`: a truncated or damaged handle fails it.
inline std::uint64_t IpcHandleCheck(const IpcWireHandle& handle) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(&handle);
  std::uint64_t hash = 1469598103934665603ull;
  for (std::size_t i = 0; i < offsetof(IpcWireHandle, check); ++i) {
    hash = (hash ^ bytes[i]) * 1099511628211ull;
  }
  return hash;
}
// /proc/PID/stat field 22 (clock ticks since boot); 0 if unreadable.
std::uint64_t ProcessStartTime(int pid);
// The abstract socket name of the service of (pid, start): "\0vramscope-ipc.PID.START".
int IpcServiceAddress(int pid, std::uint64_t start, char* out, int capacity);

// --- exporter (ipc_export.cc) --------------------------------------------------------------

// The pooled free (device_pools.h's FreePooled), passed down by the callers above the pools: a
// deferred block whose importers all closed goes back to its pool through it.
using PooledFree = ShimStatus (*)(std::uintptr_t address, bool strict);
// cuIpcGetMemHandle of `dptr`: true with *result set when the shim answered (a vramscope
// handle, or an error); false: not a block of a shareable VMM pool, the caller decides.
bool IpcExportPooled(CUipcMemHandle* handle, CUdeviceptr dptr, CUresult* result,
                     PooledFree free_pooled);
// Exports live, deferred ones included (ipc_export.cc).
extern std::atomic<int> g_ipc_live_exports;
// Any export live: one relaxed load, inlined, the free path's only cost while nothing is
// exported.
inline bool IpcExportsLive() { return g_ipc_live_exports.load(std::memory_order_relaxed) != 0; }
// The free path, while exports are live: 1 if `address` is an exported block that importers
// still hold open, so its free is deferred (the block stays allocated until the last importer
// closed); -1 if it was freed before (deferred already); 0 otherwise (an exported block nobody
// holds stops being exported and is freed normally).
int IpcDeferFree(std::uintptr_t address, PooledFree free_pooled);
// Frees deferred blocks whose importers all closed. Called on export/free/OOM paths.
void IpcPollDeferred(PooledFree free_pooled);
// The exporter's table and chunk descriptors for a service request; fills `fds` (the table's
// first) and returns how many, or -errno. Holds the export lock while `send` runs.
int IpcServeRequest(const IpcRequest& request, int (*send)(int socket, const int* fds, int n),
                    int socket);
void IpcForgetInChild();

// --- the SCM_RIGHTS service (ipc_service.cc) -----------------------------------------------

// Starts the service thread once (lazily, on the first export); false if it could not.
bool IpcStartService(std::uint64_t start_time);
void IpcServiceForgetInChild();
// Asks the service of (pid, start) for a slot's descriptors: fds[0] the table, then the
// chunks. Returns how many, or -errno.
int IpcRequestFds(int pid, std::uint64_t start, const IpcRequest& request, int* fds, int capacity);

// --- importer (ipc_import.cc) --------------------------------------------------------------

// cuIpcOpenMemHandle_v2 of a vramscope handle: false if `handle` has no vramscope magic (the
// driver's own), else *result is the answer.
bool IpcOpenPooled(CUdeviceptr* pdptr, const CUipcMemHandle& handle, unsigned int flags,
                   CUresult* result);
// cuIpcCloseMemHandle: false if `dptr` is not an address IpcOpenPooled returned.
bool IpcClosePooled(CUdeviceptr dptr, CUresult* result);
void IpcImportsForgetInChild();

}  // namespace vramscope::interposer
