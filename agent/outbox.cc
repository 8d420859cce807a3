#include "vramscope/agent/outbox.h"

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/escaping.h>
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_split.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "drain/event_encoder.h"
#include "vramscope/atomic_file.h"
#include "vramscope/log.h"
#include "vramscope/process_key.h"

namespace vramscope::agent {
namespace {

// A spool file: this header, then the serialized EventBatch. Host byte order (the spool never
// leaves the node). The CRC-32 (zlib's) covers the payload; header and name must agree.
constexpr char kSpoolMagic[8] = {'V', 'S', 'S', 'P', 'O', 'O', 'L', '1'};
struct SpoolHeader {
  char magic[8];
  uint64_t sequence;
  uint64_t ring_end;
  uint64_t payload_bytes;
  uint32_t crc32;
  uint32_t reserved;
};
static_assert(sizeof(SpoolHeader) == 40);
constexpr absl::string_view kBatchSuffix = ".batch";
constexpr absl::string_view kTempSuffix = ".tmp";
// The most batches a replay fills in as lost between two spooled batches of one process: far
// more than a spool bounded by --max-spool-bytes holds, far fewer than a forged name can claim.
constexpr uint64_t kMaxReplayGap = uint64_t{1} << 20;
constexpr absl::string_view kCorruptSuffix = ".corrupt";
// Batches the collector rejected, moved out of the spool (not replayed), each with FILE.reason.
constexpr absl::string_view kRejectedDir = "rejected";
constexpr absl::string_view kReasonSuffix = ".reason";

uint32_t Crc32(const char* data, size_t size) {
  return static_cast<uint32_t>(
      crc32_z(crc32_z(0, nullptr, 0), reinterpret_cast<const Bytef*>(data), size));
}

// The name says whose batch a file holds, even when its contents are damaged:
// PID_STARTTIMENS_SEQUENCE_EVENTS_HEXHOST.batch.
struct SpoolName {
  v1::ProcessKey key;
  uint64_t sequence = 0;
  uint64_t events = 0;
};

std::optional<SpoolName> ParseSpoolName(absl::string_view file) {
  if (!absl::ConsumeSuffix(&file, kBatchSuffix)) return std::nullopt;
  std::vector<absl::string_view> parts = absl::StrSplit(file, '_');
  SpoolName name;
  uint32_t pid = 0;
  uint64_t start = 0;
  if (parts.size() != 5 || !absl::SimpleAtoi(parts[0], &pid) || pid == 0 ||
      !absl::SimpleAtoi(parts[1], &start) || !absl::SimpleAtoi(parts[2], &name.sequence) ||
      name.sequence == 0 || !absl::SimpleAtoi(parts[3], &name.events) || parts[4].size() % 2 != 0 ||
      !std::all_of(parts[4].begin(), parts[4].end(), [](char c) { return isxdigit(c) != 0; })) {
    return std::nullopt;
  }
  name.key.set_pid(pid);
  name.key.set_start_time_ns(start);
  name.key.set_host(absl::HexStringToBytes(parts[4]));
  return name;
}

// Creates `dir` mode 0700 (its parents with the usual mode): the spool holds other processes'
// command lines and allocation sites, and its file names their pids. An existing directory keeps
// its mode (the operator's choice).
void CreatePrivateDirectory(const std::filesystem::path& dir, std::error_code* ec) {
  std::filesystem::path leaf = dir;
  if (leaf.filename().empty()) leaf = leaf.parent_path();  // "DIR/"
  if (leaf.has_parent_path()) std::filesystem::create_directories(leaf.parent_path(), *ec);
  if (*ec) return;
  if (::mkdir(leaf.c_str(), 0700) != 0 && errno != EEXIST) {
    *ec = std::error_code(errno, std::generic_category());
    return;
  }
  if (!std::filesystem::is_directory(leaf, *ec) && !*ec) {
    *ec = std::make_error_code(std::errc::not_a_directory);
  }
}

// Spool files and reject notes: 0600, and no fsync (a spool file is rewritten for every batch
// and protects against the agent dying, not the machine losing power). A leftover temporary name
// ends in ".tmp", which a replay removes.
constexpr AtomicWriteOptions kSpoolWrite{.new_file_mode = 0600, .sync = false};

// Header + `payload` (a serialized EventBatch numbered `sequence`): a spool file's bytes.
std::string EncodeSpoolBytes(uint64_t sequence, std::string_view payload, uint64_t ring_end) {
  SpoolHeader header{};
  memcpy(header.magic, kSpoolMagic, sizeof(kSpoolMagic));
  header.sequence = sequence;
  header.ring_end = ring_end;
  header.payload_bytes = payload.size();
  header.crc32 = Crc32(payload.data(), payload.size());
  std::string bytes;
  bytes.reserve(sizeof(header) + payload.size());
  bytes.append(reinterpret_cast<const char*>(&header), sizeof(header));
  bytes.append(payload.data(), payload.size());
  return bytes;
}

// Header + `payload`, written atomically to `path`.
bool WriteSpoolFile(const std::string& path, uint64_t sequence, std::string_view payload,
                    uint64_t ring_end, std::string* error) {
  absl::Status written =
      WriteFileAtomically(path, EncodeSpoolBytes(sequence, payload, ring_end), kSpoolWrite);
  if (!written.ok()) *error = std::string(written.message());
  return written.ok();
}

// Validates the contents `bytes` of a file named `name`.
absl::StatusOr<SpoolFile> ParseSpoolContents(absl::string_view bytes, const SpoolName& name) {
  SpoolHeader header{};
  if (bytes.size() < sizeof(header)) {
    return absl::DataLossError(absl::StrFormat(
        "truncated: %d bytes, shorter than the %d-byte header", bytes.size(), sizeof(header)));
  }
  memcpy(&header, bytes.data(), sizeof(header));
  if (memcmp(header.magic, kSpoolMagic, sizeof(kSpoolMagic)) != 0) {
    return absl::DataLossError("not a vramscope spool file (bad magic)");
  }
  if (header.payload_bytes != bytes.size() - sizeof(header)) {
    return absl::DataLossError(
        absl::StrFormat("truncated or padded: the header says %d bytes of "
                        "batch, the file holds %d",
                        header.payload_bytes, bytes.size() - sizeof(header)));
  }
  if (header.crc32 != Crc32(bytes.data() + sizeof(header), header.payload_bytes)) {
    return absl::DataLossError("checksum mismatch (damaged contents)");
  }
  SpoolFile file;
  if (!file.batch.ParseFromArray(bytes.data() + sizeof(header),
                                 static_cast<int>(header.payload_bytes))) {
    return absl::DataLossError("the payload is not a vramscope.v1.EventBatch");
  }
  if (header.sequence != name.sequence || file.batch.sequence() != name.sequence ||
      file.batch.process().pid() != name.key.pid() ||
      file.batch.process().start_time_ns() != name.key.start_time_ns() ||
      file.batch.process().host() != name.key.host() ||
      static_cast<uint64_t>(file.batch.events_size()) != name.events) {
    return absl::DataLossError(absl::StrFormat(
        "contents do not match the name (sequence %d, pid %d, %d events)", file.batch.sequence(),
        file.batch.process().pid(), file.batch.events_size()));
  }
  file.ring_end = header.ring_end;
  file.payload_bytes = header.payload_bytes;
  return file;
}

// Reads and validates the file `path` named `name`.
absl::StatusOr<SpoolFile> ReadSpoolFile(const std::string& path, const SpoolName& name) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot open: ", strerror(errno)));
  std::string bytes;
  char buffer[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return absl::DataLossError(absl::StrCat("cannot read: ", strerror(err)));
    }
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return ParseSpoolContents(bytes, name);
}

// In place of a batch that is lost: its sequence, with a DropEvent for its events; serialized.
std::shared_ptr<const std::string> LostBatch(const v1::ProcessKey& key, uint64_t sequence,
                                             uint64_t events) {
  v1::EventBatch batch;
  *batch.mutable_process() = key;
  batch.set_sequence(sequence);
  batch.add_events()->mutable_drop()->set_dropped_records(events);
  return std::make_shared<const std::string>(batch.SerializeAsString());
}

bool HasExit(const v1::EventBatch& batch) {
  return std::any_of(batch.events().begin(), batch.events().end(),
                     [](const v1::Event& event) { return event.has_process_exit(); });
}

bool RateLimited(uint64_t count) { return count > 10 && count % 1000 != 0; }

}  // namespace

