#include "vramscope/collector/collector.h"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "vramscope/collector/batch_check.h"
#include "vramscope/collector/log.h"
#include "vramscope/collector/process_stats.h"

namespace vramscope::collector {
namespace {

std::atomic<const char*> g_log_program{"vramscope-collector"};
std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};

bool SameKey(const v1::ProcessKey& a, const v1::ProcessKey& b) {
  return a.host() == b.host() && a.pid() == b.pid() && a.start_time_ns() == b.start_time_ns();
}

std::string SanitizedHost(const std::string& host) {
  std::string out = host.empty() ? "unknown-host" : host;
  for (char& c : out) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-';
    if (!ok) c = '_';
  }
  return out.substr(0, 64);
}

absl::Status FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return absl::InternalError(absl::StrFormat("cannot open %s: %s", dir, strerror(errno)));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return absl::InternalError(absl::StrFormat("fsync %s: %s", dir, strerror(err)));
  return absl::OkStatus();
}

// Copies bytes [offset, end) of `path` to `aside` so that a truncation never destroys evidence.
absl::Status CopyTail(const std::string& path, uint64_t offset, const std::string& aside) {
  int in = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return absl::InternalError(absl::StrFormat("open %s: %s", path, strerror(errno)));
  int out = ::open(aside.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (out < 0) {
    int err = errno;
    ::close(in);
    return absl::InternalError(absl::StrFormat("create %s: %s", aside, strerror(err)));
  }
  absl::Status status;
  char buffer[1 << 16];
  off_t pos = static_cast<off_t>(offset);
  while (status.ok()) {
    ssize_t n = ::pread(in, buffer, sizeof(buffer), pos);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = absl::InternalError(absl::StrFormat("read %s: %s", path, strerror(errno)));
      break;
    }
    if (n == 0) break;
    status = AppendAll(out, 0, absl::string_view(buffer, static_cast<size_t>(n)), nullptr, aside);
    pos += n;
  }
  ::close(in);
  ::close(out);
  return status;
}

}  // namespace

void Log(LogLevel level, absl::string_view message) {
  if (static_cast<int>(level) < g_min_level.load(std::memory_order_relaxed)) return;
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  tm utc{};
  ::gmtime_r(&ts.tv_sec, &utc);
  const char tag = level == LogLevel::kInfo ? 'I' : level == LogLevel::kWarning ? 'W' : 'E';
  std::string line =
      absl::StrFormat("%s %c %02d:%02d:%02d.%03d %s\n", g_log_program.load(), tag, utc.tm_hour,
                      utc.tm_min, utc.tm_sec, ts.tv_nsec / 1000000, message);
  // One write(2) per line, so lines of concurrent threads do not interleave.
  ssize_t ignored = ::write(2, line.data(), line.size());
  (void)ignored;
}

void SetLogProgram(const char* program) { g_log_program.store(program); }
void SetMinLogLevel(LogLevel level) { g_min_level.store(static_cast<int>(level)); }

std::string ProcessKeyString(const v1::ProcessKey& key) {
  return absl::StrFormat("%s/%d/%d", key.host(), key.pid(), key.start_time_ns());
}

struct Collector::Process {
  v1::ProcessKey key;
  mutable absl::Mutex mu;
  std::string path ABSL_GUARDED_BY(mu);
  int fd ABSL_GUARDED_BY(mu) = -1;
  uint64_t file_bytes ABSL_GUARDED_BY(mu) = 0;
  uint64_t acked ABSL_GUARDED_BY(mu) = 0;
  ProcessStats stats ABSL_GUARDED_BY(mu);

  ~Process() {
    if (fd >= 0) ::close(fd);
  }
};

Collector::Collector(CollectorOptions options) : options_(std::move(options)) {}
Collector::~Collector() = default;

