// Internal state of the fake CUDA driver (libcuda.so.1 for CI, backed by host memory).
//
// One process-wide State guarded by one mutex. Every exported entry point starts with a Call,
// which counts the call under its exact exported name, takes the mutex, and checks the two
// process-level conditions every real driver call checks first (cuInit was called; this is not
// a fork child of an initialised process). Entry points never call other exported entry points:
// under LD_PRELOAD a shim would interpose the inner call, so shared work lives in the helpers
// declared here.
//
// Handles: CUcontext, CUstream, CUevent and CUmemoryPool point at the structs defined below
// (cuda.h only forward-declares them). CUdeviceptr values are host addresses: device memory is
// host memory, so tests can read what they wrote through cuMemcpy* or directly.
//
// Thread safety: all State members are guarded by State::mu; the context stack and the stream
// capture mode are per thread (thread_local), as in the real driver.
#ifndef VRAMSCOPE_TESTS_FAKES_FAKE_STATE_H_
#define VRAMSCOPE_TESTS_FAKES_FAKE_STATE_H_

#include <stddef.h>
#include <stdint.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <cuda.h>

#include "fake_cuda_control.h"

#define VRAMSCOPE_FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace vramscope::fake {

// Devices the fake can report (VRAMSCOPE_FAKE_DEVICES, vramscope_fake_set_device_count) and how
// many it reports by default.
inline constexpr int kMaxDevices = 16;
inline constexpr int kDefaultDevices = 2;
inline constexpr int kDriverVersion = 13000;  // what cuDriverGetVersion reports (CUDA 13.0)
inline constexpr size_t kDefaultCapacity = size_t{16} << 30;
inline constexpr size_t kVmmGranularity = size_t{2} << 20;  // cuMemGetAllocationGranularity
inline constexpr size_t kAllocAlignment = 256;  // cuMemAlloc returns 256-byte aligned memory
inline constexpr size_t kPitchAlignment = 512;  // cuMemAllocPitch rounds rows to this

}  // namespace vramscope::fake

// Handle types named by cuda.h. Defined at global scope because cuda.h declares them there.
struct CUctx_st {
  int device = 0;
  bool primary = true;
  int refcount = 0;        // primary-context retains; 0 means inactive (no memory, unusable)
  bool destroyed = false;  // non-primary context after cuCtxDestroy_v2 (or a reset)
};

struct CUmemPoolHandle_st {
  int device = 0;
  size_t live = 0;               // bytes of live allocations from this pool
  size_t cached = 0;             // freed by cuMemFreeAsync, still reserved by the pool
  size_t release_threshold = 0;  // CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, default 0
};

struct CUstream_st {
  CUctx_st* ctx = nullptr;
  unsigned int flags = 0;
  int priority = 0;
};

// Graph nodes: the fake keeps only mem-alloc nodes' figures (device >= 0); other nodes are empty.
struct CUgraphNode_st {
  int device = -1;  // mem-alloc node: the device its memory lives on; -1 for any other node
  size_t bytes = 0;
};

// A graph (cuGraphCreate, cuStreamEndCapture). Owns its nodes.
struct CUgraph_st {
  std::vector<CUgraphNode_st*> nodes;
  ~CUgraph_st() {
    for (CUgraphNode_st* node : nodes) delete node;
  }
};

// An instantiated graph: the bytes its mem-alloc nodes take from each device's graph memory
// pool, and whether they are mapped now (instantiate, upload and launch map; a trim unmaps).
struct CUgraphExec_st {
  CUctx_st* ctx = nullptr;
  size_t need[vramscope::fake::kMaxDevices] = {};  // per device
  bool mapped[vramscope::fake::kMaxDevices] = {};
};

// A CUDA array or mipmapped array (cuArrayCreate_v2, cuArray3DCreate_v2, cuMipmappedArrayCreate).
struct CUarray_st {
  CUctx_st* ctx = nullptr;
  int device = 0;
  size_t size = 0;     // what cuArrayGetMemoryRequirements reports
  size_t charged = 0;  // charged to the device (0 for sparse and deferred-mapping arrays)
  bool deferred = false;
};
struct CUmipmappedArray_st : CUarray_st {};

