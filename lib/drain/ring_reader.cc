// RingReader: see ring_reader.h. The protocol it relies on is written in vramscope/ring.h:
// a slot at position c holds c's record iff its seq == (uint32_t)(c + 1) (acquire), positions
// below head were all claimed, and the reader hands slots back by storing tail (release).
// Every touch of a file ring's mapping runs inside a RingFaultScope (ring_fault.h): the file can
// be truncated by its owner at any moment.
#include "drain/ring_reader.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_split.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <string_view>
#include <utility>

#include "drain/ring_decoder.h"
#include "drain/ring_labels.h"
#include "vramscope/utf8.h"

namespace vramscope::agent {
namespace {

template <typename T>
T Load(const T* p, int order = __ATOMIC_ACQUIRE) {
  return __atomic_load_n(p, order);
}

// The name and domain of the NVTX push `record`, published at `position` (head: the ring's head
// as last read): inline, then in the TEXT records after it, whose count sets *consumed.
RecordRead ReadNvtxText(const vramscope_ring_record* records, std::uint64_t capacity,
                        std::uint64_t position, std::uint64_t head,
                        const vramscope_ring_record& record, std::string* text,
                        std::uint64_t* consumed) {
  auto slot = [&](std::uint64_t at) -> const vramscope_ring_record& {
    return records[at & (capacity - 1)];
  };
  const std::uint32_t n = record.flags;
  const vramscope_ring_nvtx_push_payload& p = record.payload.nvtx_push;
  const std::size_t total = std::size_t{p.name_len} + p.domain_len;
  if (n > VRAMSCOPE_RING_MAX_TEXT_RECORDS || total > VRAMSCOPE_RING_MAX_NVTX_TEXT ||
      (n == 0 && total > VRAMSCOPE_RING_NVTX_INLINE_TEXT) || n > head - position - 1) {
    // The push and its text were claimed by one CAS, so a head we saw beyond the push is
    // beyond its text too: text past head means a corrupt record.
    return RecordRead::kInvalid;
  }
  for (std::uint32_t k = 1; k <= n; ++k) {
    if (Load(&slot(position + k).seq) != static_cast<std::uint32_t>(position + k + 1)) {
      return RecordRead::kIncomplete;
    }
  }
  bool valid = true;
  text->append(p.text, std::min<std::size_t>(total, VRAMSCOPE_RING_NVTX_INLINE_TEXT));
  for (std::uint32_t k = 1; k <= n; ++k) {
    const vramscope_ring_record& t = slot(position + k);
    const std::size_t want =
        std::min<std::size_t>(total - text->size(), VRAMSCOPE_RING_TEXT_RECORD_BYTES);
    if (Load(&t.kind, __ATOMIC_RELAXED) != VRAMSCOPE_RING_KIND_TEXT) valid = false;
    text->append(t.payload.text, want);
  }
  if (text->size() != total) valid = false;
  *consumed += n;
  return valid ? RecordRead::kTaken : RecordRead::kInvalid;
}

// The clock of Event.time_ns (RingInfo::start_monotonic_ns).
std::uint64_t MonotonicNowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

std::string BoundedString(const char* data, std::size_t size) {
  return std::string(data, strnlen(data, size));
}

bool ReadFile(const std::string& path, std::string* out) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out->append(buf, static_cast<std::size_t>(n));
  }
  close(fd);
  return true;
}

// /proc/PID/stat: the fields after the command name, which may hold spaces and parentheses
// (state is field 3, start time field 22). False when it is not in that form.
bool ParseStat(const std::string& stat, bool* zombie, std::uint64_t* start_ticks) {
  const std::size_t close = stat.rfind(')');
  if (close == std::string::npos) return false;
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(stat).substr(close + 1), ' ', absl::SkipEmpty());
  if (fields.empty()) return false;
  *zombie = fields[0] == "Z" || fields[0] == "X" || fields[0] == "x";
  *start_ticks = 0;
  if (fields.size() > 19 && !absl::SimpleAtoi(fields[19], start_ticks)) *start_ticks = 0;
  return true;
}

}  // namespace

