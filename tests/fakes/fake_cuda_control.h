// Test control API of the fake CUDA driver (tests/fakes/libcuda.so.1).
//
// The fake exports these functions next to the cu* entry points. A test that links the fake
// (fake_control_dep) calls them directly; a test that reaches the driver only through dlopen can
// fetch them with dlsym(handle, "vramscope_fake_...") (see routes.h, FakeControl).
//
// Thread safety: every function may be called from any thread; all take the fake's one mutex.
// Error convention: functions return 0 / a count / a size; an invalid argument (device out of
// range, unknown name) returns 0 or -1 as documented, never aborts.
//
// Environment (read at load and by vramscope_fake_reset):
//   VRAMSCOPE_FAKE_CAPACITY=<bytes>   per-device memory capacity (default 16 GiB)
//   VRAMSCOPE_FAKE_DEVICES=1|2        number of devices (default 2)
//   VRAMSCOPE_FAKE_MANUAL_EVENTS=1    start in manual event completion mode
//   VRAMSCOPE_FAKE_ARRAY_REQUIREMENTS=deferred  array memory requirements only for
//                                     deferred-mapping arrays
//                                     (vramscope_fake_set_array_requirements)
#ifndef VRAMSCOPE_TESTS_FAKES_FAKE_CUDA_CONTROL_H_
#define VRAMSCOPE_TESTS_FAKES_FAKE_CUDA_CONTROL_H_

#include <stddef.h>
#include <stdint.h>

struct CUstream_st;  // <cuda.h>'s stream handle type