struct CUevent_st {
  enum class Status { kNeverRecorded, kPending, kComplete };
  CUctx_st* ctx = nullptr;
  unsigned int flags = 0;
  Status status = Status::kNeverRecorded;
  uintptr_t stream_key = 0;  // normalized stream of the last record (see StreamKey)
  uint64_t record_seq = 0;   // recording order, for vramscope_fake_complete_next_event
  // Manual kernels (vramscope_fake_set_manual_kernels): a kernel is a pending item of its own
  // (kernel), completed only by the test or a host wait; an event recorded then is automatic:
  // it completes once no pending kernel queued before it precedes it (BlocksLocked).
  bool kernel = false;
  bool automatic = false;
  CUctx_st* stream_ctx = nullptr;  // the context of the stream of the last record
  int stream_kind = 0;             // kStreamLegacy, kStreamBlocking, kStreamNonBlocking
  std::chrono::steady_clock::time_point completed_at{};
};

namespace vramscope::fake {

enum class AllocKind {
  kDevice,          // cuMemAlloc_v2
  kPitch,           // cuMemAllocPitch_v2
  kAsync,           // cuMemAllocAsync / cuMemAllocFromPoolAsync (pool memory)
  kGraph,           // cuMemAllocAsync on a capturing stream: graph-owned, not charged until launch
  kManaged,         // cuMemAllocManaged
  kHost,            // cuMemHostAlloc / cuMemAllocHost_v2
  kHostRegistered,  // cuMemHostRegister_v2: the caller's memory, not owned
};

struct Allocation {
  size_t size = 0;     // bytes the caller asked for (pitch * height for pitched)
  size_t charged = 0;  // bytes charged to the device (0 for host, managed, graph)
  int device = 0;
  CUctx_st* ctx = nullptr;
  AllocKind kind = AllocKind::kDevice;
  CUmemPoolHandle_st* pool = nullptr;  // kAsync only
  uint64_t buffer_id = 0;              // CU_POINTER_ATTRIBUTE_BUFFER_ID
  void* storage = nullptr;  // from AllocStorage (== the base address); nullptr if not owned
};

struct Capture {
  uint64_t id = 0;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  uint64_t thread = 0;  // ThreadId() of the thread that began it
  bool invalidated = false;
  std::vector<std::pair<int, size_t>> alloc_nodes;  // captured cuMemAllocAsync: device, bytes
};

// VMM physical allocation (cuMemCreate): a memfd, so every mapping aliases the same pages and
// data survives unmap/remap, as physical GPU memory does.
struct Physical {
  int fd = -1;
  size_t size = 0;
  int device = 0;
  int mappings = 0;
  bool released = false;   // every handle reference released; freed once the last mapping goes
  int refs = 1;            // cuMemCreate / import, plus cuMemRetainAllocationHandle
  bool shareable = false;  // created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
  bool imported = false;   // cuMemImportFromShareableHandle: another process's, not charged
};

struct Mapping {
  size_t size = 0;
  CUmemGenericAllocationHandle handle = 0;
  size_t offset = 0;
  CUmemAccess_flags access = CU_MEM_ACCESS_FLAGS_PROT_NONE;  // set by cuMemSetAccess
  // Bit d: the last cuMemSetAccess granted device d read or read-write access.
  uint32_t access_devices = 0;
};

struct Device {
  size_t capacity = kDefaultCapacity;
  size_t used = 0;  // bytes charged (see vramscope_fake_live_bytes)
  int live_allocations = 0;
  CUctx_st primary;
  CUmemPoolHandle_st default_pool;
  // The graph memory pool: bytes reserved (charged) and mapped by instantiated graphs, and the
  // high-water marks of cuDeviceGetGraphMemAttribute.
  size_t graph_reserved = 0;
  size_t graph_used = 0;
  size_t graph_reserved_high = 0;
  size_t graph_used_high = 0;
};

struct State {
  std::mutex mu;
  std::condition_variable cv;  // signalled when events complete

  bool initialized = false;        // cuInit succeeded in this process
  bool forked_after_init = false;  // set in a fork child of an initialised process
  int device_count = kDefaultDevices;
  bool manual_events = false;
  bool manual_kernels = false;
  bool blocking_sync = false;
  uintptr_t blocked_wait_stream = 0;  // stream key of the event a blocked cuEventSynchronize awaits
  Device devices[kMaxDevices];