absl::StatusOr<std::unique_ptr<Collector>> Collector::Open(CollectorOptions options,
                                                           LoadReport* load_report) {
  if (options.data_dir.empty()) {
    return absl::InvalidArgumentError("no data directory: pass --data-dir=DIR");
  }
  std::error_code ec;
  std::filesystem::create_directories(options.data_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot create the data directory %s: %s", options.data_dir, ec.message()));
  }
  std::unique_ptr<Collector> collector(new Collector(std::move(options)));
  LoadReport local;
  absl::Status status = collector->Load(load_report ? load_report : &local);
  if (!status.ok()) return status;
  return collector;
}

absl::Status Collector::Load(LoadReport* report) {
  std::error_code ec;
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(options_.data_dir, ec)) {
    std::string path = entry.path().string();
    if (absl::EndsWith(path, ".vslog")) paths.push_back(path);
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot list the data directory %s: %s", options_.data_dir, ec.message()));
  }
  std::sort(paths.begin(), paths.end());
  for (const std::string& path : paths) LoadFile(path, report);
  Log(LogLevel::kInfo,
      absl::StrFormat("loaded %d process logs from %s (%d batches, %d events, %d bytes); %d files "
                      "skipped, %d errors, %d torn tails truncated",
                      report->files_loaded, options_.data_dir, report->batches, report->events,
                      disk_bytes(), report->files_skipped, report->errors.size(),
                      report->warnings.size()));
  return absl::OkStatus();
}

void Collector::LoadFile(const std::string& path, LoadReport* report) {
  {
    std::error_code ec;
    uint64_t size = std::filesystem::file_size(path, ec);
    if (!ec && size < kLogMagic.size()) {
      std::string head(size, '\0');
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      bool prefix = fd >= 0 && ::read(fd, head.data(), size) == static_cast<ssize_t>(size) &&
                    absl::StartsWith(kLogMagic, head);
      if (fd >= 0) ::close(fd);
      if (prefix) {
        // The collector died while creating the file, before its first record.
        Log(LogLevel::kInfo, absl::StrFormat("%s: an unfinished empty log; removed", path));
        ::unlink(path.c_str());
        return;
      }
    }
  }
  auto process = std::make_unique<Process>();
  absl::MutexLock process_lock(&process->mu);
  bool have_key = false;
  uint64_t events = 0;
  LogScan scan;
  absl::Status status = ReadLog(
      path,
      [&](uint64_t, absl::string_view payload) -> absl::Status {
        v1::EventBatch batch;
        if (!batch.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
          return absl::DataLossError("payload is not an EventBatch");
        }
        if (!have_key) {
          process->key = batch.process();
          have_key = true;
        } else if (!SameKey(batch.process(), process->key)) {
          return absl::DataLossError(absl::StrFormat("batch of process %s in the log of %s",
                                                     ProcessKeyString(batch.process()),
                                                     ProcessKeyString(process->key)));
        }
        if (batch.sequence() != process->acked + 1) {
          return absl::DataLossError(absl::StrFormat("sequence %d where %d was expected",
                                                     batch.sequence(), process->acked + 1));
        }
        process->acked = batch.sequence();
        process->stats.Consume(batch);
        events += static_cast<uint64_t>(batch.events_size());
        return absl::OkStatus();
      },
      &scan);
  if (!status.ok()) {
    ++report->files_skipped;
    report->errors.push_back(std::string(status.message()));
    Log(LogLevel::kError, status.message());
    return;
  }
  if (scan.damaged) {
    uint64_t cut = scan.file_bytes - scan.valid_bytes;
    std::string kept = absl::StrFormat("%d good records before it (up to sequence %d) kept",
                                       scan.records, process->acked);
    if (scan.damaged_is_tail) {
      std::string message = absl::StrFormat("%s: %s; truncated the torn tail (%d bytes), %s", path,
                                            scan.damage, cut, kept);
      report->warnings.push_back(message);
      Log(LogLevel::kWarning, message);
    } else {
      std::string aside = absl::StrFormat("%s.corrupt-%d", path, scan.valid_bytes);
      absl::Status copied = CopyTail(path, scan.valid_bytes, aside);
      std::string message = absl::StrFormat(
          "%s: corrupt %s; %s; the %d bytes from there on were %s and cut from the log", path,
          scan.damage, kept, cut,
          copied.ok() ? absl::StrCat("moved to ", aside)
                      : absl::StrCat("NOT saved (", copied.message(), ")"));
      report->errors.push_back(message);
      Log(LogLevel::kError, message);
    }
    if (::truncate(path.c_str(), static_cast<off_t>(scan.valid_bytes)) != 0) {
      std::string message = absl::StrFormat("%s: cannot truncate to %d bytes: %s; file skipped",
                                            path, scan.valid_bytes, strerror(errno));
      ++report->files_skipped;
      report->errors.push_back(message);
      Log(LogLevel::kError, message);
      return;
    }
    report->truncated_bytes += cut;
  }
  if (!have_key) {
    // Nothing but the magic: the collector died between creating the file and its first record.
    Log(LogLevel::kInfo, absl::StrFormat("%s: holds no batches; removed", path));
    ::unlink(path.c_str());
    return;
  }
  std::string key = ProcessKeyString(process->key);
  absl::MutexLock lock(&mu_);
  if (processes_.contains(key)) {
    std::string message =
        absl::StrFormat("%s: a second log of process %s; skipped (move one of the two out of %s)",
                        path, key, options_.data_dir);
    ++report->files_skipped;
    report->errors.push_back(message);
    Log(LogLevel::kError, message);
    return;
  }
  process->fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (process->fd < 0) {
    std::string message =
        absl::StrFormat("%s: cannot open for appending: %s; file skipped", path, strerror(errno));
    ++report->files_skipped;
    report->errors.push_back(message);
    Log(LogLevel::kError, message);
    return;
  }
  process->path = path;
  process->file_bytes = scan.valid_bytes;
  disk_bytes_.fetch_add(scan.valid_bytes, std::memory_order_relaxed);
  ++report->files_loaded;
  report->batches += scan.records;
  report->events += events;
  processes_.emplace(key, std::move(process));
}

