// RingWriter: the in-process side of the event ring (layout: vramscope/ring.h).
//
// What it is: one process's shared-memory ring file, opened once by the shim, written from any
// thread. Writes never block and never allocate: when the reader is too far behind, the record
// is dropped and counted in the header (records_dropped); the running counters stay exact.
//
// Thread safety: Open/Close/SetDeviceInfo/MarkExited are for one thread at a time (the shim's
// init, fork and exit paths). Everything else is safe from any number of threads concurrently,
// including signal handlers (lock-free, async-signal-safe). Calls on a writer that is not open
// are no-ops returning false. Close unmaps the ring, so it must not race with writers: call it
// only where no other thread writes (a fork child); at exit call MarkExited and leave it open.
//
// Error convention: Open returns a [[nodiscard]] RingError; hot-path calls return bool (false =
// not recorded: not open, or dropped). Nothing throws; no dependency beyond libc and pthreads.
//
// Costs (tests/ring/ring_bench, one thread): Write of a filled record: one CAS on `head`, a
// 60-byte copy and a release store, about 5-10 ns; RingNowNs (vDSO clock_gettime) about 20 ns;
// counter updates: one fetch_add plus a load (and rarely a CAS) per figure.
//
// Fork: the child inherits the parent's mapping. In the child call Close() (it writes nothing)
// and then Open() again: the child gets its own ring and starts with clean counters.
#pragma once

#include <cstddef>
#include <cstdint>

#include "vramscope/ring.h"

namespace vramscope::interposer {

enum class [[nodiscard]] RingError{
    kOk = 0,
    kAlreadyOpen,      // Open on an open writer
    kInvalidArgument,  // capacity not a power of two in range, no dir, path too long
    kCannotCreate,     // open/fallocate/rename failed (errno in last_errno; ENOSPC: no room)
    kCannotMap,        // mmap failed
};

const char* RingErrorName(RingError error);

struct RingOpenOptions {
  // Directory for the ring file (required: nullptr or "" is kInvalidArgument). Which directory a
  // process uses is decided by ChooseRingDir (ring_dir.h), not here.
  const char* dir = nullptr;
  // When >= 0: `dir`, already open (CheckRingDir's descriptor). The file is created relative to
  // it (openat/renameat), so the directory that was checked is the one written; `dir` then only
  // names it in path(). Not closed by Open.
  int dir_fd = -1;
  // Records, a power of two in [VRAMSCOPE_RING_MIN_CAPACITY, VRAMSCOPE_RING_MAX_CAPACITY].
  std::uint32_t capacity = VRAMSCOPE_RING_DEFAULT_CAPACITY;
  // VRAMSCOPE_MODE as the shim runs: "pool", "passthrough", "strict" (truncated to 15 bytes).
  const char* mode = "pool";
};

// CLOCK_MONOTONIC in nanoseconds: the clock of record time_ns.
std::uint64_t RingNowNs();
// The calling thread's OS id (gettid), cached per thread; reset in a fork child.
std::uint32_t RingThreadId();

class RingWriter {
 public:
  constexpr RingWriter() = default;
  ~RingWriter();
  RingWriter(const RingWriter&) = delete;
  RingWriter& operator=(const RingWriter&) = delete;

  // Creates <dir>/vramscope.<uid>.<pid>.<start_time_ns>.ring (via a .tmp name and a rename),
  // fills the header (pid, parent, start times, host, /proc/self/cmdline, mode) and maps it.
  RingError Open(const RingOpenOptions& options);
  // Unmaps; the file stays for the reader. Writes nothing, so it is safe in a fork child.
  void Close();
  bool is_open() const { return header_ != nullptr; }
  // The ring file's path ("" when not open).
  const char* path() const { return path_; }
  int last_errno() const { return last_errno_; }
  const vramscope_ring_header* header() const { return header_; }