// Where a Drain appends: one implementation fills a RepeatedPtrField of messages, the other
// writes wire bytes (EncodedEvents). A virtual call per record: far below the cost of either.
class DrainSink {
 public:
  virtual ~DrainSink() = default;
  virtual int size() const = 0;
  // `record` decoded (DecodeRecord's rules); false, appending nothing, when it does not decode.
  virtual bool AddRecord(const vramscope_ring_record& record, std::string_view text) = 0;
  virtual void AddEvent(v1::Event&& event) = 0;
  // Drops everything appended since the sink was made (a fault: those events read zero pages).
  virtual void Rollback() = 0;
};

namespace {

class MessageSink final : public DrainSink {
 public:
  explicit MessageSink(google::protobuf::RepeatedPtrField<v1::Event>* out)
      : out_(out), begin_(out->size()) {}
  int size() const override { return out_->size(); }
  bool AddRecord(const vramscope_ring_record& record, std::string_view text) override {
    if (DecodeRecord(record, text, out_->Add()).ok()) return true;
    out_->RemoveLast();
    return false;
  }
  void AddEvent(v1::Event&& event) override { *out_->Add() = std::move(event); }
  void Rollback() override { out_->DeleteSubrange(begin_, out_->size() - begin_); }

 private:
  google::protobuf::RepeatedPtrField<v1::Event>* out_;
  int begin_;
};

class BytesSink final : public DrainSink {
 public:
  explicit BytesSink(EncodedEvents* out) : out_(out), begin_(out->mark()) {}
  int size() const override { return out_->size(); }
  bool AddRecord(const vramscope_ring_record& record, std::string_view text) override {
    return out_->AddRecord(record, text).ok();
  }
  void AddEvent(v1::Event&& event) override { out_->AddEvent(event); }
  void Rollback() override { out_->Truncate(begin_); }

 private:
  EncodedEvents* out_;
  EncodedEvents::Mark begin_;
};

}  // namespace

bool WriterProcessAlive(const RingInfo& info) {
  if (info.pid == 0) return false;
  std::string stat;
  if (!ReadFile(absl::StrCat("/proc/", info.pid, "/stat"), &stat)) {
    struct stat proc;
    if (::stat("/proc/self", &proc) == 0) return false;  // /proc works: the pid is gone
    return kill(static_cast<pid_t>(info.pid), 0) == 0 || errno == EPERM;
  }
  bool zombie = false;
  std::uint64_t ticks = 0;
  if (!ParseStat(stat, &zombie, &ticks)) return true;
  if (zombie) return false;
  if (info.proc_start_ticks != 0 && ticks != 0 && ticks != info.proc_start_ticks) {
    return false;  // the pid was reused
  }
  return true;
}

std::optional<ProcessOwner> LookupProcessOwner(std::uint32_t pid) {
  if (pid == 0) return std::nullopt;
  std::string stat;
  std::string status;
  if (!ReadFile(absl::StrCat("/proc/", pid, "/stat"), &stat) ||
      !ReadFile(absl::StrCat("/proc/", pid, "/status"), &status)) {
    return std::nullopt;
  }
  ProcessOwner owner;
  bool zombie = false;
  if (!ParseStat(stat, &zombie, &owner.start_ticks) || zombie) return std::nullopt;
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    if (!absl::ConsumePrefix(&line, "Uid:")) continue;
    for (absl::string_view field :
         absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty())) {
      std::uint32_t uid = 0;
      if (absl::SimpleAtoi(field, &uid)) owner.uids.push_back(uid);
    }
    break;
  }
  if (owner.uids.empty()) return std::nullopt;  // not a process status we can read
  return owner;
}

v1::ProcessIdentity CheckProcessIdentity(
    const RingInfo& info, std::uint32_t file_uid,
    const std::function<std::optional<ProcessOwner>(std::uint32_t)>& lookup) {
  if (info.pid == 0) return v1::PROCESS_IDENTITY_MISMATCH;  // no process has pid 0
  const std::optional<ProcessOwner> owner = lookup(info.pid);
  if (!owner) return v1::PROCESS_IDENTITY_UNVERIFIABLE;
  if (info.proc_start_ticks != 0 && owner->start_ticks != 0 &&
      owner->start_ticks != info.proc_start_ticks) {
    // Another process has the pid now (the writer ended and the pid was reused), or the header
    // made both up: either way this process says nothing about the ring.
    return v1::PROCESS_IDENTITY_UNVERIFIABLE;
  }
  // Any of its uids: a set-uid program's ring file belongs to its effective uid, its header
  // names the real one.
  for (std::uint32_t uid : owner->uids) {
    if (uid == file_uid) return v1::PROCESS_IDENTITY_VERIFIED;
  }
  return v1::PROCESS_IDENTITY_MISMATCH;
}

