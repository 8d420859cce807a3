/* vramscope event ring, layout version 1: the shared-memory file a traced process writes and the
 * agent (or `vramscope run`) reads.
 *
 * C ABI, C11 and C++ compatible, no dependencies beyond <stddef.h> and <stdint.h>. This header is
 * the contract between the shim (writer, interposer/ring/) and the drain (reader, lib/drain/);
 * any change to an offset, size or meaning bumps VRAMSCOPE_RING_VERSION.
 *
 * File
 *   One file per process: <dir>/vramscope.<uid>.<pid>.<start_time_ns>.ring, where <dir> is
 *   $VRAMSCOPE_RING_DIR, or when that is unset VRAMSCOPE_RING_DEFAULT_DIR if it exists and is
 *   safe (vramscope/ring/ring_dir.h has the rule). The writer creates it as "<name>.tmp",
 *   initialises the header, and renames it, so a file with the final name always has a complete
 *   header. The application never unlinks it: the ring outlives a crash or SIGKILL, and the
 *   reader removes it once drained and the writer is gone.
 *
 *   [ header: VRAMSCOPE_RING_HEADER_SIZE bytes ][ capacity x VRAMSCOPE_RING_RECORD_SIZE records ]
 *
 * Protocol (many writers, one reader, no locks; the writer never blocks)
 *   Positions are 64-bit and never wrap. `head` is the next position to claim, `tail` the next
 *   position the reader will consume. A writer needing n slots loads tail (acquire) and head; if
 *   head + n - tail > capacity the ring is full and it adds 1 to `records_dropped` per logical
 *   event lost (an NVTX push with its text continuation counts 1) and returns. Otherwise it claims
 *   [head, head + n) with a compare-and-swap on head (so claimed positions never have gaps and
 *   are always free), fills slot (pos & (capacity - 1)), and publishes it by storing
 *   seq = (uint32_t)(pos + 1) with release order. The reader, at cursor c, loads the slot's seq
 *   with acquire order; it is the record for c iff seq == (uint32_t)(c + 1). After copying
 *   records it stores the new tail with release order. A claimed but never-published slot (the
 *   writer died between claim and publish) is skipped by the reader once the writer process is
 *   gone. Exactly one reader per ring: readers hold flock(LOCK_EX) on the file while draining.
 *
 *   Running counters (per device, below) are updated with atomic fetch_add and a CAS-max for
 *   peaks, independently of the records, so they stay exact when records are dropped. They use
 *   the GCC/Clang __atomic builtins on the plain fields below (naturally aligned 64-bit).
 *
 * Times: record time_ns is CLOCK_MONOTONIC in nanoseconds; start_monotonic_ns and
 * start_time_ns (CLOCK_REALTIME) were taken together at open, to map one onto the other.
 */