  // --- What the shim calls: counters and a record together ------------------------------------
  // `kind` is a vramscope_ring_alloc_kind. Counters follow the rule in vramscope/ring.h: HOST and
  // IPC_IMPORT count no bytes; every kind but POOLED also counts as reserved.
  bool RecordAlloc(std::uint32_t device, std::uint64_t address, std::uint64_t requested_bytes,
                   std::uint64_t allocated_bytes, std::uint8_t kind, std::uint64_t stream = 0,
                   std::uint32_t nvtx_range = 0, std::uint64_t site = 0);
  bool RecordFree(std::uint32_t device, std::uint64_t address, std::uint64_t requested_bytes,
                  std::uint64_t allocated_bytes, std::uint8_t kind, std::uint64_t stream = 0);
  // The pool took `bytes` from the driver (cuMemAlloc of a segment, or cuMemMap of VMM pages).
  bool RecordPoolReserve(std::uint32_t device, std::uint64_t address, std::uint64_t bytes);
  // The pool gave `bytes` back (cuMemFree of a segment, or cuMemUnmap).
  bool RecordPoolRelease(std::uint32_t device, std::uint64_t address, std::uint64_t bytes);
  // name/domain need not be NUL-terminated; together they are truncated to
  // VRAMSCOPE_RING_MAX_NVTX_TEXT bytes. Takes 1 + ceil((len - 28) / 40) consecutive slots.
  bool RecordNvtxPush(std::uint32_t device, std::uint32_t range_id, std::uint32_t parent_range_id,
                      std::uint32_t category, const char* name, std::size_t name_len,
                      const char* domain, std::size_t domain_len);
  bool RecordNvtxPop(std::uint32_t device, std::uint32_t range_id);
  // verdict: vramscope.v1.OomVerdict (1 fragmentation, 2 capacity, 0 let the reader decide).
  bool RecordOom(std::uint32_t device, std::uint64_t requested_bytes, std::uint64_t free_bytes,
                 std::uint64_t largest_free_block_bytes, std::uint8_t verdict);
  bool RecordPoolState(std::uint32_t device, const vramscope_ring_pool_state_payload& state);
  // operation: CuptiMemoryEvent.Operation (1 allocation, 2 release).
  bool RecordCuptiMemory(std::uint32_t device, std::uint8_t operation, std::uint64_t time_ns,
                         const vramscope_ring_cupti_payload& payload);

  // The run's labels in their text form (ring.h, LABELS), 1..VRAMSCOPE_RING_MAX_LABELS_BYTES
  // bytes, as consecutive records; false when longer or dropped. The caller checks the text.
  bool RecordLabels(const char* text, std::size_t length);

  // Fills device_info[device] (device < VRAMSCOPE_RING_MAX_DEVICES). uuid may be null.
  void SetDeviceInfo(std::uint32_t device, const char* name, const std::uint8_t* uuid,
                     std::uint64_t total_memory_bytes);
  // The exit path: a PROCESS_EXIT record, then exit_code and exited = 1 (release).
  void MarkExited(int exit_code);

  // --- Primitives ------------------------------------------------------------------------------
  // Publishes a copy of `record` (its seq is ignored). False when dropped.
  bool Write(const vramscope_ring_record& record);
  // Running counters only (no record). Devices >= VRAMSCOPE_RING_MAX_DEVICES are not counted.
  void OnAlloc(std::uint32_t device, std::uint64_t requested_bytes, std::uint64_t allocated_bytes);
  void OnFree(std::uint32_t device, std::uint64_t requested_bytes, std::uint64_t allocated_bytes);
  void OnReserve(std::uint32_t device, std::uint64_t bytes);
  void OnRelease(std::uint32_t device, std::uint64_t bytes);

 private:
  // Claims `n` consecutive positions; false (and one drop counted) when the ring is full.
  bool Claim(std::uint32_t n, std::uint64_t* position);
  vramscope_ring_record* Slot(std::uint64_t position) {
    return records_ + (position & (capacity_ - 1));
  }
  void Publish(vramscope_ring_record* slot, std::uint64_t position);

  vramscope_ring_header* header_ = nullptr;
  vramscope_ring_record* records_ = nullptr;
  std::uint64_t capacity_ = 0;
  std::size_t mapped_bytes_ = 0;
  int fd_ = -1;
  int last_errno_ = 0;
  char path_[512] = {};
};

}  // namespace vramscope::interposer