  std::map<CUdeviceptr, Allocation> allocations;  // by base address
  // Non-primary contexts (cuCtxCreate). Never deleted: other threads' context stacks may
  // still name one after cuCtxDestroy_v2, and must find it marked destroyed, not freed.
  std::set<CUctx_st*> contexts;
  std::set<CUstream_st*> streams;
  std::set<CUevent_st*> events;
  std::set<CUgraph_st*> graphs;
  std::set<CUgraphExec_st*> graph_execs;
  std::set<CUarray_st*> arrays;  // arrays and mipmapped arrays
  // cuArrayGetMemoryRequirements answers for every array (default), or, as the driver documents,
  // only for deferred-mapping ones (vramscope_fake_set_array_requirements(0),
  // VRAMSCOPE_FAKE_ARRAY_REQUIREMENTS=deferred).
  bool array_requirements_for_all = true;
  uint64_t next_record_seq = 1;
  uint64_t next_buffer_id = 1;
  uint64_t next_capture_id = 1;
  std::map<uintptr_t, Capture> captures;  // by StreamKey of the capturing stream
  std::map<CUdeviceptr, int> ipc_opens;   // base -> open count

  std::map<CUmemGenericAllocationHandle, Physical> physical;
  CUmemGenericAllocationHandle next_physical = 1;
  std::map<CUdeviceptr, size_t> reservations;  // base -> size
  std::map<CUdeviceptr, Mapping> mappings;     // base -> mapping

  // Device-side waits (cuStreamWaitEvent on a pending event), per stream key: what each event
  // stood for when waited on, so later work on the stream is ordered after it (OrderedAfter).
  std::map<uintptr_t, std::vector<CUevent_st>> stream_waits;
  // Per stream key: the pending kernels (their record_seq) the latest work queued there (a
  // launch, a synchronous copy or memset, a graph launch) was not ordered after (NoteWorkLocked).
  std::map<uintptr_t, std::vector<uint64_t>> unordered_at_last_work;
  uint64_t last_kernel_seq = 0;  // record_seq of the latest manual kernel launched

  std::map<std::string, uint64_t> call_counts;
  // cuMemUnmap calls made while an event was pending (with manual events, "a kernel still
  // running": giving its memory back then would be an illegal address on a GPU).
  uint64_t unmaps_under_pending_work = 0;
};

State& GlobalState();

// Unique id of the calling thread (for capture ownership); never reused.
uint64_t ThreadId();

// The calling thread's context stack (top = current context) and capture mode.
std::vector<CUctx_st*>& ContextStack();
CUstreamCaptureMode& ThreadCaptureMode();

// Resets State to the configuration in the environment, freeing everything it owns. Caller
// holds mu.
void ResetLocked(State& s);

// RAII prologue of every entry point: counts `name`, locks the state.
class Call {
 public:
  explicit Call(const char* name);
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  State& state() { return s_; }
  std::unique_lock<std::mutex>& lock() { return lock_; }

  // CUDA_ERROR_NOT_INITIALIZED before cuInit or in a fork child of an initialised process
  // (the real driver refuses both), else CUDA_SUCCESS.
  CUresult RequireInit() const;

  // RequireInit, then the calling thread's current context (CUDA_ERROR_INVALID_CONTEXT if
  // there is none or it is an inactive primary context).
  CUresult RequireContext(CUctx_st** ctx) const;