absl::Status Collector::CreateLog(Process* process) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Called with process->mu held.
  std::string base =
      absl::StrFormat("%s/%s_%d_%d", options_.data_dir, SanitizedHost(process->key.host()),
                      process->key.pid(), process->key.start_time_ns());
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string path =
        attempt == 0 ? absl::StrCat(base, ".vslog") : absl::StrFormat("%s-%d.vslog", base, attempt);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0 && errno == EEXIST) continue;
    if (fd < 0) {
      int err = errno;
      std::string message = absl::StrFormat("cannot create the log %s: %s", path, strerror(err));
      return err == ENOSPC || err == EDQUOT ? absl::ResourceExhaustedError(message)
                                            : absl::InternalError(message);
    }
    absl::Status status = AppendAll(fd, 0, kLogMagic, options_.write_fn, path);
    if (status.ok() && options_.fsync) status = FsyncDir(options_.data_dir);
    if (!status.ok()) {
      ::close(fd);
      ::unlink(path.c_str());
      return status;
    }
    process->fd = fd;
    process->path = path;
    process->file_bytes = kLogMagic.size();
    return absl::OkStatus();
  }
  return absl::InternalError(absl::StrFormat("cannot find a free log name for %s", base));
}

absl::StatusOr<Collector::Process*> Collector::FindOrCreate(const v1::ProcessKey& key,
                                                            uint64_t sequence) {
  const std::string name = ProcessKeyString(key);
  absl::MutexLock lock(&mu_);
  auto it = processes_.find(name);
  if (it != processes_.end()) return it->second.get();
  if (sequence != 1) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "sequence gap for process %s: the collector holds none of its batches and expects "
        "sequence 1, got %d; resend from sequence 1",
        name, sequence));
  }
  if (processes_.size() >= options_.max_processes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the collector already tracks %d processes (--max-processes=%d); process %s refused",
        processes_.size(), options_.max_processes, name));
  }
  auto created = std::make_unique<Process>();
  created->key = key;
  Process* process = created.get();
  processes_.emplace(name, std::move(created));
  return process;
}