// A batch file of an earlier run found in the spool.
struct Outbox::SpoolFound {
  SpoolName name;
  std::string path;  // empty: lost (rejected)
  uint64_t payload_bytes = 0;
  uint64_t ring_end = 0;
  bool has_exit = false;
  // Kept (serialized) up to the memory bound; the rest is validated, then read again when it is
  // sent.
  std::shared_ptr<const std::string> batch;
};

std::string SpoolFileName(const v1::ProcessKey& key, uint64_t sequence, uint64_t events) {
  return absl::StrFormat("%d_%d_%d_%d_%s%s", key.pid(), key.start_time_ns(), sequence, events,
                         absl::BytesToHexString(key.host()), kBatchSuffix);
}

absl::StatusOr<std::string> EncodeSpoolFile(const v1::EventBatch& batch, uint64_t ring_end) {
  std::string payload;
  if (!batch.SerializeToString(&payload)) {
    return absl::InvalidArgumentError("cannot serialize the batch");
  }
  return EncodeSpoolBytes(batch.sequence(), payload, ring_end);
}

absl::StatusOr<SpoolFile> ParseSpoolFile(absl::string_view file_name, absl::string_view bytes) {
  std::optional<SpoolName> name = ParseSpoolName(file_name);
  if (!name) {
    return absl::InvalidArgumentError(
        "not a spool file name of this agent version (PID_START_SEQUENCE_EVENTS_HOST.batch)");
  }
  return ParseSpoolContents(bytes, *name);
}

