// Exact running counters of the shim, in one standard-layout struct of lock-free atomics so a
// later shared-memory ring header (interposer/include/vramscope/) can mirror it field by field.
//
// Thread safety: every field is a relaxed atomic; readers see each field exact, the struct as a
// whole is not a snapshot. Pool figures (requested/allocated, alloc and free counts) live in the
// pools and are copied in by RefreshPoolFigures() (shim.h) when a snapshot is taken.
#pragma once

#include <atomic>
#include <cstdint>

#include "vramscope/ring.h"

namespace vramscope::interposer {

// Devices the shim tracks: every per-device table (counters, pools' peer-access lists, graph
// pools, the ring header) is sized from this one constant; a device past it is counted in the
// last entry.
inline constexpr int kMaxDevices = static_cast<int>(VRAMSCOPE_RING_MAX_DEVICES);

// Ways to take memory that the shim passes through to the driver and records.
enum class Kind : int {
  kDevice = 0,      // cuMemAlloc_v2 not pooled (passthrough mode, non-primary context)
  kPitch,           // cuMemAllocPitch_v2
  kManaged,         // cuMemAllocManaged
  kHost,            // cuMemHostAlloc, cuMemAllocHost_v2
  kHostRegistered,  // cuMemHostRegister_v2 until cuMemHostUnregister (pinned, not allocated)
  kAsync,           // cuMemAllocAsync(_ptsz), cuMemAllocFromPoolAsync(_ptsz)
  kVmmPhysical,     // cuMemCreate until cuMemRelease
  kVmmMapped,       // cuMemMap until cuMemUnmap
  kVmmReserved,     // cuMemAddressReserve until cuMemAddressFree (address space only)
  kIpcImport,       // cuIpcOpenMemHandle_v2 until cuIpcCloseMemHandle (owned by another process)
  kArray,           // cuArrayCreate_v2, cuArray3DCreate_v2, cuMipmappedArrayCreate until destroyed
  kGraph,           // a device's graph memory pool (graph memory nodes), reserved bytes
  kIpcExport,       // pooled blocks exported by cuIpcGetMemHandle, until freed (not more memory)
  kCount,
};

const char* KindName(Kind kind);
// Whether memory of this kind is device memory charged to the GPU.
bool IsDeviceMemory(Kind kind);

struct Counter {
  std::atomic<std::uint64_t> value{0};
  void Add(std::uint64_t n) { value.fetch_add(n, std::memory_order_relaxed); }
  std::uint64_t Get() const { return value.load(std::memory_order_relaxed); }
};

// current/peak pair: Add raises the peak with a CAS loop.
struct Gauge {
  std::atomic<std::uint64_t> current{0};
  std::atomic<std::uint64_t> peak{0};
  void Add(std::uint64_t n) {
    const std::uint64_t now = current.fetch_add(n, std::memory_order_relaxed) + n;
    std::uint64_t seen = peak.load(std::memory_order_relaxed);
    while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }
  void Sub(std::uint64_t n) { current.fetch_sub(n, std::memory_order_relaxed); }
};

struct KindCounters {
  Gauge bytes;
  Counter allocs;
  Counter frees;
};

struct DeviceCounters {
  // Copied from the device's pools at snapshot time (exact under each pool's lock).
  Counter current_requested_bytes;
  Counter peak_requested_bytes;
  Counter current_allocated_bytes;
  Counter peak_allocated_bytes;
  Counter idle_bytes;     // reserved - allocated, pending fences included
  Counter pending_bytes;  // freed, fence not yet complete
  Counter allocs;         // cuMemAlloc_v2 served by the pool
  Counter frees;          // cuMemFree_v2 served by the pool
  Counter oom;            // allocations that finally failed
  // Maintained by the shim itself.
  Gauge reserved_bytes;           // held from the driver by the pool (segments or mapped VMM)
  Counter driver_alloc_calls;     // the pool's own cuMemAlloc_v2 / cuMemCreate+cuMemMap
  Counter driver_free_calls;      // the pool's own cuMemFree_v2 / cuMemUnmap
  Counter fence_syncs;            // cuCtxSynchronize issued by the shim
  Counter user_syncs;             // the application's own cuCtxSynchronize (completes fences)
  Counter syncs_skipped_capture;  // wanted to sync, a capture was live
  Counter syncs_during_capture;   // the pool's Wait synchronised while a capture was live
  Counter oom_retries;            // driver OOM on a passthrough call, cache flushed, retried
};

struct ShimCounters {
  std::uint32_t layout_version = 1;
  std::uint32_t mode = 0;  // Mode (config.h)
  DeviceCounters device[kMaxDevices];
  KindCounters kind[static_cast<int>(Kind::kCount)];
  // Device memory taken by passthrough calls (device, pitch, async, vmm_physical, array, graph
  // kinds): the program's own footprint in passthrough mode.
  Gauge passthrough_device_bytes;
  Counter ipc_refused;        // cuIpcGetMemHandle on a pooled sub-allocation, refused
  Counter ordered_ended;      // ordered reuse ended (ordered.h): 0 or 1
  Counter ordered_end_waits;  // stream waits inserted on the end event while it was pending
  Counter event_fences;       // event fences queued (stream_fence.h), one per pool per round
  Counter event_fence_syncs;  // of those, not exact: completed by a device synchronisation
  Counter event_fence_waits;  // allocations that waited for the oldest event fence
  // VRAMSCOPE_FENCE_GPU_WAIT: fences handed over to GPU-side waits instead of a host wait, and
  // the cuStreamWaitEvent calls they cost (stream_fence.h).
  Counter gpu_wait_handovers;
  Counter gpu_waits;
  // The event fences' own driver calls (cuEventRecord of the rounds, cuEventQuery of the polls):
  // what the fences cost the driver, next to the fence thread's CPU time in the summary.
  Counter event_records;
  Counter event_queries;
  // Pieces whose unmap waited for owed rounds of GPU-side waits instead of a synchronisation,
  // and the times a map met them and synchronised (DriverUpstream's deferred unmaps).
  Counter deferred_unmaps;
  Counter deferred_flushes;
  Counter deferred_reused;  // of those pieces, mapped again at a new address before the unmap
};

// The process's counters (zeroed in a fork child: ResetCountersInChild, shim.cc's fork table).
ShimCounters& Counters();
void ResetCountersInChild();
// Counters of a device ordinal; out-of-range ordinals share the last slot.
DeviceCounters& DeviceCountersFor(int device);

}  // namespace vramscope::interposer