uint64_t Collector::StoredSequence(const v1::ProcessKey& key) const {
  const Process* process = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = processes_.find(ProcessKeyString(key));
    if (it == processes_.end()) return 0;
    process = it->second.get();  // processes are never removed
  }
  // Not under mu_: loading takes a process's lock first and mu_ second.
  absl::MutexLock process_lock(&process->mu);
  return process->acked;
}

absl::StatusOr<uint64_t> Collector::Ingest(const v1::EventBatch& batch, absl::string_view wire) {
  // Bytes from the wire were parsed, which checks every string; a batch built in memory was not.
  absl::Status valid = wire.empty() ? ValidateBatch(batch) : ValidateBatchHeader(batch);
  if (!valid.ok()) return valid;
  if (batch.sequence() == 0) {
    // A probe: an agent asks where this process stands before it sends anything.
    return StoredSequence(batch.process());
  }
  absl::StatusOr<Process*> found = FindOrCreate(batch.process(), batch.sequence());
  if (!found.ok()) return found.status();
  Process* process = *found;
  absl::MutexLock lock(&process->mu);
  return Append(process, batch, wire);
}

absl::StatusOr<uint64_t> Collector::Refuse(const v1::ProcessKey& key, uint64_t sequence,
                                           uint64_t events) {
  batches_refused_.fetch_add(1, std::memory_order_relaxed);
  // A key that cannot be filed gets nothing stored: every batch naming it is refused alike, so
  // there is no sequence to keep contiguous.
  if (!ValidateProcessKey(key).ok()) return uint64_t{0};
  if (sequence == 0) return StoredSequence(key);
  absl::StatusOr<Process*> found = FindOrCreate(key, sequence);
  if (!found.ok()) return found.status();
  Process* process = *found;
  absl::MutexLock lock(&process->mu);
  // The sequence is consumed like a stored batch's: a DropEvent for the refused batch's events
  // stands in for it, so the process's later batches follow without a gap (also after a
  // restart, which reads the log back) and its report counts the loss in dropped_records.
  v1::EventBatch stand_in;
  *stand_in.mutable_process() = key;
  stand_in.set_sequence(sequence);
  stand_in.add_events()->mutable_drop()->set_dropped_records(events);
  return Append(process, stand_in, {});
}

absl::StatusOr<uint64_t> Collector::Append(Process* process, const v1::EventBatch& batch,
                                           absl::string_view wire) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Called with process->mu held.
  if (batch.sequence() <= process->acked) {  // a resend: already stored
    batches_duplicate_.fetch_add(1, std::memory_order_relaxed);
    return process->acked;
  }
  if (batch.sequence() != process->acked + 1) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "sequence gap for process %s: stored up to %d, got %d; resend from sequence %d",
        ProcessKeyString(process->key), process->acked, batch.sequence(), process->acked + 1));
  }
  std::string serialized;
  if (wire.empty()) serialized = batch.SerializeAsString();
  // One framing buffer per thread, reused: a fresh 100+ KB string per batch costs page faults.
  thread_local std::string record;
  FrameRecordInto(wire.empty() ? absl::string_view(serialized) : wire, &record);
  uint64_t need = record.size() + (process->fd < 0 ? kLogMagic.size() : 0);
  uint64_t before = disk_bytes_.fetch_add(need, std::memory_order_relaxed);
  if (options_.max_disk_bytes != 0 && before + need > options_.max_disk_bytes) {
    disk_bytes_.fetch_sub(need, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "disk limit reached: the data directory %s holds %d bytes and batch %d of process %s "
        "needs %d more, over --max-disk-bytes=%d; the batch was not stored nor acknowledged: "
        "free space or raise the limit, the agent will resend it",
        options_.data_dir, before, batch.sequence(), ProcessKeyString(process->key), need,
        options_.max_disk_bytes));
  }
  if (process->fd < 0) {
    absl::Status created = CreateLog(process);
    if (!created.ok()) {
      disk_bytes_.fetch_sub(need, std::memory_order_relaxed);
      return created;
    }
  }
  absl::Status written =
      AppendAll(process->fd, process->file_bytes, record, options_.write_fn, process->path);
  if (written.ok() && options_.fsync && ::fdatasync(process->fd) != 0) {
    int err = errno;
    written = absl::InternalError(
        absl::StrFormat("%s: fdatasync failed: %s", process->path, strerror(err)));
    if (::ftruncate(process->fd, static_cast<off_t>(process->file_bytes)) != 0) {
      Log(LogLevel::kError, absl::StrFormat("%s: cannot truncate after a failed fdatasync: %s",
                                            process->path, strerror(errno)));
    }
  }
  if (!written.ok()) {
    disk_bytes_.fetch_sub(record.size(), std::memory_order_relaxed);
    return written;
  }
  process->file_bytes += record.size();
  process->acked = batch.sequence();
  process->stats.Consume(batch);
  batches_stored_.fetch_add(1, std::memory_order_relaxed);
  return process->acked;
}