const std::string& LocalHostName() {
  static const std::string* host = [] {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) != 0) name[0] = '\0';
    return new std::string(name);
  }();
  return *host;
}

RingReader::RingReader(void* base, std::size_t size, int fd, std::string path, Options options)
    : base_(base),
      size_(size),
      fd_(fd),
      path_(std::move(path)),
      options_(std::move(options)),
      header_(static_cast<vramscope_ring_header*>(base)),
      records_(reinterpret_cast<vramscope_ring_record*>(static_cast<char*>(base) +
                                                        VRAMSCOPE_RING_HEADER_SIZE)) {}

RingReader::~RingReader() {
  if (fd_ >= 0) {
    munmap(base_, size_);
    close(fd_);  // also drops the flock
  }
}

absl::StatusOr<std::unique_ptr<RingReader>> RingReader::OpenFile(const std::string& path,
                                                                 Options options) {
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    const int err = errno;
    return absl::Status(
        err == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kPermissionDenied,
        absl::StrCat("cannot open ring ", path, ": ", strerror(err)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "ring ", path, " is being drained by another reader (flock: ", strerror(err), ")"));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("ring ", path, " is not a regular file"));
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  constexpr std::size_t kMaxSize =
      VRAMSCOPE_RING_HEADER_SIZE +
      std::size_t{VRAMSCOPE_RING_MAX_CAPACITY} * VRAMSCOPE_RING_RECORD_SIZE;
  if (size < VRAMSCOPE_RING_HEADER_SIZE || size > kMaxSize) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrFormat("ring %s has %d bytes: not a vramscope ring (header %d bytes, at most %d)",
                        path, size, VRAMSCOPE_RING_HEADER_SIZE, kMaxSize));
  }
  void* map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("cannot map ring ", path, ": ", strerror(err)));
  }
  InstallRingFaultHandler();
  std::unique_ptr<RingReader> reader(new RingReader(map, size, fd, path, std::move(options)));
  {
    RingFaultScope scope(map, size);
    const absl::Status status = reader->Validate();
    if (scope.faulted()) {
      reader->NoteFault(scope);
      return reader->DamageStatus();
    }
    if (!status.ok()) return status;
  }
  // The identity fields the header claims are replaced by what can be checked (header comment).
  RingInfo& info = reader->info_;
  info.uid = static_cast<std::uint32_t>(st.st_uid);
  info.host = reader->options_.host.empty() ? LocalHostName() : reader->options_.host;
  info.identity = CheckProcessIdentity(
      info, info.uid,
      reader->options_.lookup_process ? reader->options_.lookup_process : LookupProcessOwner);
  return reader;
}

absl::StatusOr<std::unique_ptr<RingReader>> RingReader::OpenMemory(void* data, std::size_t size,
                                                                   Options options) {
  if (data == nullptr || reinterpret_cast<std::uintptr_t>(data) % 8 != 0) {
    return absl::InvalidArgumentError("ring memory must be non-null and 8-byte aligned");
  }
  if (size < VRAMSCOPE_RING_HEADER_SIZE) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ring region has %d bytes, less than the %d-byte header", size,
                        VRAMSCOPE_RING_HEADER_SIZE));
  }
  std::unique_ptr<RingReader> reader(
      new RingReader(data, size, -1, "<memory>", std::move(options)));
  if (absl::Status status = reader->Validate(); !status.ok()) return status;
  return reader;
}