#ifndef VRAMSCOPE_RING_H_
#define VRAMSCOPE_RING_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define VRAMSCOPE_RING_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
extern "C" {
#else
#define VRAMSCOPE_RING_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

#define VRAMSCOPE_RING_MAGIC 0x31474e4952535256ULL /* "VRSRING1" little-endian */
#define VRAMSCOPE_RING_VERSION 1u
#define VRAMSCOPE_RING_HEADER_SIZE 4096u
#define VRAMSCOPE_RING_RECORD_SIZE 64u
#define VRAMSCOPE_RING_MAX_DEVICES 16u
/* Capacity in records: a power of two in [MIN, MAX]. The default is 4 MiB of records. */
#define VRAMSCOPE_RING_MIN_CAPACITY 64u
#define VRAMSCOPE_RING_MAX_CAPACITY (1u << 24)
#define VRAMSCOPE_RING_DEFAULT_CAPACITY (1u << 16)
#define VRAMSCOPE_RING_FILE_PREFIX "vramscope."
#define VRAMSCOPE_RING_FILE_SUFFIX ".ring"
/* Where rings go when VRAMSCOPE_RING_DIR is unset: vramscope-agent creates it (ring_dir.h). */
#define VRAMSCOPE_RING_DEFAULT_DIR "/dev/shm/vramscope"
#define VRAMSCOPE_RING_COMMAND_LINE_SIZE 1024u
/* NVTX push: name and domain share 28 inline bytes plus up to 3 TEXT records of 40 bytes. */
#define VRAMSCOPE_RING_NVTX_INLINE_TEXT 28u
#define VRAMSCOPE_RING_TEXT_RECORD_BYTES 40u
#define VRAMSCOPE_RING_MAX_TEXT_RECORDS 3u
#define VRAMSCOPE_RING_MAX_NVTX_TEXT \
  (VRAMSCOPE_RING_NVTX_INLINE_TEXT + \
   VRAMSCOPE_RING_MAX_TEXT_RECORDS * VRAMSCOPE_RING_TEXT_RECORD_BYTES)

/* Record kinds (vramscope_ring_record.kind). Values are never reused. */
enum vramscope_ring_kind {
  VRAMSCOPE_RING_KIND_INVALID = 0,
  VRAMSCOPE_RING_KIND_ALLOC = 1,         /* payload.alloc; sub = AllocationKind; aux = NVTX range */
  VRAMSCOPE_RING_KIND_FREE = 2,          /* payload.free; sub = AllocationKind */
  VRAMSCOPE_RING_KIND_POOL_RESERVE = 3,  /* payload.pool */
  VRAMSCOPE_RING_KIND_POOL_RELEASE = 4,  /* payload.pool */
  VRAMSCOPE_RING_KIND_NVTX_PUSH = 5,     /* payload.nvtx_push; aux = range id; then TEXT records */
  VRAMSCOPE_RING_KIND_NVTX_POP = 6,      /* aux = range id */
  VRAMSCOPE_RING_KIND_OOM = 7,           /* payload.oom; sub = OomVerdict */
  VRAMSCOPE_RING_KIND_POOL_STATE = 8,    /* payload.pool_state */
  VRAMSCOPE_RING_KIND_CUPTI_MEMORY = 9,  /* payload.cupti; sub = CuptiMemoryEvent.Operation */
  VRAMSCOPE_RING_KIND_PROCESS_EXIT = 10, /* aux = exit code (int32); flags bit 0 = killed */
  VRAMSCOPE_RING_KIND_TEXT = 11,         /* payload.text; aux = index (1..3) after its owner */
  VRAMSCOPE_RING_KIND_SITE = 12,         /* payload.site; see below */
  VRAMSCOPE_RING_KIND_MODULE = 13,       /* payload.module / payload.text; see below */
  VRAMSCOPE_RING_KIND_LABELS = 14,       /* payload.text; see below */
  VRAMSCOPE_RING_KIND_LIMIT = 15         /* first invalid value */
};

/* Allocation sites (VRAMSCOPE_STACKS=1). A site is the call stack of an allocation as return
 * addresses, innermost first, and ALLOC's payload.alloc.site is its id (a hash of the
 * addresses). The writer sends each site once, before the first ALLOC that names it (another
 * thread's ALLOC of the same site may come first), as ceil(frames / 4) SITE records written one
 * by one (other records may come between them): aux = frames in the site (1..64), sub = chunk
 * index, flags = chunk count, payload.site = the id and four addresses (0 past the end).
 *
 * MODULE records map addresses to loaded files, for resolution outside the process: sent
 * before the first SITE that has an address inside the module. aux = module id (1..), sub =
 * chunk index, flags = chunk count; chunk 0 is payload.module, the others payload.text (40 path
 * bytes each). The path is NUL-padded; an address A inside [start, end) is the file's virtual
 * address A - load_bias (what addr2line takes).
 *
 * Both kinds came after version 1 without changing it: a reader that does not know them skips
 * them as invalid records (counted as drops) and every other record keeps its meaning. */
/* LABELS: the run's labels, VRAMSCOPE_LABELS as the shim found it at start once it checked it
 * (text form and rules: vramscope/ring/labels.h), written once after the ring opens as
 * ceil(length / 40) consecutive records claimed together (like an NVTX push and its TEXT
 * records): aux = the text's length in bytes (1..1024), sub = chunk index, flags = chunk count,
 * payload.text = 40 bytes of the text each (NUL-padded). The reader checks the text again and
 * sends a new ProcessStart carrying the labels. Came after version 1 without changing it, like
 * SITE and MODULE. */
#define VRAMSCOPE_RING_MAX_LABELS_BYTES 1024u
#define VRAMSCOPE_RING_SITE_FRAMES_PER_RECORD 4u
#define VRAMSCOPE_RING_MAX_SITE_FRAMES 64u
#define VRAMSCOPE_RING_MODULE_INLINE_PATH 16u
#define VRAMSCOPE_RING_MAX_MODULE_CHUNKS 104u /* 16 + 103 x 40 bytes >= PATH_MAX (4096) */

/* vramscope_ring_record.sub of ALLOC and FREE: the same values as vramscope.v1.AllocationKind.
 *
 * Byte accounting (the ring counters, and the stats engine on the events):
 *   - POOLED (served by the pool) counts requested and allocated bytes; the pool's own
 *     reservations (POOL_RESERVE / POOL_RELEASE) make up reserved;
 *   - every other kind passes through to the driver, which holds the memory for the process:
 *     it counts requested, allocated AND reserved;
 *   - except HOST (pinned host memory), IPC_IMPORT (another process's memory) and IPC_EXPORT
 *     (a pooled block this process exported, already counted as POOLED), which count no device
 *     bytes at all (only alloc/free counts).
 *
 * IPC_EXPORT records are keyed 0xFFFFFFFFFFFE0000 + the export's slot in the shim's export
 * table (never a device address): ALLOC when cuIpcGetMemHandle exports a pooled block, FREE when
 * the export ends (the block freed and every importer closed), bytes = the block's requested
 * size.
 *
 * GRAPH records are one entry per device, the graph memory pool's reserved bytes
 * (cuDeviceGetGraphMemAttribute RESERVED_MEM_CURRENT), at a fixed non-pointer address
 * (0xFFFFFFFFFFFF0000 + device): a change of the figure is a FREE of the old size followed by an
 * ALLOC of the new one. ARRAY (CUDA arrays, keyed by their handle) came after version 1 without
 * changing it: a reader that does not know it skips its records as invalid (counted as drops). */
enum vramscope_ring_alloc_kind {
  VRAMSCOPE_RING_ALLOC_UNSPECIFIED = 0,
  VRAMSCOPE_RING_ALLOC_POOLED = 1,
  VRAMSCOPE_RING_ALLOC_DRIVER = 2,
  VRAMSCOPE_RING_ALLOC_STREAM_ORDERED = 3,
  VRAMSCOPE_RING_ALLOC_PITCHED = 4,
  VRAMSCOPE_RING_ALLOC_MANAGED = 5,
  VRAMSCOPE_RING_ALLOC_VMM = 6,
  VRAMSCOPE_RING_ALLOC_HOST = 7,
  VRAMSCOPE_RING_ALLOC_IPC_IMPORT = 8,
  VRAMSCOPE_RING_ALLOC_GRAPH = 9,
  VRAMSCOPE_RING_ALLOC_ARRAY = 10,
  VRAMSCOPE_RING_ALLOC_IPC_EXPORT = 11,
  VRAMSCOPE_RING_ALLOC_LIMIT = 12
};

/* The byte-accounting rule above, shared by the writer's counters and (re-stated on the proto
 * enum) the collector's stats engine. */
static inline int vramscope_ring_alloc_kind_counts_bytes(uint8_t kind) {
  return kind != VRAMSCOPE_RING_ALLOC_HOST && kind != VRAMSCOPE_RING_ALLOC_IPC_IMPORT &&
         kind != VRAMSCOPE_RING_ALLOC_IPC_EXPORT;
}
static inline int vramscope_ring_alloc_kind_counts_reserved(uint8_t kind) {
  return vramscope_ring_alloc_kind_counts_bytes(kind) && kind != VRAMSCOPE_RING_ALLOC_POOLED;
}

/* vramscope_ring_record.sub of CUPTI_MEMORY: the same values as
 * vramscope.v1.CuptiMemoryEvent.Operation. MEMORY2 records give ALLOCATION / RELEASE (address,
 * bytes, memory_kind, stream; pool_type and pool_address for stream-ordered memory);
 * MEMORY_POOL records give POOL_* (address = pool_address = the pool's base, bytes = the size
 * CUPTI reports for the operation); RECORDS_DROPPED: bytes = records CUPTI lost (its buffers were
 * full), device 0. time_ns is CUPTI's timestamp on the ring's clock. */
enum vramscope_ring_cupti_operation {
  VRAMSCOPE_RING_CUPTI_UNSPECIFIED = 0,
  VRAMSCOPE_RING_CUPTI_ALLOCATION = 1,
  VRAMSCOPE_RING_CUPTI_RELEASE = 2,
  VRAMSCOPE_RING_CUPTI_POOL_CREATED = 3,
  VRAMSCOPE_RING_CUPTI_POOL_DESTROYED = 4,
  VRAMSCOPE_RING_CUPTI_POOL_TRIMMED = 5,
  VRAMSCOPE_RING_CUPTI_RECORDS_DROPPED = 6,
  VRAMSCOPE_RING_CUPTI_LIMIT = 7
};

/* vramscope_ring_header.exited */
enum vramscope_ring_exit_state {
  VRAMSCOPE_RING_RUNNING = 0,
  VRAMSCOPE_RING_EXITED = 1, /* exit path ran (atexit / library destructor); exit_code is valid */
};

typedef struct vramscope_ring_alloc_payload {
  uint64_t address;
  uint64_t requested_bytes;
  uint64_t allocated_bytes; /* after the pool's rounding; == requested when passed through */
  uint64_t stream;          /* stream-ordered allocations, else 0 */
  uint64_t site;            /* allocation-site id, 0 = not recorded */
} vramscope_ring_alloc_payload;

typedef struct vramscope_ring_free_payload {
  uint64_t address;
  uint64_t requested_bytes;
  uint64_t allocated_bytes;
  uint64_t stream;
  uint64_t reserved0;
} vramscope_ring_free_payload;

typedef struct vramscope_ring_pool_payload {
  uint64_t address;
  uint64_t bytes;
  uint64_t reserved0[3];
} vramscope_ring_pool_payload;

typedef struct vramscope_ring_nvtx_push_payload {
  uint32_t parent_range_id;
  uint32_t category;
  uint16_t name_len;   /* bytes of name (no NUL) */
  uint16_t domain_len; /* bytes of domain (no NUL); empty = default domain */
  /* name then domain, concatenated; continues in `text_records` TEXT records when longer. */
  char text[VRAMSCOPE_RING_NVTX_INLINE_TEXT];
} vramscope_ring_nvtx_push_payload;

typedef struct vramscope_ring_oom_payload {
  uint64_t requested_bytes;
  uint64_t free_bytes;
  uint64_t largest_free_block_bytes;
  uint64_t reserved0[2];
} vramscope_ring_oom_payload;

/* PoolStateEvent without allocated_bytes, which the reader takes from its running total. */
typedef struct vramscope_ring_pool_state_payload {
  uint64_t largest_free_block_bytes;
  uint64_t free_bytes;
  uint64_t pending_bytes;
  uint64_t unreleasable_free_bytes;
  uint64_t reserved_bytes;
} vramscope_ring_pool_state_payload;

typedef struct vramscope_ring_site_payload {
  uint64_t site;
  uint64_t frames[VRAMSCOPE_RING_SITE_FRAMES_PER_RECORD];
} vramscope_ring_site_payload;

typedef struct vramscope_ring_module_payload {
  uint64_t load_bias;
  uint64_t start;
  uint64_t end;
  char path[VRAMSCOPE_RING_MODULE_INLINE_PATH];
} vramscope_ring_module_payload;

typedef struct vramscope_ring_cupti_payload {
  uint64_t address;
  uint64_t bytes;
  uint64_t pool_address;
  uint64_t stream;
  uint32_t memory_kind;
  uint32_t pool_type;
} vramscope_ring_cupti_payload;

/* One event; 64 bytes, one cache line. */
typedef struct vramscope_ring_record {
  uint32_t seq;     /*  0: (uint32_t)(position + 1) once published; stored last (release) */
  uint32_t tid;     /*  4: OS thread id */
  uint64_t time_ns; /*  8: CLOCK_MONOTONIC */
  uint8_t kind;     /* 16: vramscope_ring_kind */
  uint8_t device;   /* 17: CUDA device ordinal */
  uint8_t sub;      /* 18: kind-specific enum (see vramscope_ring_kind) */
  uint8_t flags;    /* 19: kind-specific; NVTX_PUSH: number of TEXT records that follow */
  uint32_t aux;     /* 20: kind-specific 32-bit value */
  union {           /* 24 */
    vramscope_ring_alloc_payload alloc;
    vramscope_ring_free_payload free;
    vramscope_ring_pool_payload pool;
    vramscope_ring_nvtx_push_payload nvtx_push;
    vramscope_ring_oom_payload oom;
    vramscope_ring_pool_state_payload pool_state;
    vramscope_ring_cupti_payload cupti;
    vramscope_ring_site_payload site;
    vramscope_ring_module_payload module;
    char text[VRAMSCOPE_RING_TEXT_RECORD_BYTES];
    uint64_t words[5];
  } payload;
} vramscope_ring_record;

/* Exact running counters of one device; 64 bytes. Bytes are current/peak since the process
 * started; peaks are each exact on their own (not taken at the same instant). */
typedef struct vramscope_ring_device_counters {
  uint64_t current_requested_bytes;
  uint64_t peak_requested_bytes;
  uint64_t current_allocated_bytes;
  uint64_t peak_allocated_bytes;
  uint64_t current_reserved_bytes;
  uint64_t peak_reserved_bytes;
  uint64_t alloc_count;
  uint64_t free_count;
} vramscope_ring_device_counters;

/* What the shim learned about a device (cuDeviceGetName, cuDeviceGetUuid, cuDeviceTotalMem). */
typedef struct vramscope_ring_device_info {
  uint64_t total_memory_bytes;
  uint32_t valid; /* 1 once filled in (stored last, release) */
  uint32_t reserved0;
  uint8_t uuid[16];
  char name[64]; /* NUL-terminated */
} vramscope_ring_device_info;

typedef struct vramscope_ring_header {
  /* --- identity, written once before the rename ------------------------------------------ */
  uint64_t magic;              /*    0: VRAMSCOPE_RING_MAGIC */
  uint32_t version;            /*    8: VRAMSCOPE_RING_VERSION */
  uint32_t header_size;        /*   12: VRAMSCOPE_RING_HEADER_SIZE */
  uint32_t record_size;        /*   16: VRAMSCOPE_RING_RECORD_SIZE */
  uint32_t capacity;           /*   20: records, power of two */
  uint32_t max_devices;        /*   24: VRAMSCOPE_RING_MAX_DEVICES */
  uint32_t pid;                /*   28 */
  uint32_t parent_pid;         /*   32 */
  uint32_t uid;                /*   36 */
  uint64_t start_time_ns;      /*   40: CLOCK_REALTIME at open, ns since the Unix epoch */
  uint64_t start_monotonic_ns; /*   48: CLOCK_MONOTONIC at open */
  uint64_t proc_start_ticks;   /*   56: /proc/self/stat field 22 (pid-reuse check), 0 unknown */
  /* --- lifecycle -------------------------------------------------------------------------- */
  uint32_t exited;           /*   64: vramscope_ring_exit_state (atomic) */
  int32_t exit_code;         /*   68: valid when exited (written before exited, release) */
  uint32_t flags;            /*   72: reserved, 0 */
  uint32_t command_line_len; /*   76: bytes used in command_line */
  char mode[16];             /*   80: VRAMSCOPE_MODE: "pool", "passthrough", "strict" */
  char host[64];             /*   96: gethostname, NUL-terminated */
  uint8_t reserved1[96];     /*  160 */
  /* --- ring indices, each on its own cache line ------------------------------------------- */
  uint64_t head;            /*  256: next position to claim (writers, CAS) */
  uint8_t pad_head[56];     /*  264 */
  uint64_t tail;            /*  320: next position the reader consumes (reader, release) */
  uint8_t pad_tail[56];     /*  328 */
  uint64_t records_dropped; /*  384: events lost because the ring was full (writers, atomic) */
  uint8_t pad_dropped[120]; /*  392 */
  /* --- per device ------------------------------------------------------------------------- */
  vramscope_ring_device_counters devices[VRAMSCOPE_RING_MAX_DEVICES]; /*  512 */
  vramscope_ring_device_info device_info[VRAMSCOPE_RING_MAX_DEVICES]; /* 1536 */
  /* argv, each argument NUL-terminated, truncated to fit */
  char command_line[VRAMSCOPE_RING_COMMAND_LINE_SIZE]; /* 3072 */
} vramscope_ring_header;

VRAMSCOPE_RING_STATIC_ASSERT(sizeof(vramscope_ring_record) == VRAMSCOPE_RING_RECORD_SIZE,
                             "ring record must be 64 bytes");
VRAMSCOPE_RING_STATIC_ASSERT(sizeof(vramscope_ring_device_counters) == 64,
                             "device counters must be 64 bytes");
VRAMSCOPE_RING_STATIC_ASSERT(sizeof(vramscope_ring_device_info) == 96,
                             "device info must be 96 bytes");
VRAMSCOPE_RING_STATIC_ASSERT(sizeof(vramscope_ring_header) == VRAMSCOPE_RING_HEADER_SIZE,
                             "ring header must be 4096 bytes");
VRAMSCOPE_RING_STATIC_ASSERT(sizeof(vramscope_ring_nvtx_push_payload) == 40,
                             "nvtx payload must be 40 bytes");
VRAMSCOPE_RING_STATIC_ASSERT(offsetof(vramscope_ring_record, payload) == 24,
                             "record payload at 24");
VRAMSCOPE_RING_STATIC_ASSERT(offsetof(vramscope_ring_header, exited) == 64, "exited at 64");
VRAMSCOPE_RING_STATIC_ASSERT(offsetof(vramscope_ring_header, head) == 256, "head at 256");
VRAMSCOPE_RING_STATIC_ASSERT(offsetof(vramscope_ring_header, tail) == 320, "tail at 320");
VRAMSCOPE_RING_STATIC_ASSERT(offsetof(vramscope_ring_header, records_dropped) == 384,
                             "records_dropped at 384");
VRAMSCOPE_RING_STATIC_ASSERT(offsetof(vramscope_ring_header, devices) == 512, "devices at 512");
VRAMSCOPE_RING_STATIC_ASSERT(offsetof(vramscope_ring_header, device_info) == 1536,
                             "device_info at 1536");
VRAMSCOPE_RING_STATIC_ASSERT(offsetof(vramscope_ring_header, command_line) == 3072,
                             "command_line at 3072");

#ifdef __cplusplus
}  // extern "C"
#endif

#endif /* VRAMSCOPE_RING_H_ */