Outbox::Outbox(OutboxOptions options) : options_(std::move(options)) {
  if (options_.spool_dir.empty()) return;
  absl::MutexLock lock(&mu_);
  std::error_code ec;
  CreatePrivateDirectory(options_.spool_dir, &ec);
  if (ec) {
    spool_error_ = absl::StrFormat("cannot create the spool directory %s: %s", options_.spool_dir,
                                   ec.message());
    Log(LogLevel::kError, absl::StrCat(spool_error_, "; every batch will be dropped"));
    return;
  }
  // One agent per spool: a second one would send the first one's batches as its own.
  spool_lock_fd_ = ::open(options_.spool_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (spool_lock_fd_ < 0 || ::flock(spool_lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    spool_error_ = absl::StrFormat(
        "the spool directory %s %s", options_.spool_dir,
        spool_lock_fd_ >= 0 && errno == EWOULDBLOCK
            ? "is in use by another vramscope-agent; give each agent its own --spool-dir"
            : absl::StrCat("cannot be locked: ", strerror(errno)));
    Log(LogLevel::kError, absl::StrCat(spool_error_, "; every batch will be dropped"));
    return;
  }
  Replay();
}

// Files are kept: the next Outbox over the directory sends what is in them.
Outbox::~Outbox() {
  if (spool_lock_fd_ >= 0) ::close(spool_lock_fd_);
}

void Outbox::Replay() {
  SpoolFiles found;
  int temps = 0;
  if (!ScanSpool(&found, &temps)) return;
  uint64_t replayed = 0;
  uint64_t lost = 0;
  for (auto& [where, f] : found) QueueSpooled(where.first, f, &replayed, &lost);
  if (replayed + lost + counters_.spool_files_rejected + static_cast<uint64_t>(temps) > 0) {
    Log(LogLevel::kInfo,
        absl::StrFormat("spool %s of an earlier run: %d batches queued to send first, %d sent "
                        "as lost, %d files unusable, %d unfinished temporary files removed",
                        options_.spool_dir, replayed, lost, counters_.spool_files_rejected, temps));
  }
}

bool Outbox::ScanSpool(SpoolFiles* found, int* temps) {
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(options_.spool_dir, ec)) {
    files.push_back(entry.path());
  }
  if (ec) {
    spool_error_ =
        absl::StrFormat("cannot list the spool directory %s: %s", options_.spool_dir, ec.message());
    Log(LogLevel::kError, absl::StrCat(spool_error_, "; every batch will be dropped"));
    return false;
  }
  std::sort(files.begin(), files.end());
  uint64_t kept_bytes = 0;
  for (const std::filesystem::path& path : files) {
    const std::string file_name = path.filename().string();
    if (absl::EndsWith(file_name, kTempSuffix)) {
      // Never renamed: the agent died while writing it, before the ring let go of its events.
      std::filesystem::remove(path, ec);
      ++*temps;
      continue;
    }
    if (!absl::EndsWith(file_name, kBatchSuffix)) continue;  // *.corrupt of an earlier start
    std::optional<SpoolName> name = ParseSpoolName(file_name);
    absl::StatusOr<SpoolFile> file =
        name ? ReadSpoolFile(path.string(), *name)
             : absl::StatusOr<SpoolFile>(absl::InvalidArgumentError(
                   "not a spool file name of this agent version (PID_START_SEQUENCE_EVENTS_HOST)"));
    if (file.ok()) {
      SpoolFound& f = (*found)[{ProcessKeyString(name->key), name->sequence}];
      f = SpoolFound{*name,          path.string(),        file->payload_bytes,
                     file->ring_end, HasExit(file->batch), nullptr};
      if (kept_bytes + f.payload_bytes <= options_.max_memory_bytes) {
        kept_bytes += f.payload_bytes;
        f.batch = std::make_shared<const std::string>(file->batch.SerializeAsString());
      }
      continue;
    }
    ++counters_.spool_files_rejected;
    const std::string aside = path.string() + std::string(kCorruptSuffix);
    std::filesystem::rename(path, aside, ec);
    const std::string where = ec ? std::string("removed") : absl::StrCat("moved aside to ", aside);
    if (ec) std::filesystem::remove(path, ec);
    if (name) {
      Log(LogLevel::kWarning,
          absl::StrFormat("spool file %s of an earlier run is unusable (%s); %s; its %d events "
                          "(batch %d of process %s) are reported to the collector as dropped",
                          path.string(), file.status().message(), where, name->events,
                          name->sequence, ProcessKeyString(name->key)));
      (*found)[{ProcessKeyString(name->key), name->sequence}] =
          SpoolFound{*name, "", 0, 0, false, nullptr};
    } else {
      Log(LogLevel::kWarning,
          absl::StrFormat("spool file %s of an earlier run is unusable (%s); %s", path.string(),
                          file.status().message(), where));
    }
  }
  return true;
}

void Outbox::QueueSpooled(const std::string& name, SpoolFound& f, uint64_t* replayed,
                          uint64_t* lost) {
  Process& process = processes_[name];
  if (!process.replayed) {
    process.key = f.name.key;
    process.acked = f.name.sequence - 1;  // the earlier run forgot those on acknowledgement
    process.replay_base = process.acked;
    process.next_sequence = f.name.sequence;
    process.replayed = Replayed{};
  }
  if (f.name.sequence > process.next_sequence &&
      f.name.sequence - process.next_sequence > kMaxReplayGap) {
    // No spool holds that many batches (the spool bound): a forged or foreign file. Filling
    // the gap would queue a batch per missing sequence; it is set aside instead.
    ++counters_.spool_files_rejected;
    std::error_code rename_error;
    if (!f.path.empty()) {
      std::filesystem::rename(f.path, f.path + std::string(kCorruptSuffix), rename_error);
    }
    Log(LogLevel::kError,
        absl::StrFormat("spool file %s claims batch %d of %s, %d after the batches before it "
                        "(at most %d can be missing); set aside as %s%s",
                        f.path, f.name.sequence, name, f.name.sequence - process.next_sequence,
                        kMaxReplayGap, kCorruptSuffix, rename_error ? " (rename failed)" : ""));
    return;
  }
  if (f.name.sequence > process.next_sequence) {
    QueueMissing(name, f.name.key, f.name.sequence, process, lost);
  }
  Entry entry;
  entry.process = name;
  entry.sequence = f.name.sequence;
  if (!f.path.empty()) {
    entry.bytes = f.payload_bytes;
    entry.events = static_cast<int>(f.name.events);
    entry.ring_end = f.ring_end;
    entry.spool_path = f.path;
    counters_.spool_bytes += entry.bytes;
    *process.replayed = Replayed{entry.sequence, entry.ring_end, f.has_exit};
    if (f.batch != nullptr) {
      entry.batch = std::move(f.batch);
      counters_.memory_bytes += entry.bytes;
    }
    ++counters_.batches_replayed;
    ++*replayed;
  } else {
    // Written again, valid, under the same name: a second restart still reports the loss.
    std::shared_ptr<const std::string> batch =
        LostBatch(f.name.key, f.name.sequence, f.name.events);
    entry.bytes = batch->size();
    entry.events = 1;
    Spool(entry, f.name.key, *batch, 0);
    entry.batch = std::move(batch);
    counters_.memory_bytes += entry.bytes;
    *process.replayed = Replayed{entry.sequence, 0, false};
    ++*lost;
  }
  process.next_sequence = entry.sequence + 1;
  pending_.push_back(std::move(entry));
}

void Outbox::QueueMissing(const std::string& name, const v1::ProcessKey& key, uint64_t sequence,
                          Process& process, uint64_t* lost) {
  // Deleted by someone else: nothing to send for them, but the collector must see no gap.
  Log(LogLevel::kWarning,
      absl::StrFormat("batches %d..%d of %s are missing from the spool %s; sent as empty "
                      "batches (their events are lost and not counted)",
                      process.next_sequence, sequence - 1, name, options_.spool_dir));
  while (process.next_sequence < sequence) {
    Entry entry;
    entry.process = name;
    entry.sequence = process.next_sequence++;
    std::shared_ptr<const std::string> empty = LostBatch(key, entry.sequence, 0);
    entry.bytes = empty->size();
    entry.events = 1;
    Spool(entry, key, *empty, 0);
    entry.batch = std::move(empty);
    counters_.memory_bytes += entry.bytes;
    pending_.push_back(std::move(entry));
    ++*lost;
  }
}

bool Outbox::Spool(Entry& entry, const v1::ProcessKey& key, std::string_view batch,
                   uint64_t ring_end) {
  std::string path =
      absl::StrCat(options_.spool_dir, "/",
                   SpoolFileName(key, entry.sequence, static_cast<uint64_t>(entry.events)));
  std::string error;
  if (!WriteSpoolFile(path, entry.sequence, batch, ring_end, &error)) {
    ++spool_errors_;
    if (!RateLimited(spool_errors_)) {
      Log(LogLevel::kError,
          absl::StrFormat("cannot spool batch %d of %s to %s: %s (%d spool "
                          "write errors so far)",
                          entry.sequence, entry.process, path, error, spool_errors_));
    }
    return false;
  }
  entry.spool_path = std::move(path);
  counters_.spool_bytes += entry.bytes;
  ++counters_.batches_spooled;
  return true;
}

std::shared_ptr<const std::string> Outbox::Load(const Entry& entry) {
  if (entry.batch != nullptr) return entry.batch;
  std::optional<SpoolName> name =
      ParseSpoolName(std::filesystem::path(entry.spool_path).filename().string());
  absl::StatusOr<SpoolFile> file =
      name ? ReadSpoolFile(entry.spool_path, *name)
           : absl::StatusOr<SpoolFile>(absl::InternalError("unexpected spool file name"));
  if (file.ok()) {
    file->batch.set_sequence(entry.sequence);
    return std::make_shared<const std::string>(file->batch.SerializeAsString());
  }
  // The spool is ours alone; a file we cannot read back is lost. Send the sequence anyway, with
  // a DropEvent in place of the events, so the collector sees no gap and counts the loss.
  Log(LogLevel::kError, absl::StrFormat("spooled batch %s is unreadable (%s); %d events lost",
                                        entry.spool_path, file.status().message(), entry.events));
  return LostBatch(processes_[entry.process].key, entry.sequence,
                   static_cast<uint64_t>(entry.events));
}

void Outbox::Forget(Entry& entry) {
  if (entry.batch != nullptr) {
    counters_.memory_bytes -= entry.bytes;
    entry.batch.reset();
  }
  if (!entry.spool_path.empty()) {
    ::unlink(entry.spool_path.c_str());
    counters_.spool_bytes -= entry.bytes;
    entry.spool_path.clear();
  }
}

uint64_t Outbox::Renumber(const std::string& name, uint64_t first) {
  uint64_t next = first;
  for (Entry& entry : pending_) {
    if (entry.process != name) continue;
    // Rare (a collector that lost data, or an earlier agent's batches): the batch is parsed,
    // renumbered and serialized again.
    v1::EventBatch parsed;
    if (!parsed.ParseFromString(*Load(entry))) {
      parsed = v1::EventBatch();  // cannot happen: the outbox made these bytes
      *parsed.mutable_process() = processes_[name].key;
      parsed.add_events()->mutable_drop()->set_dropped_records(static_cast<uint64_t>(entry.events));
    }
    parsed.set_sequence(next);
    auto copy = std::make_shared<const std::string>(parsed.SerializeAsString());
    // The size changes with the sequence's varint: the bounds count the new one.
    if (entry.batch != nullptr) counters_.memory_bytes -= entry.bytes;
    const uint64_t old_bytes = entry.bytes;
    entry.bytes = copy->size();
    if (!entry.spool_path.empty()) {
      // The file must carry the new number, or a later run would replay a stale one. If it
      // cannot be written again, the batch is kept in memory only.
      const std::string old_path = entry.spool_path;
      counters_.spool_bytes -= old_bytes;
      entry.spool_path.clear();
      entry.sequence = next;
      Spool(entry, parsed.process(), *copy, entry.ring_end);
      ::unlink(old_path.c_str());
    }
    counters_.memory_bytes += entry.bytes;
    entry.batch = std::move(copy);
    entry.sequence = next++;
    ++counters_.batches_renumbered;
  }
  return next;
}

bool Outbox::Add(const v1::EventBatch& batch, uint64_t ring_end,
                 const std::function<void()>& stored) {
  EncodedBatch encoded;
  encoded.process = batch.process();
  EncodedEvents events;
  for (const v1::Event& event : batch.events()) events.AddEvent(event);
  encoded.event_count = events.size();
  encoded.first_time_ns = events.first_time_ns();
  encoded.events = events.TakeBytes();
  for (const v1::DeviceCounters& counters : batch.counters()) {
    AppendCountersField(counters, &encoded.counters);
  }
  return Add(std::move(encoded), ring_end, stored);
}

bool Outbox::Add(EncodedBatch batch, uint64_t ring_end, const std::function<void()>& stored_cb) {
  // Built before taking the lock.
  const std::string process_field = EncodeProcessField(batch.process);
  const std::string name = ProcessKeyString(batch.process);
  absl::MutexLock lock(&mu_);
  Process& process = processes_[name];
  if (process.key.pid() == 0) process.key = batch.process;
  int events = batch.event_count;
  std::string drop;
  if (process.pending_drop_events > 0) {
    // At the head of the batch, timed at its first event.
    v1::Event event;
    event.set_time_ns(batch.event_count > 0 ? batch.first_time_ns : 0);
    event.mutable_drop()->set_dropped_records(process.pending_drop_events);
    EncodedEvents encoded;
    encoded.AddEvent(event);
    drop = encoded.TakeBytes();
    ++events;
  }
  auto serialized = std::make_shared<const std::string>(
      ComposeEventBatch(process_field, process.next_sequence, drop, batch.events, batch.counters));
  const uint64_t bytes = serialized->size();
  const bool memory_room = counters_.memory_bytes + bytes <= options_.max_memory_bytes;

  Entry entry;
  entry.process = name;
  entry.sequence = process.next_sequence;
  entry.bytes = bytes;
  entry.events = events;
  entry.ring_end = ring_end;
  bool stored = false;
  if (!options_.spool_dir.empty()) {
    // Durable first: the caller lets the ring go of these events once we return.
    if (spool_error_.empty() && counters_.spool_bytes + bytes <= options_.max_spool_bytes) {
      stored = Spool(entry, batch.process, *serialized, ring_end);
    }
    if (stored && memory_room) {
      entry.batch = std::move(serialized);
      counters_.memory_bytes += bytes;
    }
  } else if (memory_room) {
    entry.batch = std::move(serialized);
    counters_.memory_bytes += bytes;
    stored = true;
  }
  if (stored) {
    process.pending_drop_events = 0;
    process.numbered_here = true;
    ++process.next_sequence;
    ++counters_.batches_cut;
    counters_.events_cut += static_cast<uint64_t>(entry.events);
  } else {
    // No sequence number is used up, so the collector sees no gap; the loss is reported to it.
    const int lost = entry.events - (process.pending_drop_events > 0 ? 1 : 0);
    process.pending_drop_events += static_cast<uint64_t>(lost);
    ++counters_.batches_dropped;
    counters_.events_dropped += static_cast<uint64_t>(lost);
    if (!RateLimited(counters_.batches_dropped)) {
      Log(LogLevel::kWarning,
          absl::StrFormat(
              "dropped a batch of %d events of %s: %s; %d batches / %d events dropped so far, "
              "reported to the collector as a DropEvent",
              lost, name,
              options_.spool_dir.empty()
                  ? absl::StrFormat("%d bytes unacknowledged in memory (limit %d), no --spool-dir",
                                    counters_.memory_bytes, options_.max_memory_bytes)
                  : absl::StrFormat("%d bytes unacknowledged in the spool %s (limit %d)%s",
                                    counters_.spool_bytes, options_.spool_dir,
                                    options_.max_spool_bytes,
                                    spool_error_.empty() ? "" : ", unusable"),
              counters_.batches_dropped, counters_.events_dropped));
    }
  }
  // Before the sender can see the batch: once it is acknowledged its file goes, and the ring
  // must have let go of its events by then or a restarted agent would read them again.
  if (stored_cb) stored_cb();
  if (stored) pending_.push_back(std::move(entry));
  return stored;
}

void Outbox::PopAcked() {
  while (!pending_.empty()) {
    Entry& front = pending_.front();
    auto it = processes_.find(front.process);
    if (it == processes_.end() || front.sequence > it->second.acked) break;
    Forget(front);
    pending_.pop_front();
    ++counters_.batches_acked;
    if (sent_count_ > 0) --sent_count_;
  }
}

void Outbox::SetStart(const v1::ProcessKey& key, uint64_t acked_sequence) {
  absl::MutexLock lock(&mu_);
  const std::string name = ProcessKeyString(key);
  Process& process = processes_[name];
  if (process.numbered_here) return;  // batches were numbered already: too late
  process.key = key;
  // Only while no acknowledgement arrived since the replay: a probe answered before the
  // collector stored a replayed batch can arrive after that batch's acknowledgement.
  if (process.replayed && process.acked == process.replay_base &&
      acked_sequence < process.replay_base) {
    // The collector holds less than the replayed batches follow on (it lost data, or is another
    // one): number them right after what it holds, or it would wait for the missing ones forever.
    Log(LogLevel::kWarning,
        absl::StrFormat("the collector holds batches 1..%d of %s, the spool continues at %d; "
                        "renumbered the replayed batches after %d",
                        acked_sequence, name, process.replay_base + 1, acked_sequence));
    process.next_sequence = Renumber(name, acked_sequence + 1);
    process.replayed->last_sequence = process.next_sequence - 1;
    process.acked = acked_sequence;
    sent_count_ = 0;
    return;
  }
  process.acked = std::max(process.acked, acked_sequence);
  process.next_sequence = std::max(process.next_sequence, acked_sequence + 1);
  PopAcked();
}

std::optional<Outbox::Replayed> Outbox::replayed(const v1::ProcessKey& key) const {
  absl::MutexLock lock(&mu_);
  auto it = processes_.find(ProcessKeyString(key));
  if (it == processes_.end()) return std::nullopt;
  return it->second.replayed;
}

std::vector<v1::ProcessKey> Outbox::replayed_processes() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::ProcessKey> keys;
  for (const auto& [name, process] : processes_) {
    if (process.replayed) keys.push_back(process.key);
  }
  return keys;
}

