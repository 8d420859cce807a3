// RingWriter: see ring_writer.h for the contract and vramscope/ring.h for the protocol.
#include "vramscope/ring/ring_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

namespace vramscope::interposer {
namespace {

// Initial-exec TLS: the shim is preloaded, so the static TLS block has room and a lookup is a
// single %fs-relative load (no __tls_get_addr call on the hot path).
__attribute__((tls_model("initial-exec"))) thread_local std::uint32_t t_tid = 0;

pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;
void ResetTidInChild() { t_tid = 0; }
void RegisterAtFork() { pthread_atfork(nullptr, nullptr, ResetTidInChild); }

std::uint64_t ClockNs(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

// Atomic max: one load in the common case (no new peak), a CAS loop otherwise.
void AtomicMax(std::uint64_t* target, std::uint64_t value) {
  std::uint64_t seen = __atomic_load_n(target, __ATOMIC_RELAXED);
  while (value > seen && !__atomic_compare_exchange_n(target, &seen, value, true, __ATOMIC_RELAXED,
                                                      __ATOMIC_RELAXED)) {
  }
}

void AddAndPeak(std::uint64_t* current, std::uint64_t* peak, std::uint64_t bytes) {
  if (bytes == 0) return;
  const std::uint64_t now = __atomic_add_fetch(current, bytes, __ATOMIC_RELAXED);
  AtomicMax(peak, now);
}

// Saturating subtract: a free the writer never saw allocated must not wrap the counter.
void Subtract(std::uint64_t* current, std::uint64_t bytes) {
  if (bytes == 0) return;
  std::uint64_t seen = __atomic_load_n(current, __ATOMIC_RELAXED);
  for (;;) {
    const std::uint64_t next = seen > bytes ? seen - bytes : 0;
    if (__atomic_compare_exchange_n(current, &seen, next, true, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED)) {
      return;
    }
  }
}

// Reads a whole small file into buf (not NUL-terminated); returns bytes read, or 0.
std::size_t ReadSmallFile(const char* path, char* buf, std::size_t size) {
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  std::size_t used = 0;
  while (used < size) {
    const ssize_t n = read(fd, buf + used, size - used);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    used += static_cast<std::size_t>(n);
  }
  close(fd);
  return used;
}

// Field 22 of /proc/self/stat (start time in clock ticks since boot). The command name (field
// 2) may contain spaces and parentheses, so fields are counted after the last ')'.
std::uint64_t ProcStartTicks() {
  char buf[1024];
  const std::size_t n = ReadSmallFile("/proc/self/stat", buf, sizeof(buf) - 1);
  if (n == 0) return 0;
  buf[n] = '\0';
  const char* p = strrchr(buf, ')');
  if (p == nullptr) return 0;
  // After ')' comes field 3; skip to field 22: 19 more separators.
  int field = 2;
  for (; *p != '\0' && field < 22; ++p) {
    if (*p == ' ') ++field;
  }
  return strtoull(p, nullptr, 10);
}

void CopyTruncated(char* dst, std::size_t dst_size, const char* src) {
  if (src == nullptr) src = "";
  std::size_t n = strlen(src);
  if (n >= dst_size) n = dst_size - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
}

bool IsPowerOfTwo(std::uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Gives the file `bytes` of blocks now: on a full tmpfs a sparse file would map fine and then
// SIGBUS the application on its first write to an unbacked page. ENOSPC here means no recording
// instead. Returns 0 or the errno.
int ReserveBlocks(int fd, std::size_t bytes) {
  int reserve = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (reserve == EOPNOTSUPP || reserve == EINVAL) {
    reserve = ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
  }
  return reserve;
}

// Writes the header of a new ring mapped at `header`, the magic last: a reader that sees it
// sees the rest of the header.
void FillHeader(vramscope_ring_header* header, std::uint32_t capacity, pid_t pid, uid_t uid,
                std::uint64_t start_time_ns, std::uint64_t start_monotonic_ns, const char* mode) {
  header->version = VRAMSCOPE_RING_VERSION;
  header->header_size = VRAMSCOPE_RING_HEADER_SIZE;
  header->record_size = VRAMSCOPE_RING_RECORD_SIZE;
  header->capacity = capacity;
  header->max_devices = VRAMSCOPE_RING_MAX_DEVICES;
  header->pid = static_cast<std::uint32_t>(pid);
  header->parent_pid = static_cast<std::uint32_t>(getppid());
  header->uid = static_cast<std::uint32_t>(uid);
  header->start_time_ns = start_time_ns;
  header->start_monotonic_ns = start_monotonic_ns;
  header->proc_start_ticks = ProcStartTicks();
  CopyTruncated(header->mode, sizeof(header->mode), mode);
  if (gethostname(header->host, sizeof(header->host) - 1) != 0) header->host[0] = '\0';
  header->command_line_len = static_cast<std::uint32_t>(
      ReadSmallFile("/proc/self/cmdline", header->command_line, sizeof(header->command_line)));
  __atomic_store_n(&header->magic, VRAMSCOPE_RING_MAGIC, __ATOMIC_RELEASE);
}

}  // namespace

const char* RingErrorName(RingError error) {
  switch (error) {
    case RingError::kOk:
      return "ok";
    case RingError::kAlreadyOpen:
      return "already open";
    case RingError::kInvalidArgument:
      return "invalid argument";
    case RingError::kCannotCreate:
      return "cannot create the ring file";
    case RingError::kCannotMap:
      return "cannot map the ring file";
  }
  return "unknown";
}

std::uint64_t RingNowNs() { return ClockNs(CLOCK_MONOTONIC); }

std::uint32_t RingThreadId() {
  std::uint32_t tid = t_tid;
  if (__builtin_expect(tid == 0, 0)) {
    pthread_once(&g_atfork_once, RegisterAtFork);
    tid = static_cast<std::uint32_t>(syscall(SYS_gettid));
    t_tid = tid;
  }
  return tid;
}

RingWriter::~RingWriter() { Close(); }

RingError RingWriter::Open(const RingOpenOptions& options) {
  if (header_ != nullptr) return RingError::kAlreadyOpen;
  const std::uint32_t capacity = options.capacity;
  if (!IsPowerOfTwo(capacity) || capacity < VRAMSCOPE_RING_MIN_CAPACITY ||
      capacity > VRAMSCOPE_RING_MAX_CAPACITY) {
    return RingError::kInvalidArgument;
  }
  const char* dir = options.dir;
  if (dir == nullptr || dir[0] == '\0') return RingError::kInvalidArgument;
  // Names relative to dir_fd when the caller holds the directory open, else full paths.
  const int at = options.dir_fd >= 0 ? options.dir_fd : AT_FDCWD;

  const std::uint64_t start_time_ns = ClockNs(CLOCK_REALTIME);
  const std::uint64_t start_monotonic_ns = ClockNs(CLOCK_MONOTONIC);
  const pid_t pid = getpid();
  const uid_t uid = getuid();
  char tmp_path[sizeof(path_)];
  const int len =
      snprintf(path_, sizeof(path_), "%s/" VRAMSCOPE_RING_FILE_PREFIX "%u.%d.%llu%s", dir,
               static_cast<unsigned>(uid), static_cast<int>(pid),
               static_cast<unsigned long long>(start_time_ns), VRAMSCOPE_RING_FILE_SUFFIX);
  if (len < 0 || static_cast<std::size_t>(len) + 5 >= sizeof(path_)) {
    path_[0] = '\0';
    return RingError::kInvalidArgument;
  }
  memcpy(tmp_path, path_, static_cast<std::size_t>(len));
  memcpy(tmp_path + len, ".tmp", 5);
  // With dir_fd: the name after "<dir>/".
  const std::size_t name_at = options.dir_fd >= 0 ? strlen(dir) + 1 : 0;
  const char* const final_name = path_ + name_at;
  const char* const tmp_name = tmp_path + name_at;

  const std::size_t bytes =
      VRAMSCOPE_RING_HEADER_SIZE + static_cast<std::size_t>(capacity) * VRAMSCOPE_RING_RECORD_SIZE;
  const int fd = openat(at, tmp_name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    last_errno_ = errno;
    path_[0] = '\0';
    return RingError::kCannotCreate;
  }
  const int reserve = ReserveBlocks(fd, bytes);
  if (reserve != 0) {
    last_errno_ = reserve;
    close(fd);
    unlinkat(at, tmp_name, 0);
    path_[0] = '\0';
    return RingError::kCannotCreate;
  }
  // MAP_POPULATE: take the page faults now, not on the first lap of the hot path.
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (map == MAP_FAILED) {
    last_errno_ = errno;
    close(fd);
    unlinkat(at, tmp_name, 0);
    path_[0] = '\0';
    return RingError::kCannotMap;
  }

  auto* header = static_cast<vramscope_ring_header*>(map);
  FillHeader(header, capacity, pid, uid, start_time_ns, start_monotonic_ns, options.mode);

  if (renameat(at, tmp_name, at, final_name) != 0) {
    last_errno_ = errno;
    munmap(map, bytes);
    close(fd);
    unlinkat(at, tmp_name, 0);
    path_[0] = '\0';
    return RingError::kCannotCreate;
  }
  fd_ = fd;
  mapped_bytes_ = bytes;
  capacity_ = capacity;
  records_ = reinterpret_cast<vramscope_ring_record*>(static_cast<char*>(map) +
                                                      VRAMSCOPE_RING_HEADER_SIZE);
  __atomic_store_n(&header_, header, __ATOMIC_RELEASE);
  return RingError::kOk;
}

void RingWriter::Close() {
  vramscope_ring_header* header = __atomic_exchange_n(&header_, nullptr, __ATOMIC_ACQ_REL);
  if (header == nullptr) return;
  munmap(header, mapped_bytes_);
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  records_ = nullptr;
  capacity_ = 0;
  mapped_bytes_ = 0;
  path_[0] = '\0';
}

bool RingWriter::Claim(std::uint32_t n, std::uint64_t* position) {
  vramscope_ring_header* header = header_;
  std::uint64_t head = __atomic_load_n(&header->head, __ATOMIC_RELAXED);
  for (;;) {
    // Acquire: the reader stored tail after it finished copying the slots below it, so our
    // writes into those slots cannot overtake its reads.
    const std::uint64_t tail = __atomic_load_n(&header->tail, __ATOMIC_ACQUIRE);
    // Unsigned: a tail beyond head (a confused reader) also reads as full; drop, never overwrite.
    if (head + n - tail > capacity_) {
      __atomic_fetch_add(&header->records_dropped, 1, __ATOMIC_RELAXED);
      return false;
    }
    if (__atomic_compare_exchange_n(&header->head, &head, head + n, true, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED)) {
      *position = head;
      return true;
    }
  }
}

void RingWriter::Publish(vramscope_ring_record* slot, std::uint64_t position) {
  __atomic_store_n(&slot->seq, static_cast<std::uint32_t>(position + 1), __ATOMIC_RELEASE);
}

bool RingWriter::Write(const vramscope_ring_record& record) {
  if (header_ == nullptr) return false;
  std::uint64_t position;
  if (!Claim(1, &position)) return false;
  vramscope_ring_record* slot = Slot(position);
  static_assert(offsetof(vramscope_ring_record, seq) == 0 && sizeof(record.seq) == 4);
  memcpy(reinterpret_cast<char*>(slot) + 4, reinterpret_cast<const char*>(&record) + 4,
         sizeof(record) - 4);
  Publish(slot, position);
  return true;
}

void RingWriter::OnAlloc(std::uint32_t device, std::uint64_t requested_bytes,
                         std::uint64_t allocated_bytes) {
  if (header_ == nullptr || device >= VRAMSCOPE_RING_MAX_DEVICES) return;
  vramscope_ring_device_counters& c = header_->devices[device];
  AddAndPeak(&c.current_requested_bytes, &c.peak_requested_bytes, requested_bytes);
  AddAndPeak(&c.current_allocated_bytes, &c.peak_allocated_bytes, allocated_bytes);
  __atomic_fetch_add(&c.alloc_count, 1, __ATOMIC_RELAXED);
}

void RingWriter::OnFree(std::uint32_t device, std::uint64_t requested_bytes,
                        std::uint64_t allocated_bytes) {
  if (header_ == nullptr || device >= VRAMSCOPE_RING_MAX_DEVICES) return;
  vramscope_ring_device_counters& c = header_->devices[device];
  Subtract(&c.current_requested_bytes, requested_bytes);
  Subtract(&c.current_allocated_bytes, allocated_bytes);
  __atomic_fetch_add(&c.free_count, 1, __ATOMIC_RELAXED);
}

void RingWriter::OnReserve(std::uint32_t device, std::uint64_t bytes) {
  if (header_ == nullptr || device >= VRAMSCOPE_RING_MAX_DEVICES) return;
  vramscope_ring_device_counters& c = header_->devices[device];
  AddAndPeak(&c.current_reserved_bytes, &c.peak_reserved_bytes, bytes);
}

void RingWriter::OnRelease(std::uint32_t device, std::uint64_t bytes) {
  if (header_ == nullptr || device >= VRAMSCOPE_RING_MAX_DEVICES) return;
  Subtract(&header_->devices[device].current_reserved_bytes, bytes);
}

namespace {
vramscope_ring_record MakeRecord(std::uint8_t kind, std::uint32_t device) {
  vramscope_ring_record r;
  memset(&r, 0, sizeof(r));
  r.kind = kind;
  r.device = static_cast<std::uint8_t>(device > 255 ? 255 : device);
  r.tid = RingThreadId();
  r.time_ns = RingNowNs();
  return r;
}
}  // namespace

bool RingWriter::RecordAlloc(std::uint32_t device, std::uint64_t address,
                             std::uint64_t requested_bytes, std::uint64_t allocated_bytes,
                             std::uint8_t kind, std::uint64_t stream, std::uint32_t nvtx_range,
                             std::uint64_t site) {
  if (header_ == nullptr) return false;
  if (vramscope_ring_alloc_kind_counts_bytes(kind)) {
    // Reserve first: reserved never reads below allocated for passed-through kinds.
    if (vramscope_ring_alloc_kind_counts_reserved(kind)) OnReserve(device, allocated_bytes);
    OnAlloc(device, requested_bytes, allocated_bytes);
  } else if (device < VRAMSCOPE_RING_MAX_DEVICES) {
    __atomic_fetch_add(&header_->devices[device].alloc_count, 1, __ATOMIC_RELAXED);
  }
  vramscope_ring_record r = MakeRecord(VRAMSCOPE_RING_KIND_ALLOC, device);
  r.sub = kind;
  r.aux = nvtx_range;
  r.payload.alloc.address = address;
  r.payload.alloc.requested_bytes = requested_bytes;
  r.payload.alloc.allocated_bytes = allocated_bytes;
  r.payload.alloc.stream = stream;
  r.payload.alloc.site = site;
  return Write(r);
}

bool RingWriter::RecordFree(std::uint32_t device, std::uint64_t address,
                            std::uint64_t requested_bytes, std::uint64_t allocated_bytes,
                            std::uint8_t kind, std::uint64_t stream) {
  if (header_ == nullptr) return false;
  if (vramscope_ring_alloc_kind_counts_bytes(kind)) {
    OnFree(device, requested_bytes, allocated_bytes);
    if (vramscope_ring_alloc_kind_counts_reserved(kind)) OnRelease(device, allocated_bytes);
  } else if (device < VRAMSCOPE_RING_MAX_DEVICES) {
    __atomic_fetch_add(&header_->devices[device].free_count, 1, __ATOMIC_RELAXED);
  }
  vramscope_ring_record r = MakeRecord(VRAMSCOPE_RING_KIND_FREE, device);
  r.sub = kind;
  r.payload.free.address = address;
  r.payload.free.requested_bytes = requested_bytes;
  r.payload.free.allocated_bytes = allocated_bytes;
  r.payload.free.stream = stream;
  return Write(r);
}

bool RingWriter::RecordPoolReserve(std::uint32_t device, std::uint64_t address,
                                   std::uint64_t bytes) {
  if (header_ == nullptr) return false;
  OnReserve(device, bytes);
  vramscope_ring_record r = MakeRecord(VRAMSCOPE_RING_KIND_POOL_RESERVE, device);
  r.payload.pool.address = address;
  r.payload.pool.bytes = bytes;
  return Write(r);
}

bool RingWriter::RecordPoolRelease(std::uint32_t device, std::uint64_t address,
                                   std::uint64_t bytes) {
  if (header_ == nullptr) return false;
  OnRelease(device, bytes);
  vramscope_ring_record r = MakeRecord(VRAMSCOPE_RING_KIND_POOL_RELEASE, device);
  r.payload.pool.address = address;
  r.payload.pool.bytes = bytes;
  return Write(r);
}

bool RingWriter::RecordNvtxPush(std::uint32_t device, std::uint32_t range_id,
                                std::uint32_t parent_range_id, std::uint32_t category,
                                const char* name, std::size_t name_len, const char* domain,
                                std::size_t domain_len) {
  if (header_ == nullptr) return false;
  if (name == nullptr) name_len = 0;
  if (domain == nullptr) domain_len = 0;
  // Truncate the name first, then the domain, to the total the records can carry.
  if (name_len > VRAMSCOPE_RING_MAX_NVTX_TEXT) name_len = VRAMSCOPE_RING_MAX_NVTX_TEXT;
  if (name_len + domain_len > VRAMSCOPE_RING_MAX_NVTX_TEXT) {
    domain_len = VRAMSCOPE_RING_MAX_NVTX_TEXT - name_len;
  }
  const std::size_t total = name_len + domain_len;
  const std::uint32_t text_records =
      total <= VRAMSCOPE_RING_NVTX_INLINE_TEXT
          ? 0
          : static_cast<std::uint32_t>(
                (total - VRAMSCOPE_RING_NVTX_INLINE_TEXT + VRAMSCOPE_RING_TEXT_RECORD_BYTES - 1) /
                VRAMSCOPE_RING_TEXT_RECORD_BYTES);
  vramscope_ring_record r = MakeRecord(VRAMSCOPE_RING_KIND_NVTX_PUSH, device);
  std::uint64_t position;
  if (!Claim(1 + text_records, &position)) return false;
  r.aux = range_id;
  r.flags = static_cast<std::uint8_t>(text_records);
  r.payload.nvtx_push.parent_range_id = parent_range_id;
  r.payload.nvtx_push.category = category;
  r.payload.nvtx_push.name_len = static_cast<std::uint16_t>(name_len);
  r.payload.nvtx_push.domain_len = static_cast<std::uint16_t>(domain_len);
  // Copy byte i of the concatenation name+domain into text chunk `chunk` at `offset`.
  auto byte_at = [&](std::size_t i) { return i < name_len ? name[i] : domain[i - name_len]; };
  std::size_t i = 0;
  for (; i < total && i < VRAMSCOPE_RING_NVTX_INLINE_TEXT; ++i) {
    r.payload.nvtx_push.text[i] = byte_at(i);
  }
  vramscope_ring_record* slot = Slot(position);
  memcpy(reinterpret_cast<char*>(slot) + 4, reinterpret_cast<const char*>(&r) + 4, sizeof(r) - 4);
  Publish(slot, position);
  for (std::uint32_t k = 1; k <= text_records; ++k) {
    vramscope_ring_record t;
    memset(&t, 0, sizeof(t));
    t.kind = VRAMSCOPE_RING_KIND_TEXT;
    t.device = r.device;
    t.tid = r.tid;
    t.time_ns = r.time_ns;
    t.aux = k;
    for (std::size_t j = 0; j < VRAMSCOPE_RING_TEXT_RECORD_BYTES && i < total; ++j, ++i) {
      t.payload.text[j] = byte_at(i);
    }
    slot = Slot(position + k);
    memcpy(reinterpret_cast<char*>(slot) + 4, reinterpret_cast<const char*>(&t) + 4, sizeof(t) - 4);
    Publish(slot, position + k);
  }
  return true;
}

bool RingWriter::RecordLabels(const char* text, std::size_t length) {
  if (header_ == nullptr || length == 0 || length > VRAMSCOPE_RING_MAX_LABELS_BYTES) return false;
  const std::uint32_t chunks = static_cast<std::uint32_t>(
      (length + VRAMSCOPE_RING_TEXT_RECORD_BYTES - 1) / VRAMSCOPE_RING_TEXT_RECORD_BYTES);
  std::uint64_t position;
  if (!Claim(chunks, &position)) return false;
  vramscope_ring_record r = MakeRecord(VRAMSCOPE_RING_KIND_LABELS, 0);
  r.aux = static_cast<std::uint32_t>(length);
  r.flags = static_cast<std::uint8_t>(chunks);
  for (std::uint32_t k = 0; k < chunks; ++k) {
    r.sub = static_cast<std::uint8_t>(k);
    memset(r.payload.text, 0, sizeof(r.payload.text));
    const std::size_t offset = std::size_t{k} * VRAMSCOPE_RING_TEXT_RECORD_BYTES;
    const std::size_t n = length - offset < VRAMSCOPE_RING_TEXT_RECORD_BYTES
                              ? length - offset
                              : VRAMSCOPE_RING_TEXT_RECORD_BYTES;
    memcpy(r.payload.text, text + offset, n);
    vramscope_ring_record* slot = Slot(position + k);
    memcpy(reinterpret_cast<char*>(slot) + 4, reinterpret_cast<const char*>(&r) + 4, sizeof(r) - 4);
    Publish(slot, position + k);
  }
  return true;
}

bool RingWriter::RecordNvtxPop(std::uint32_t device, std::uint32_t range_id) {
  if (header_ == nullptr) return false;
  vramscope_ring_record r = MakeRecord(VRAMSCOPE_RING_KIND_NVTX_POP, device);
  r.aux = range_id;
  return Write(r);
}

bool RingWriter::RecordOom(std::uint32_t device, std::uint64_t requested_bytes,
                           std::uint64_t free_bytes, std::uint64_t largest_free_block_bytes,
                           std::uint8_t verdict) {
  if (header_ == nullptr) return false;
  vramscope_ring_record r = MakeRecord(VRAMSCOPE_RING_KIND_OOM, device);
  r.sub = verdict;
  r.payload.oom.requested_bytes = requested_bytes;
  r.payload.oom.free_bytes = free_bytes;
  r.payload.oom.largest_free_block_bytes = largest_free_block_bytes;
  return Write(r);
}

bool RingWriter::RecordPoolState(std::uint32_t device,
                                 const vramscope_ring_pool_state_payload& state) {
  if (header_ == nullptr) return false;
  vramscope_ring_record r = MakeRecord(VRAMSCOPE_RING_KIND_POOL_STATE, device);
  r.payload.pool_state = state;
  return Write(r);
}

bool RingWriter::RecordCuptiMemory(std::uint32_t device, std::uint8_t operation,
                                   std::uint64_t time_ns,
                                   const vramscope_ring_cupti_payload& payload) {
  if (header_ == nullptr) return false;
  vramscope_ring_record r = MakeRecord(VRAMSCOPE_RING_KIND_CUPTI_MEMORY, device);
  r.sub = operation;
  if (time_ns != 0) r.time_ns = time_ns;
  r.payload.cupti = payload;
  return Write(r);
}

void RingWriter::SetDeviceInfo(std::uint32_t device, const char* name, const std::uint8_t* uuid,
                               std::uint64_t total_memory_bytes) {
  if (header_ == nullptr || device >= VRAMSCOPE_RING_MAX_DEVICES) return;
  vramscope_ring_device_info& info = header_->device_info[device];
  info.total_memory_bytes = total_memory_bytes;
  if (uuid != nullptr) memcpy(info.uuid, uuid, sizeof(info.uuid));
  CopyTruncated(info.name, sizeof(info.name), name);
  __atomic_store_n(&info.valid, 1u, __ATOMIC_RELEASE);
}

void RingWriter::MarkExited(int exit_code) {
  if (header_ == nullptr) return;
  vramscope_ring_record r = MakeRecord(VRAMSCOPE_RING_KIND_PROCESS_EXIT, 0);
  r.aux = static_cast<std::uint32_t>(exit_code);
  (void)Write(r);
  header_->exit_code = exit_code;
  __atomic_store_n(&header_->exited, static_cast<std::uint32_t>(VRAMSCOPE_RING_EXITED),
                   __ATOMIC_RELEASE);
}

}  // namespace vramscope::interposer