absl::Status RingReader::Validate() {
  const vramscope_ring_header& h = *header_;
  const std::uint64_t magic = Load(&h.magic);
  if (magic == 0) {
    return absl::UnavailableError(absl::StrCat("ring ", path_, " is not initialised yet"));
  }
  if (magic != VRAMSCOPE_RING_MAGIC) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: bad magic 0x%016x, not a vramscope ring", path_, magic));
  }
  if (h.version != VRAMSCOPE_RING_VERSION) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: ring layout version %d, this reader knows version %d", path_,
                        h.version, VRAMSCOPE_RING_VERSION));
  }
  if (h.header_size != VRAMSCOPE_RING_HEADER_SIZE || h.record_size != VRAMSCOPE_RING_RECORD_SIZE ||
      h.max_devices != VRAMSCOPE_RING_MAX_DEVICES) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: header size %d, record size %d, max devices %d (expected %d, %d, %d)", path_,
        h.header_size, h.record_size, h.max_devices, VRAMSCOPE_RING_HEADER_SIZE,
        VRAMSCOPE_RING_RECORD_SIZE, VRAMSCOPE_RING_MAX_DEVICES));
  }
  const std::uint32_t capacity = h.capacity;
  if (capacity < VRAMSCOPE_RING_MIN_CAPACITY || capacity > VRAMSCOPE_RING_MAX_CAPACITY ||
      (capacity & (capacity - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: capacity %d is not a power of two in [%d, %d]", path_, capacity,
                        VRAMSCOPE_RING_MIN_CAPACITY, VRAMSCOPE_RING_MAX_CAPACITY));
  }
  const std::size_t expected =
      VRAMSCOPE_RING_HEADER_SIZE + std::size_t{capacity} * VRAMSCOPE_RING_RECORD_SIZE;
  if (size_ != expected) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d bytes, but a ring of %d records has %d", path_, size_, capacity, expected));
  }
  const std::uint64_t tail = Load(&h.tail);
  const std::uint64_t head = Load(&h.head);
  if (tail > head || head - tail > capacity) {
    return absl::DataLossError(absl::StrFormat("%s: corrupt indices head %d, tail %d, capacity %d",
                                               path_, head, tail, capacity));
  }
  info_.pid = h.pid;
  info_.parent_pid = h.parent_pid;
  info_.uid = h.uid;
  info_.header_uid = h.uid;
  info_.capacity = capacity;
  info_.start_time_ns = h.start_time_ns;
  info_.start_monotonic_ns = h.start_monotonic_ns;
  info_.proc_start_ticks = h.proc_start_ticks;
  info_.host = BoundedString(h.host, sizeof(h.host));
  info_.header_host = info_.host;
  info_.mode = BoundedString(h.mode, sizeof(h.mode));
  const std::size_t cmd_len = std::min<std::size_t>(h.command_line_len, sizeof(h.command_line));
  std::string_view cmd(h.command_line, cmd_len);
  while (!cmd.empty()) {
    const std::size_t end = cmd.find('\0');
    info_.command_line.emplace_back(cmd.substr(0, end));
    if (end == std::string_view::npos) break;
    cmd.remove_prefix(end + 1);
  }
  cursor_ = tail;
  // Drops from before this reader (a previous reader's time) are reported on the first Drain.
  dropped_seen_ = 0;
  last_time_ns_ = info_.start_monotonic_ns;
  return absl::OkStatus();
}

void RingReader::NoteFault(const RingFaultScope& scope) const {
  if (damaged_) return;
  damaged_ = true;
  fault_offset_ = scope.fault_offset();
}

absl::Status RingReader::DamageStatus() const {
  if (!damaged_) return absl::OkStatus();
  return absl::DataLossError(absl::StrFormat(
      "ring %s was truncated by another process while being read (bus error at offset %d of its "
      "%d bytes): its records cannot be trusted, the ring must be closed",
      path_, fault_offset_, size_));
}

std::uint64_t RingReader::head() const {
  if (damaged_) return cursor_;
  RingFaultScope scope(guarded_base(), size_);
  const std::uint64_t head = Load(&header_->head);
  if (scope.faulted()) {
    NoteFault(scope);
    return cursor_;
  }
  return head;
}

void RingReader::CommitTail() {
  if (damaged_) return;
  RingFaultScope scope(guarded_base(), size_);
  __atomic_store_n(&header_->tail, cursor_, __ATOMIC_RELEASE);
  if (scope.faulted()) NoteFault(scope);
}

bool RingReader::WriterAlive() {
  if (options_.writer_alive) return options_.writer_alive(info_);
  return WriterProcessAlive(info_);
}

v1::ProcessKey RingReader::process_key() const {
  v1::ProcessKey key;
  key.set_host(ToValidUtf8(info_.host));  // the header's bytes, made fit for a proto string
  key.set_pid(info_.pid);
  key.set_start_time_ns(info_.start_time_ns);
  return key;
}