std::string Outbox::spool_error() const {
  absl::MutexLock lock(&mu_);
  return spool_error_;
}

void Outbox::Ack(const v1::ProcessKey& key, uint64_t acked_sequence) {
  absl::MutexLock lock(&mu_);
  auto it = processes_.find(ProcessKeyString(key));
  if (it == processes_.end()) return;
  Process& process = it->second;
  if (acked_sequence <= process.acked) return;
  if (acked_sequence >= process.next_sequence) {
    // The collector holds batches of this process that this agent never cut: an earlier agent
    // sent them. Ours were taken for duplicates; number them after the collector's and resend.
    const uint64_t before = counters_.batches_renumbered;
    process.next_sequence = Renumber(it->first, acked_sequence + 1);
    Log(LogLevel::kWarning,
        absl::StrFormat("the collector already holds batches 1..%d of %s from an earlier agent; "
                        "renumbered %d unacknowledged batches after them",
                        acked_sequence, it->first, counters_.batches_renumbered - before));
    process.acked = acked_sequence;
    sent_count_ = 0;
  } else {
    process.acked = acked_sequence;
  }
  PopAcked();
}

void Outbox::Reject(const v1::ProcessKey& key, uint64_t sequence, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  const std::string name = ProcessKeyString(key);
  auto found = std::find_if(pending_.begin(), pending_.end(), [&](const Entry& entry) {
    return entry.sequence == sequence && entry.process == name;
  });
  if (found == pending_.end()) return;  // forgotten already
  ++counters_.batches_rejected;
  counters_.events_rejected += static_cast<uint64_t>(found->events);
  if (first_reject_reason_.empty()) first_reject_reason_ = reason;
  std::string kept = "dropped (no --spool-dir to keep it in)";
  if (!found->spool_path.empty()) {
    // Kept for whoever needs to see what the collector refused; out of the spool proper, so a
    // later run does not replay it.
    const std::filesystem::path from(found->spool_path);
    const std::filesystem::path dir = from.parent_path() / std::string(kRejectedDir);
    const std::filesystem::path to = dir / from.filename();
    std::error_code ec;
    CreatePrivateDirectory(dir, &ec);
    if (!ec) std::filesystem::rename(from, to, ec);
    if (!ec) {
      const std::string note = to.string() + std::string(kReasonSuffix);
      if (absl::Status s = WriteFileAtomically(note, absl::StrCat(reason, "\n"), kSpoolWrite);
          !s.ok()) {
        Log(LogLevel::kWarning, std::string(s.message()));
      }
      counters_.spool_bytes -= found->bytes;
      found->spool_path.clear();
      kept = absl::StrCat("kept in ", to.string());
    } else {
      kept = absl::StrFormat("dropped (cannot move it to %s: %s)", dir.string(), ec.message());
    }
  }
  Process& process = processes_[name];
  if (!process.rejected) {
    process.rejected = true;
    ++counters_.processes_rejected;
    Log(LogLevel::kWarning,
        absl::StrFormat("the collector rejected batch %d of process %s (%d events): %s; %s. "
                        "Further rejected batches of this process are counted, not logged",
                        sequence, name, found->events, reason, kept));
  }
  const size_t index = static_cast<size_t>(found - pending_.begin());
  Forget(*found);
  pending_.erase(found);
  if (index < sent_count_) --sent_count_;
  PopAcked();
}