#ifdef __cplusplus
extern "C" {
#endif

// Frees every allocation, stream, event, VMM object and capture; zeroes the call counters;
// re-reads the environment; forgets cuInit (the next driver call must be cuInit again, as in a
// fresh process); clears the calling thread's context stack and capture mode. Other threads'
// context stacks are left as they are (they hold stale handles of primary contexts, which stay
// valid objects). Does not undo "forked after init" in a fork child.
void vramscope_fake_reset(void);

// Per-device capacity in bytes: cuMemGetInfo_v2 reports (capacity - used, capacity), allocations
// beyond it fail with CUDA_ERROR_OUT_OF_MEMORY. Returns 0, or -1 for a device out of range.
int vramscope_fake_set_capacity(int device, size_t bytes);

// Number of devices reported by cuDeviceGetCount (1 to 16; default 2, or VRAMSCOPE_FAKE_DEVICES).
// Returns 0, or -1 if out of range.
int vramscope_fake_set_device_count(int count);

// Manual event completion. Off (default): work "finishes" as soon as it is submitted, so
// cuEventRecord completes the event at once. On: a recorded event stays pending (cuEventQuery
// returns CUDA_ERROR_NOT_READY) until the test completes it, or until a host-side wait covers it
// (cuEventSynchronize of it, cuStreamSynchronize of its stream, cuCtxSynchronize of its
// context): those waits complete the pending work they cover, modelling "the host waited, so
// the GPU finished" — unless blocking sync is on.
void vramscope_fake_set_manual_events(int on);

// Manual kernels. Off (default): a launch queues nothing. On: every cuLaunchKernel[_ptsz] is a
// kernel still running until the test completes it (vramscope_fake_complete_kernels) or a host
// wait covering it does (cuCtxSynchronize of its context, cuStreamSynchronize of its stream,
// cuEventSynchronize of an event after it); an event recorded (with manual events off) completes
// once every kernel before it on its stream has, with the legacy stream's implicit
// synchronisation: an event on the legacy stream also waits for earlier kernels on blocking
// streams (created without CU_STREAM_NON_BLOCKING, and the per-thread streams) of its context,
// and one on a blocking stream for earlier kernels on the legacy stream. Kernels count as
// pending events for vramscope_fake_pending_events and the complete_*_event calls.
void vramscope_fake_set_manual_kernels(int on);
// Completes up to `max` (all if negative) of the oldest pending kernels on `stream` (null: the
// legacy stream). Returns how many.
int vramscope_fake_complete_kernels(struct CUstream_st* stream, int max);
// Number of kernels not yet completed, in all and on `stream` (null: the legacy stream).
int vramscope_fake_pending_kernels(void);
int vramscope_fake_pending_kernels_on(struct CUstream_st* stream);
// Device-side ordering: how many kernels still pending the latest work queued on `stream` (a
// launch, or for CU_STREAM_LEGACY also a synchronous copy or memset; null: the legacy stream)
// was NOT ordered after, when it was queued: a kernel is ordered before it when it ran on the
// same stream, by the legacy stream's implicit synchronisation, or when the stream waited
// (cuStreamWaitEvent, before that work) for an event recorded after the kernel. -1: no work
// seen on the stream (or an unknown stream).
int vramscope_fake_unordered_at_last_work(struct CUstream_st* stream);
// The same for one kernel (an id from vramscope_fake_last_kernel): 1 if it was pending and the
// latest work on `stream` was not ordered after it, 0 if it was (or had completed), -1 if no
// work was seen on the stream.
int vramscope_fake_kernel_unordered_at_last_work(struct CUstream_st* stream, uint64_t kernel);
// The id of the latest kernel launched with manual kernels on (0: none yet).
uint64_t vramscope_fake_last_kernel(void);
// The stream (CU_STREAM_LEGACY / CU_STREAM_PER_THREAD for the default ones) of the event a
// cuEventSynchronize is blocked on right now (blocking sync), or null when none is.
struct CUstream_st* vramscope_fake_blocked_wait_stream(void);

// With manual events on and blocking sync on, the waits above block until another thread
// completes the events they wait for (vramscope_fake_complete_*), instead of completing them.
void vramscope_fake_set_blocking_sync(int on);

// Completes every pending event. Returns how many were completed.
int vramscope_fake_complete_all_events(void);

// Completes the oldest pending event (recording order). Returns 1, or 0 if none was pending.
int vramscope_fake_complete_next_event(void);

// Number of recorded events not yet completed.
int vramscope_fake_pending_events(void);

// cuMemUnmap calls made while an event was pending: with manual events an event stands for a
// kernel still running, and unmapping memory under it is an illegal address on a GPU.
uint64_t vramscope_fake_unmaps_under_pending_work(void);

// How many times the exported entry point with this exact name was called (e.g.
// "cuMemAlloc_v2", "cuMemAllocAsync_ptsz", "cuGetProcAddress_v2"). Unknown names return 0.
uint64_t vramscope_fake_call_count(const char* exact_name);

// Sum of the call counters of all entry points (lookups not included).
uint64_t vramscope_fake_total_calls(void);

// How many times cuGetProcAddress or cuGetProcAddress_v2 was asked for this base name (e.g.
// "cuMemAlloc", or "" for the runtime's first probe), whatever the version and flags.
uint64_t vramscope_fake_lookup_count(const char* symbol);

// Bytes of device memory charged to the device: cuMemAlloc_v2, cuMemAllocPitch_v2, memory held
// by the stream-ordered pool (live allocations and cached bytes not yet trimmed) and physical
// VMM allocations (cuMemCreate until released and unmapped). Managed and host memory are not
// charged. -1 cast to size_t for a device out of range.
size_t vramscope_fake_live_bytes(int device);

// Number of live allocations charged to the device: cuMemAlloc_v2/cuMemAllocPitch_v2 blocks,
// live stream-ordered allocations and physical VMM handles.
int vramscope_fake_live_allocations(int device);

// Number of live host-side allocations (cuMemHostAlloc, cuMemAllocHost_v2, cuMemAllocManaged)
// and host registrations (cuMemHostRegister_v2).
int vramscope_fake_live_host_allocations(void);

// Bytes cached in the device's default stream-ordered pool (freed but not yet trimmed).
size_t vramscope_fake_pool_cached_bytes(int device);

// Bytes the device's graph memory pool holds (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), and the
// number of instantiated graphs (fake_graph.cc).
size_t vramscope_fake_graph_reserved_bytes(int device);
int vramscope_fake_live_graph_execs(void);

// Bytes charged for the device's live CUDA arrays, and the number of live arrays and mipmapped
// arrays (fake_array.cc). set_array_requirements(0): cuArrayGetMemoryRequirements and
// cuMipmappedArrayGetMemoryRequirements answer only for deferred-mapping arrays, as the driver
// documents (CUDA_ERROR_INVALID_VALUE otherwise); 1 (default): for every array.
size_t vramscope_fake_array_bytes(int device);
int vramscope_fake_live_arrays(void);
void vramscope_fake_set_array_requirements(int for_all);

// Number of live VA reservations (cuMemAddressReserve) and of live mappings (cuMemMap).
int vramscope_fake_live_reservations(void);
int vramscope_fake_live_mappings(void);
// The devices the last cuMemSetAccess granted access (read or read-write) to the VMM mapping
// containing `ptr`: bit d for device d; 0 when no mapping contains it.
uint32_t vramscope_fake_access_devices(uint64_t ptr);

// Number of stream captures begun and not yet ended, and how many of those were invalidated
// by a prohibited call.
int vramscope_fake_active_captures(void);
int vramscope_fake_invalidated_captures(void);

// 1 if this process is a fork child of a process that had called cuInit: every driver call
// returns CUDA_ERROR_NOT_INITIALIZED, as the real driver does.
int vramscope_fake_forked_after_init(void);

// Observer of device memory the driver hands out and takes back, for the fake CUPTI
// (tests/fakes/fake_cupti.cc) to turn into MEMORY2 records. operation: ALLOCATION / RELEASE;
// kind: DEVICE (cuMemAlloc_v2, cuMemAllocPitch_v2), STREAM_ORDERED (cuMemAllocAsync & co., when
// the allocation is made and when it goes back to its pool; stream = the stream handle), VMM
// (physical memory of cuMemCreate: address = the handle; released once released and unmapped).
// Called with the fake's lock held, on the calling thread: the observer must not call the
// driver. nullptr removes it. Not reset by vramscope_fake_reset.
enum {
  VRAMSCOPE_FAKE_MEMORY_ALLOCATION = 1,
  VRAMSCOPE_FAKE_MEMORY_RELEASE = 2,
  VRAMSCOPE_FAKE_MEMORY_POOL_TRIMMED = 3,  // a stream-ordered pool gave `bytes` back to the
                                           // device; address = the pool handle
};
enum {
  VRAMSCOPE_FAKE_MEMORY_DEVICE = 0,
  VRAMSCOPE_FAKE_MEMORY_STREAM_ORDERED = 1,
  VRAMSCOPE_FAKE_MEMORY_VMM = 2,
};
typedef void (*vramscope_fake_memory_observer)(int operation, int device, uint64_t address,
                                               uint64_t bytes, int kind, uint64_t stream);
void vramscope_fake_set_memory_observer(vramscope_fake_memory_observer observer);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // VRAMSCOPE_TESTS_FAKES_FAKE_CUDA_CONTROL_H_