bool RingReader::WriterExited() const {
  if (damaged_) return false;
  RingFaultScope scope(guarded_base(), size_);
  const bool exited = Load(&header_->exited) == VRAMSCOPE_RING_EXITED;
  if (scope.faulted()) {
    NoteFault(scope);
    return false;
  }
  return exited;
}

int RingReader::ExitCode() const {
  if (damaged_) return 0;
  RingFaultScope scope(guarded_base(), size_);
  const int code = Load(&header_->exit_code);
  if (scope.faulted()) {
    NoteFault(scope);
    return 0;
  }
  return code;
}

std::vector<v1::DeviceCounters> RingReader::Counters() const {
  std::vector<v1::DeviceCounters> counters;
  if (damaged_) return counters;
  RingFaultScope scope(guarded_base(), size_);
  const std::uint64_t written = Load(&header_->head, __ATOMIC_RELAXED);
  const std::uint64_t dropped = Load(&header_->records_dropped, __ATOMIC_RELAXED);
  for (std::uint32_t d = 0; d < VRAMSCOPE_RING_MAX_DEVICES; ++d) {
    const vramscope_ring_device_counters& c = header_->devices[d];
    v1::DeviceCounters out;
    out.set_device(d);
    out.set_current_requested_bytes(Load(&c.current_requested_bytes, __ATOMIC_RELAXED));
    out.set_peak_requested_bytes(Load(&c.peak_requested_bytes, __ATOMIC_RELAXED));
    out.set_current_allocated_bytes(Load(&c.current_allocated_bytes, __ATOMIC_RELAXED));
    out.set_peak_allocated_bytes(Load(&c.peak_allocated_bytes, __ATOMIC_RELAXED));
    out.set_current_reserved_bytes(Load(&c.current_reserved_bytes, __ATOMIC_RELAXED));
    out.set_peak_reserved_bytes(Load(&c.peak_reserved_bytes, __ATOMIC_RELAXED));
    const bool used = out.peak_requested_bytes() != 0 || out.peak_allocated_bytes() != 0 ||
                      out.peak_reserved_bytes() != 0 ||
                      Load(&c.alloc_count, __ATOMIC_RELAXED) != 0 ||
                      Load(&header_->device_info[d].valid) != 0;
    if (!used) continue;
    out.set_records_written(written);
    out.set_records_dropped(dropped);
    counters.push_back(std::move(out));
  }
  if (scope.faulted()) {
    NoteFault(scope);
    counters.clear();
  }
  return counters;
}

void RingReader::AppendProcessStart(DrainSink& out) {
  v1::Event built;
  v1::Event* event = &built;
  event->set_time_ns(info_.start_monotonic_ns);
  v1::ProcessStartEvent* start = event->mutable_process_start();
  start->set_pid(info_.pid);
  // Everything here is the application's (or a hostile writer's) bytes: strings that are not
  // UTF-8 are escaped (vramscope/utf8.h), and the exact arguments travel beside them.
  start->set_host(ToValidUtf8(info_.host));
  bool raw_needed = false;
  for (const std::string& arg : info_.command_line) {
    start->add_command_line(ToValidUtf8(arg));
    raw_needed = raw_needed || !IsValidUtf8(arg);
  }
  if (raw_needed) {
    for (const std::string& arg : info_.command_line) start->add_raw_command_line(arg);
  }
  start->set_mode(ToValidUtf8(info_.mode));
  start->set_parent_pid(info_.parent_pid);
  start->set_uid(info_.uid);
  start->set_identity(info_.identity);
  for (const auto& [key, value] : labels_) (*start->mutable_labels())[key] = value;
  for (std::uint32_t d = 0; d < VRAMSCOPE_RING_MAX_DEVICES; ++d) {
    const vramscope_ring_device_info& info = header_->device_info[d];
    if (Load(&info.valid) != 1) continue;
    v1::DeviceInfo* device = start->add_devices();
    device->set_ordinal(d);
    device->set_name(ToValidUtf8(BoundedString(info.name, sizeof(info.name))));
    device->set_total_memory_bytes(info.total_memory_bytes);
    const std::uint8_t* u = info.uuid;
    device->set_uuid(absl::StrFormat(
        "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
        u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]));
  }
  out.AddEvent(std::move(built));
}

absl::StatusOr<DrainStats> RingReader::Drain(google::protobuf::RepeatedPtrField<v1::Event>* out,
                                             std::size_t max_records) {
  MessageSink sink(out);
  return DrainInto(sink, max_records);
}