std::string Outbox::first_reject_reason() const {
  absl::MutexLock lock(&mu_);
  return first_reject_reason_;
}

std::shared_ptr<const v1::EventBatch> Outbox::NextToSend(absl::Duration timeout) {
  std::shared_ptr<const std::string> bytes = NextToSendBytes(timeout);
  if (bytes == nullptr) return nullptr;
  auto batch = std::make_shared<v1::EventBatch>();
  // The outbox made these bytes (or validated them, from the spool): they parse, except where a
  // string is not UTF-8 (a host taken from a spool file's name for a DropEvent stand-in), which
  // proto3 refuses: the batch is then empty (NextToSendBytes has it as it is sent).
  if (!batch->ParseFromString(*bytes)) batch->Clear();
  return batch;
}

std::shared_ptr<const std::string> Outbox::NextToSendBytes(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return interrupted_ || sent_count_ < pending_.size();
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (interrupted_ || sent_count_ >= pending_.size()) return nullptr;
  Entry& entry = pending_[sent_count_++];
  if (entry.sent) {
    ++counters_.batches_resent;
  } else {
    ++counters_.batches_sent;
    entry.sent = true;
  }
  return Load(entry);
}

void Outbox::Rewind() {
  absl::MutexLock lock(&mu_);
  sent_count_ = 0;
  interrupted_ = false;
}

bool Outbox::WaitNothingInFlight(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sent_count_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void Outbox::Interrupt() {
  absl::MutexLock lock(&mu_);
  interrupted_ = true;
}

void Outbox::SetConnected(bool connected) {
  absl::MutexLock lock(&mu_);
  counters_.connected = connected;
}

void Outbox::CountReconnect() {
  absl::MutexLock lock(&mu_);
  ++counters_.reconnects;
}

bool Outbox::WaitAllAcked(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto empty = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_.empty(); };
  return mu_.AwaitWithTimeout(absl::Condition(&empty), timeout);
}

bool Outbox::WaitAcked(uint64_t batches, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto enough = [this, batches]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return counters_.batches_acked >= batches;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

bool Outbox::Empty() const {
  absl::MutexLock lock(&mu_);
  return pending_.empty();
}

AgentCounters Outbox::counters() const {
  absl::MutexLock lock(&mu_);
  AgentCounters counters = counters_;
  counters.pending_batches = pending_.size();
  return counters;
}

}  // namespace vramscope::agent