 private:
  State& s_;
  std::unique_lock<std::mutex> lock_;
};

// `ctx` if it names a usable context (a primary context of a present device, or a live
// non-primary one), else nullptr.
CUctx_st* ValidContext(State& s, CUcontext ctx);

// Device ordinal validity (CUDA_ERROR_INVALID_DEVICE otherwise).
bool ValidDevice(const State& s, CUdevice dev);

// The memory observer (vramscope_fake_set_memory_observer): told of device memory the driver
// hands out and takes back. Caller holds the mutex.
void NotifyMemory(int operation, int device, uint64_t address, uint64_t bytes, int kind,
                  uint64_t stream);

// Charge/uncharge device memory. Charge returns false (and charges nothing) if it would
// exceed the capacity.
bool Charge(State& s, int device, size_t bytes);
void Uncharge(State& s, int device, size_t bytes);

// Finds the allocation containing [ptr, ptr+len) (host, managed, device, pool, graph);
// nullptr if none. *base receives its base.
Allocation* FindContaining(State& s, CUdeviceptr ptr, size_t len, CUdeviceptr* base);

// True if [ptr, ptr+len) lies in one VMM mapping with at least `access` (cuMemSetAccess).
bool InMapping(const State& s, CUdeviceptr ptr, size_t len, CUmemAccess_flags access);

// Host memory standing in for device memory: anonymous mmap, so untouched memory costs nothing
// (tests fill devices of several GiB) and malloc debugging (meson's MALLOC_PERTURB_) does not
// write through it. Page-aligned, which satisfies kAllocAlignment. nullptr on failure.
void* AllocStorage(size_t bytes);
void FreeStorage(void* p, size_t bytes);

// Frees one allocation record and its storage, returning pool memory to its pool's cache and
// uncharging the rest. Caller holds mu.
void FreeAllocationLocked(State& s, std::map<CUdeviceptr, Allocation>::iterator it);

// Destroys everything owned by `ctx` (allocations, streams, events, captures on its streams):
// what the real driver does when a primary context is reset or its last retain released.
void DestroyContextResourcesLocked(State& s, CUctx_st* ctx);

// Normalized key of a stream handle: 0 and CU_STREAM_LEGACY map to CU_STREAM_LEGACY;
// CU_STREAM_PER_THREAD (or 0 through a _ptsz entry point) maps to CU_STREAM_PER_THREAD.
// Returns false for an unknown handle (CUDA_ERROR_INVALID_HANDLE).
bool StreamKey(const State& s, CUstream stream, bool per_thread, uintptr_t* key);

// Stream-capture rules of the real driver (cuThreadExchangeStreamCaptureMode docs): a
// "potentially unsafe" call (synchronous allocation/free, host synchronization) made from a
// thread whose mode is GLOBAL while any other thread captures in GLOBAL mode, or made while this
// thread itself has a non-RELAXED capture in progress, and unless this thread's mode is RELAXED,
// fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates those captures.
CUresult CheckCaptureUnsafeLocked(State& s);

// Marks the capture on `key` (if any) invalidated and returns
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; CUDA_SUCCESS if the stream is not capturing.
CUresult RejectIfCapturingLocked(State& s, uintptr_t key);

// Host-side waits (see fake_cuda_control.h, manual events). Complete, or with blocking sync
// wait for, the pending events selected; then trim stream-ordered pools to their release
// threshold, as the real pool does at synchronization points.
// `device` selects the pools to trim; it is passed in because a blocking wait releases the
// mutex, and the event or stream may be destroyed meanwhile.
void WaitEventLocked(Call& call, CUevent_st* ev, int device);
void WaitStreamLocked(Call& call, uintptr_t key, int device);
void WaitContextLocked(Call& call, CUctx_st* ctx);
void CompleteEventLocked(State& s, CUevent_st* ev);
// Work is queued on stream `key` now: records how many pending kernels it is not ordered after
// (same stream, the legacy stream's implicit synchronisation, or a cuStreamWaitEvent on the
// stream of an event recorded after the kernel), for vramscope_fake_unordered_at_last_work.
void NoteWorkLocked(Call& call, uintptr_t key);
// Stream kinds for the legacy stream's implicit synchronisation: work on the legacy stream
// follows earlier work on every blocking stream of its context (created without
// CU_STREAM_NON_BLOCKING, and the per-thread streams), and work on those follows earlier work on
// the legacy stream.
enum { kStreamLegacy = 0, kStreamBlocking = 1, kStreamNonBlocking = 2 };
// True if the pending kernel `k` must finish before `ev` (recorded after it) can complete.
bool BlocksLocked(const CUevent_st* k, const CUevent_st* ev);
// Completes every automatic event no pending kernel blocks any more.
void ResolveAutomaticLocked(State& s);
void TrimPoolLocked(State& s, CUmemPoolHandle_st* pool, size_t keep);

// Graph execs and graph pools (fake_graph.cc), arrays (fake_array.cc): everything freed (reset),
// or what a destroyed context owned (its arrays and graph execs; the device's graph pool when
// it is a primary context). Caller holds mu.
void ResetGraphsAndArraysLocked(State& s);
void DestroyContextGraphsAndArraysLocked(State& s, CUctx_st* ctx);

}  // namespace vramscope::fake

#endif  // VRAMSCOPE_TESTS_FAKES_FAKE_STATE_H_