absl::StatusOr<DrainStats> RingReader::Drain(EncodedEvents* out, std::size_t max_records) {
  BytesSink sink(out);
  return DrainInto(sink, max_records);
}

absl::StatusOr<DrainStats> RingReader::DrainInto(DrainSink& out, std::size_t max_records) {
  if (damaged_) return DamageStatus();
  RingFaultScope scope(guarded_base(), size_);
  absl::StatusOr<DrainStats> stats = DrainMapped(out, max_records, scope);
  if (scope.faulted()) {
    // Whatever was read after the fault came from zero pages: none of this call's events count.
    NoteFault(scope);
    out.Rollback();
    finished_ = false;
    return DamageStatus();
  }
  return stats;
}

absl::StatusOr<DrainStats> RingReader::DrainMapped(DrainSink& out, std::size_t max_records,
                                                   const RingFaultScope& scope) {
  DrainStats stats;
  if (finished_) {
    stats.finished = true;
    return stats;
  }
  const int events_before = out.size();
  DescribeNewDevices(out);
  // Read the drop counter before the records: drops counted by now happened while the records
  // still in the ring filled it, so they belong after those records.
  const std::uint64_t dropped_now = Load(&header_->records_dropped, __ATOMIC_RELAXED);
  std::uint64_t lost = 0;  // slots skipped here: invalid or never published by a dead writer
  const std::uint64_t capacity = info_.capacity;
  std::uint64_t head = Load(&header_->head);
  if (head < cursor_ || head - cursor_ > capacity) {
    return absl::DataLossError(absl::StrFormat("%s: corrupt ring head %d (cursor %d, capacity %d)",
                                               path_, head, cursor_, capacity));
  }
  int alive = -1;  // unknown until a stuck slot or the end needs it
  auto writer_alive = [&] {
    if (alive < 0) alive = WriterAlive() ? 1 : 0;
    return alive == 1;
  };
  auto slot = [&](std::uint64_t position) -> const vramscope_ring_record& {
    return records_[position & (capacity - 1)];
  };
  auto published = [&](std::uint64_t position) {
    return Load(&slot(position).seq) == static_cast<std::uint32_t>(position + 1);
  };

  std::string text;
  for (;;) {
    if (scope.faulted()) break;  // the rest reads zero pages; Drain reports the damage
    if (cursor_ == head) {
      // Catch up with writers that claimed slots while we read.
      head = Load(&header_->head);
      if (head < cursor_ || head - cursor_ > capacity) {
        return absl::DataLossError(
            absl::StrFormat("%s: corrupt ring head %d (cursor %d)", path_, head, cursor_));
      }
      if (cursor_ == head) break;
    }
    if (stats.records >= max_records) break;
    if (!published(cursor_)) {
      if (writer_alive()) break;  // a writer is between claim and publish: wait for it
      ++cursor_;                  // it died there: that slot is lost
      ++stats.records;
      ++lost;
      continue;
    }
    vramscope_ring_record record;
    memcpy(&record, &slot(cursor_), sizeof(record));
    std::uint64_t consumed = 1;
    const RecordRead read = TakeRecord(record, head, &text, out, &consumed);
    if (read == RecordRead::kIncomplete && writer_alive()) break;  // still being written
    const bool valid = read == RecordRead::kTaken;
    if (!valid) {
      ++stats.invalid;
      ++lost;
    }
    cursor_ += consumed;
    stats.records += consumed;
  }
  // Hand the slots back to the writers, after every copy above.
  if (options_.commit_in_drain) CommitTail();

  AppendDropsAndEnd(out, dropped_now, lost, &alive, &stats);
  stats.events = static_cast<std::uint64_t>(out.size() - events_before);
  return stats;
}

void RingReader::DescribeNewDevices(DrainSink& out) {
  std::uint32_t devices_known = 0;
  for (std::uint32_t d = 0; d < VRAMSCOPE_RING_MAX_DEVICES; ++d) {
    if (Load(&header_->device_info[d].valid) == 1) devices_known |= 1u << d;
  }
  if (!started_ || devices_known != devices_described_) {
    AppendProcessStart(out);
    started_ = true;
    devices_described_ = devices_known;
  }
}