absl::StatusOr<v1::Report> Collector::GetReport(const v1::ProcessKey& key) const {
  std::string name = ProcessKeyString(key);
  const Process* process = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = processes_.find(name);
    if (it == processes_.end()) {
      return absl::NotFoundError(absl::StrFormat(
          "no process %s at this collector; ListProcesses names the known ones", name));
    }
    process = it->second.get();
  }
  absl::MutexLock lock(&process->mu);
  v1::Report report = process->stats.Report();
  *report.mutable_process() = process->key;
  return report;
}

std::vector<Collector::Process*> Collector::Matching(
    const std::vector<v1::ProcessKey>& keys) const {
  std::vector<Process*> out;
  absl::MutexLock lock(&mu_);
  if (keys.empty()) {
    for (const auto& [name, process] : processes_) out.push_back(process.get());
  } else {
    for (const v1::ProcessKey& key : keys) {
      auto it = processes_.find(ProcessKeyString(key));
      if (it != processes_.end()) out.push_back(it->second.get());
    }
  }
  return out;
}

v1::ListProcessesResponse Collector::ListProcesses(bool include_finished) const {
  v1::ListProcessesResponse response;
  for (Process* process : Matching({})) {
    absl::MutexLock lock(&process->mu);
    if (process->acked == 0) continue;  // refused before its first batch was stored
    if (process->stats.finished() && !include_finished) continue;
    v1::ProcessSummary* summary = response.add_processes();
    *summary->mutable_process() = process->key;
    for (const std::string& arg : process->stats.command_line()) summary->add_command_line(arg);
    summary->set_finished(process->stats.finished());
    summary->set_events(process->stats.events());
    summary->set_peak_reserved_bytes(process->stats.PeakReservedBytes());
  }
  std::sort(response.mutable_processes()->begin(), response.mutable_processes()->end(),
            [](const v1::ProcessSummary& a, const v1::ProcessSummary& b) {
              return ProcessKeyString(a.process()) < ProcessKeyString(b.process());
            });
  return response;
}

v1::StatsUpdate Collector::Snapshot(const v1::WatchRequest& request) const {
  v1::StatsUpdate update;
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  update.set_time_ns(static_cast<uint64_t>(ts.tv_sec) * 1000000000u +
                     static_cast<uint64_t>(ts.tv_nsec));
  std::vector<v1::ProcessKey> keys(request.processes().begin(), request.processes().end());
  for (Process* process : Matching(keys)) {
    absl::MutexLock lock(&process->mu);
    if (process->acked == 0) continue;
    v1::Report report = process->stats.Report();
    v1::ProcessStats* stats = update.add_processes();
    *stats->mutable_process() = process->key;
    *stats->mutable_command_line() = report.command_line();
    stats->set_finished(report.finished());
    for (v1::DeviceReport& device : *report.mutable_devices()) {
      device.clear_timeline();
      device.clear_top_sites();
      device.clear_leaks();
      *stats->add_devices() = std::move(device);
    }
  }
  return update;
}

}  // namespace vramscope::collector