RecordRead RingReader::TakeRecord(const vramscope_ring_record& record, std::uint64_t head,
                                  std::string* text, DrainSink& out, std::uint64_t* consumed) {
  text->clear();
  if (record.kind == VRAMSCOPE_RING_KIND_NVTX_PUSH) {
    const RecordRead read =
        ReadNvtxText(records_, info_.capacity, cursor_, head, record, text, consumed);
    if (read != RecordRead::kTaken) return read;
  }
  if (record.kind == VRAMSCOPE_RING_KIND_LABELS) {
    const LabelsRead read =
        ReadLabelsRecords(records_, info_.capacity, cursor_, head - cursor_, &labels_, consumed);
    if (read == LabelsRead::kIncomplete) return RecordRead::kIncomplete;
    if (read != LabelsRead::kTaken) return RecordRead::kInvalid;
    AppendProcessStart(out);  // consumers keep the latest ProcessStart
    return RecordRead::kTaken;
  }
  if (record.kind == VRAMSCOPE_RING_KIND_MODULE) {
    return sites_.AddModule(record).ok() ? RecordRead::kTaken : RecordRead::kInvalid;
  }
  if (record.kind == VRAMSCOPE_RING_KIND_SITE) {
    v1::Event site;
    const absl::StatusOr<bool> complete = sites_.AddSite(record, &site);
    if (complete.ok() && *complete) out.AddEvent(std::move(site));
    return complete.ok() ? RecordRead::kTaken : RecordRead::kInvalid;
  }
  if (!out.AddRecord(record, *text)) return RecordRead::kInvalid;
  if (record.time_ns > last_time_ns_) last_time_ns_ = record.time_ns;
  if (record.kind == VRAMSCOPE_RING_KIND_PROCESS_EXIT) exit_seen_ = true;
  return RecordRead::kTaken;
}

void RingReader::AppendDropsAndEnd(DrainSink& out, std::uint64_t dropped_now, std::uint64_t lost,
                                   int* alive, DrainStats* stats) {
  auto writer_alive = [&] {
    if (*alive < 0) *alive = WriterAlive() ? 1 : 0;
    return *alive == 1;
  };
  const std::uint64_t writer_drops = dropped_now > dropped_seen_ ? dropped_now - dropped_seen_ : 0;
  dropped_seen_ = std::max(dropped_seen_, dropped_now);
  if (writer_drops + lost > 0) {
    v1::Event event;
    event.set_time_ns(last_time_ns_);
    v1::DropEvent* drop = event.mutable_drop();
    drop->set_dropped_records(writer_drops + lost);
    drop->set_first_sequence(cursor_);
    out.AddEvent(std::move(event));
    stats->dropped = writer_drops + lost;
  }

  const bool drained = cursor_ == Load(&header_->head);
  if (drained && !writer_alive()) {
    // Drops counted after our first look, by the writer's last moments.
    const std::uint64_t late = Load(&header_->records_dropped, __ATOMIC_RELAXED);
    if (late > dropped_seen_) {
      v1::Event event;
      event.set_time_ns(last_time_ns_);
      event.mutable_drop()->set_dropped_records(late - dropped_seen_);
      event.mutable_drop()->set_first_sequence(cursor_);
      out.AddEvent(std::move(event));
      stats->dropped += late - dropped_seen_;
      dropped_seen_ = late;
    }
    if (!exit_seen_) {
      v1::Event built;
      v1::Event* event = &built;
      v1::ProcessExitEvent* exit = event->mutable_process_exit();
      const bool exited = WriterExited();  // its exit path ran; only the record was lost
      exit->set_exit_code(exited ? ExitCode() : 0);
      exit->set_killed(!exited);
      exit->set_vanished(!exited);
      // A writer that vanished (SIGKILL, the OOM killer, abort) ended after its last event: when
      // this reader saw it alive before, it ended between then and now, and now is the bound
      // told; a ring found already dead says no more than its last event.
      std::uint64_t end = std::max(last_time_ns_, info_.start_monotonic_ns);
      if (!exited && seen_alive_) end = std::max(end, MonotonicNowNs());
      event->set_time_ns(end);
      out.AddEvent(std::move(built));
    }
    finished_ = true;
    stats->finished = true;
  } else if (*alive == 1) {
    seen_alive_ = true;
  }
}

}  // namespace vramscope::agent
