#include "vramscope/collector/collector.h"

#include <absl/status/status.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "history/history_store.h"
#include "history/history_writer.h"
#include "vramscope/collector/batch_check.h"
#include "vramscope/collector/process_stats.h"
#include "vramscope/log.h"
#include "vramscope/process_key.h"

namespace vramscope::collector {
namespace {

bool SameKey(const v1::ProcessKey& a, const v1::ProcessKey& b) {
  return a.host() == b.host() && a.pid() == b.pid() && a.start_time_ns() == b.start_time_ns();
}

// A stable 64-bit hash of the whole process key (FNV-1a over a length-prefixed encoding, so that
// no two keys encode alike). It must not change between versions: it is part of file names.
uint64_t KeyHash(const v1::ProcessKey& key) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) {
      h ^= (value >> (8 * i)) & 0xFF;
      h *= 0x100000001b3ull;
    }
  };
  mix(key.host().size(), 8);
  for (char c : key.host()) mix(static_cast<unsigned char>(c), 1);
  mix(key.pid(), 4);
  mix(key.start_time_ns(), 8);
  return h;
}

// `<host>_<pid>_<start>_<hash>`: the host cut to 64 characters of [A-Za-z0-9.-] (others, and a
// leading dot, become '_'), so the name is safe whatever the host holds; the hash of the full key
// keeps hosts that differ only past the cut or in replaced characters apart.
std::string LogBaseName(const v1::ProcessKey& key) {
  std::string host = key.host().empty() ? "unknown-host" : key.host().substr(0, 64);
  for (char& c : host) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-';
    if (!ok) c = '_';
  }
  if (host[0] == '.') host[0] = '_';
  return absl::StrFormat("%s_%d_%d_%016x", host, key.pid(), key.start_time_ns(), KeyHash(key));
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

// The next data extent of `fd` in [from, to): {start, end}, or {to, to} when only holes are left.
// Filesystems without SEEK_DATA report everything as data.
std::pair<uint64_t, uint64_t> NextData(int fd, uint64_t from, uint64_t to) {
  off_t data = ::lseek(fd, static_cast<off_t>(from), SEEK_DATA);
  if (data < 0) return errno == ENXIO ? std::make_pair(to, to) : std::make_pair(from, to);
  if (static_cast<uint64_t>(data) >= to) return {to, to};
  off_t hole = ::lseek(fd, data, SEEK_HOLE);
  uint64_t end = hole < 0 ? to : std::min<uint64_t>(static_cast<uint64_t>(hole), to);
  return {static_cast<uint64_t>(data), end};
}

// Bytes of [from, to) that are data, not holes.
uint64_t DataBytes(int fd, uint64_t from, uint64_t to) {
  uint64_t total = 0;
  while (from < to) {
    auto [start, end] = NextData(fd, from, to);
    total += end - start;
    from = end;
  }
  return total;
}

struct Copied {
  uint64_t data_bytes = 0;  // bytes read and written
  uint64_t end = 0;         // source offset everything before which was copied (or was a hole)
};

// Copies the data of [from, to) of `in` to `out` at offset `out_base + (position - from)`, holes
// left as holes, stopping once `max_bytes` were copied.
absl::StatusOr<Copied> CopyData(int in, const std::string& in_path, uint64_t from, uint64_t to,
                                int out, const std::string& out_path, uint64_t out_base,
                                uint64_t max_bytes) {
  Copied copied;
  copied.end = from;
  std::string buffer(1 << 20, '\0');
  while (copied.end < to && copied.data_bytes < max_bytes) {
    auto [start, end] = NextData(in, copied.end, to);
    copied.end = start;
    while (copied.end < end && copied.data_bytes < max_bytes) {
      size_t chunk = static_cast<size_t>(
          std::min<uint64_t>({buffer.size(), end - copied.end, max_bytes - copied.data_bytes}));
      ssize_t n = ::pread(in, buffer.data(), chunk, static_cast<off_t>(copied.end));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return absl::InternalError(absl::StrFormat("read %s: %s", in_path, strerror(errno)));
      }
      if (n == 0) return copied;  // the file shrank under us
      for (ssize_t done = 0; done < n;) {
        ssize_t w = ::pwrite(out, buffer.data() + done, static_cast<size_t>(n - done),
                             static_cast<off_t>(out_base + copied.end - from + done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
          return absl::InternalError(
              absl::StrFormat("write %s: %s", out_path, strerror(w < 0 ? errno : EIO)));
        }
        done += w;
      }
      copied.end += static_cast<uint64_t>(n);
      copied.data_bytes += static_cast<uint64_t>(n);
    }
  }
  return copied;
}

// Makes `make(name)` succeed for the first free name of `<base>`, `<base>-2`, `<base>-3`, ...:
// an earlier aside (or a leftover of an interrupted recovery) is never overwritten.
template <typename Make>
absl::StatusOr<std::string> FirstFreeName(const std::string& base, Make make) {
  for (int n = 1; n <= 1000; ++n) {
    std::string name = n == 1 ? base : absl::StrFormat("%s-%d", base, n);
    if (make(name)) return name;
    if (errno != EEXIST) {
      return absl::InternalError(absl::StrFormat("create %s: %s", name, strerror(errno)));
    }
  }
  return absl::InternalError(absl::StrFormat("%s-2 .. -1000 all exist", base));
}

// A loading problem: kept in the report (errors or warnings) and logged.
void NoteLoad(LoadReport* report, LogLevel level, const std::string& message) {
  (level == LogLevel::kError ? report->errors : report->warnings).push_back(message);
  Log(level, message);
}

// A log file not loaded, and why.
void SkipFile(LoadReport* report, LogLevel level, const std::string& message) {
  ++report->files_skipped;
  NoteLoad(report, level, message);
}

// SetAsideDamage when only the good prefix fits the cap: the original file is kept whole under
// a free name from `base` (a hard link) and `path` replaced by a copy of its first `valid` bytes.
absl::StatusOr<std::string> KeepWholeAndRewrite(int* fd, const std::string& path,
                                                const std::string& base, uint64_t valid,
                                                bool fsync) {
  // Recovery's own scratch name: not `.vslog`, so a crash here leaves nothing to load, and
  // the next start truncates and reuses it.
  const std::string fresh = path + ".recovering";
  int out = ::open(fresh.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (out < 0) {
    return absl::InternalError(absl::StrFormat("create %s: %s", fresh, strerror(errno)));
  }
  absl::StatusOr<Copied> copied = CopyData(*fd, path, 0, valid, out, fresh, 0, valid);
  absl::Status status = copied.status();
  if (status.ok() && copied->end != valid) {
    status = absl::DataLossError(absl::StrFormat("%s shrank while being read", path));
  }
  if (status.ok() && (::ftruncate(out, static_cast<off_t>(valid)) != 0 || ::fdatasync(out))) {
    status = absl::InternalError(absl::StrFormat("write %s: %s", fresh, strerror(errno)));
  }
  absl::StatusOr<std::string> aside;
  if (status.ok()) {
    aside = FirstFreeName(
        base, [&](const std::string& name) { return ::link(path.c_str(), name.c_str()) == 0; });
    status = aside.status();
  }
  if (status.ok() && ::rename(fresh.c_str(), path.c_str()) != 0) {
    status =
        absl::InternalError(absl::StrFormat("rename %s to %s: %s", fresh, path, strerror(errno)));
    ::unlink(aside->c_str());
  }
  if (!status.ok()) {
    ::close(out);
    ::unlink(fresh.c_str());
    return status;
  }
  ::close(*fd);
  *fd = out;
  if (fsync) {
    absl::Status synced = FsyncDir(std::filesystem::path(path).parent_path().string());
    if (!synced.ok()) Log(LogLevel::kError, synced.message());
  }
  return absl::StrFormat(
      "kept in %s (the whole original file; the log was rewritten with the "
      "%d bytes before it)",
      *aside, valid);
}

// Takes the damaged bytes [valid, file_bytes) out of the log open as `*fd` at `path` without
// losing them and without writing more than `max_copy` bytes, whatever their size:
//   * their data (holes are skipped: a sparse tail costs nothing) fits the cap: copied to
//     `<path>.corrupt-<valid>`, holes kept, and the log truncated;
//   * otherwise, when the good prefix fits the cap: the original file is kept whole as
//     `<path>.corrupt-<valid>` (a hard link, nothing copied) and `path` replaced by a new file
//     holding the prefix; `*fd` then refers to the new file;
//   * both over the cap: the first `max_copy` bytes of the tail's data are copied, the rest is
//     dropped with the truncation.
// Returns what happened to the bytes, for the error line; on failure the log is untouched.
absl::StatusOr<std::string> SetAsideDamage(int* fd, const std::string& path, uint64_t valid,
                                           uint64_t file_bytes, uint64_t max_copy, bool fsync) {
  const uint64_t tail_data = DataBytes(*fd, valid, file_bytes);
  const std::string base = absl::StrFormat("%s.corrupt-%d", path, valid);
  if (tail_data > max_copy && valid <= max_copy) {
    return KeepWholeAndRewrite(fd, path, base, valid, fsync);
  }

  int out = -1;
  absl::StatusOr<std::string> aside = FirstFreeName(base, [&](const std::string& name) {
    out = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    return out >= 0;
  });
  if (!aside.ok()) return aside.status();
  absl::StatusOr<Copied> copied = CopyData(*fd, path, valid, file_bytes, out, *aside, 0, max_copy);
  absl::Status status = copied.status();
  // Trailing holes are part of the tail too: the copy gets the same length, still sparse.
  if (status.ok() && ::ftruncate(out, static_cast<off_t>(copied->end - valid)) != 0) {
    status = absl::InternalError(absl::StrFormat("truncate %s: %s", *aside, strerror(errno)));
  }
  if (status.ok() && fsync && ::fdatasync(out) != 0) {
    status = absl::InternalError(absl::StrFormat("fdatasync %s: %s", *aside, strerror(errno)));
  }
  ::close(out);
  if (!status.ok()) {
    ::unlink(aside->c_str());
    return status;
  }
  if (::ftruncate(*fd, static_cast<off_t>(valid)) != 0) {
    return absl::InternalError(
        absl::StrFormat("cannot truncate %s to %d bytes: %s", path, valid, strerror(errno)));
  }
  if (copied->end < file_bytes) {
    return absl::StrFormat(
        "copied to %s only up to offset %d (%d bytes of data, the cap); the %d bytes after "
        "that were dropped",
        *aside, copied->end, copied->data_bytes, file_bytes - copied->end);
  }
  const uint64_t holes = file_bytes - valid - copied->data_bytes;
  return absl::StrCat("moved to ", *aside,
                      holes == 0 ? "" : absl::StrFormat(" (%d of them holes, kept sparse)", holes));
}

uint64_t WallNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

// The stats of the process logged in `path`, rebuilt by reading every batch of the log again.
absl::StatusOr<std::unique_ptr<ProcessStats>> RebuildStats(
    const std::string& path, const std::vector<v1::SequenceRange>& skip = {}) {
  auto stats = std::make_unique<ProcessStats>();
  LogScan scan;
  absl::Status status = ReadLog(
      path,
      [&](uint64_t, absl::string_view payload) -> absl::Status {
        v1::EventBatch batch;
        if (!batch.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
          return absl::DataLossError("payload is not an EventBatch");
        }
        for (const v1::SequenceRange& range : skip) {
          if (batch.sequence() >= range.first() && batch.sequence() <= range.last()) {
            return absl::OkStatus();
          }
        }
        stats->Consume(batch);
        return absl::OkStatus();
      },
      &scan);
  if (!status.ok()) return status;
  if (scan.damaged) {
    return absl::DataLossError(
        absl::StrFormat("%s: damaged at offset %d: %s", path, scan.valid_bytes, scan.damage));
  }
  return stats;
}

void FillSummary(const v1::ProcessKey& key, const ProcessStats& stats,
                 const std::vector<v1::SequenceRange>& held, v1::ProcessSummary* summary) {
  *summary->mutable_process() = key;
  for (const std::string& arg : stats.command_line()) summary->add_command_line(arg);
  summary->set_finished(stats.finished());
  if (stats.finished()) {
    const v1::ProcessExitEvent& exit = stats.exit();
    summary->set_exit_code(exit.exit_code());
    summary->set_killed(exit.killed());
    summary->set_signal(exit.signal());
    summary->set_vanished(exit.vanished());
  }
  summary->set_events(stats.events());
  for (const auto& [name, value] : stats.labels()) (*summary->mutable_labels())[name] = value;
  summary->set_peak_reserved_bytes(stats.PeakReservedBytes());
  summary->mutable_held()->Assign(held.begin(), held.end());
}

void FillLiveStats(const v1::ProcessKey& key, const ProcessStats& stats,
                   const std::vector<v1::SequenceRange>& held, v1::ProcessStats* out) {
  v1::Report report = stats.LiveReport();
  *out->mutable_process() = key;
  *out->mutable_command_line() = report.command_line();
  *out->mutable_labels() = report.labels();
  out->set_finished(report.finished());
  out->set_exit_code(report.exit_code());
  out->set_killed(report.killed());
  out->set_signal(report.signal());
  out->set_vanished(report.vanished());
  for (v1::DeviceReport& device : *report.mutable_devices()) {
    device.clear_timeline();
    device.clear_top_sites();
    device.clear_leaks();
    device.clear_allocation_sites();  // the leaks' sites
    *out->add_devices() = std::move(device);
  }
  out->mutable_held()->Assign(held.begin(), held.end());
}

// What a metrics scrape shows of a process whose engine is `stats`.
ProcessGaugeSnapshot GaugeSnapshot(const v1::ProcessKey& key, const ProcessStats& stats) {
  ProcessGaugeSnapshot shown;
  shown.key = key;
  const std::vector<std::string>& args = stats.command_line();
  if (!args.empty()) {
    const size_t slash = args[0].rfind('/');
    shown.comm = slash == std::string::npos ? args[0] : args[0].substr(slash + 1);
  }
  shown.labels = stats.labels();
  shown.finished = stats.finished();
  shown.devices = stats.Gauges();
  return shown;
}

}  // namespace

struct Collector::Process {
  v1::ProcessKey key;
  // The identity of the writer that created it ("" when recovered from the data directory):
  // the quota it counts against. Set once, before the process is shared.
  std::string writer;
  mutable absl::Mutex mu;
  std::string path ABSL_GUARDED_BY(mu);
  int fd ABSL_GUARDED_BY(mu) = -1;
  uint64_t file_bytes ABSL_GUARDED_BY(mu) = 0;
  uint64_t acked ABSL_GUARDED_BY(mu) = 0;
  // Sequence ranges held, in order; the last one ends at `acked`.
  std::vector<v1::SequenceRange> held ABSL_GUARDED_BY(mu);
  // Null once retired (finished and out of the live table).
  std::unique_ptr<ProcessStats> stats ABSL_GUARDED_BY(mu) = std::make_unique<ProcessStats>();
  // While retired: what ListProcesses and Watch show of it.
  v1::ProcessSummary summary ABSL_GUARDED_BY(mu);
  v1::ProcessStats live ABSL_GUARDED_BY(mu);
  // While live: the Watch figures (FillLiveStats) as of `live_cached_at`, a count of the changes
  // to the engine (`changes`: batches stored, rebuilds); a snapshot rebuilds them only after a
  // change, so an idle process costs a Watch tick a copy instead of a report.
  uint64_t changes ABSL_GUARDED_BY(mu) = 1;
  uint64_t live_cached_at ABSL_GUARDED_BY(mu) = 0;
  v1::ProcessStats live_cache ABSL_GUARDED_BY(mu);
  // Wall clock when its exit was stored (MetricsSnapshot's), and what a metrics scrape shows of
  // it once retired.
  uint64_t finished_wall_ns ABSL_GUARDED_BY(mu) = 0;
  ProcessGaugeSnapshot gauges ABSL_GUARDED_BY(mu);

  bool retired() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return stats == nullptr; }
  // Records that `sequence` is now held (the next one, or past a gap).
  void Hold(uint64_t sequence) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (held.empty() || sequence != acked + 1) {
      v1::SequenceRange& range = held.emplace_back();
      range.set_first(sequence);
    }
    held.back().set_last(sequence);
    acked = sequence;
  }

  ~Process() {
    if (fd >= 0) ::close(fd);
  }
};

Collector::Collector(CollectorOptions options) : options_(std::move(options)) {}
Collector::~Collector() {
  // The writer's thread reads batches_stored_ (its activity): it stops first.
  history_.reset();
}

absl::StatusOr<std::unique_ptr<Collector>> Collector::Open(CollectorOptions options,
                                                           LoadReport* load_report) {
  if (options.data_dir.empty()) {
    return absl::InvalidArgumentError("no data directory: pass --data-dir=DIR");
  }
  // The logs hold command lines and allocation sites: the directory is the owner's alone (0700
  // when created here; an existing directory keeps its mode). Parents get the usual mode.
  std::error_code ec;
  std::filesystem::path dir(options.data_dir);
  if (dir.filename().empty()) dir = dir.parent_path();  // "DIR/"
  if (dir.has_parent_path()) std::filesystem::create_directories(dir.parent_path(), ec);
  if (!ec && ::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    ec = std::error_code(errno, std::generic_category());
  }
  if (!ec && !std::filesystem::is_directory(dir, ec) && !ec) {
    ec = std::make_error_code(std::errc::not_a_directory);
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot create the data directory %s: %s", options.data_dir, ec.message()));
  }
  std::unique_ptr<Collector> collector(new Collector(std::move(options)));
  LoadReport local;
  absl::Status status = collector->Load(load_report ? load_report : &local);
  if (!status.ok()) return status;
  if (collector->options_.database != "off") {
    absl::StatusOr<std::unique_ptr<HistoryStore>> store =
        OpenHistoryStore(collector->options_.database, collector->options_.data_dir);
    if (!store.ok()) return store.status();
    absl::StatusOr<std::unique_ptr<HistoryWriter>> writer = HistoryWriter::Start(
        {.queue_dir = collector->options_.data_dir + "/history-queue",
         .retry_max = collector->options_.history_retry_max,
         .rebuild = [](const std::string& log_path) -> absl::StatusOr<v1::Report> {
           absl::StatusOr<std::unique_ptr<ProcessStats>> stats = RebuildStats(log_path);
           if (!stats.ok()) return stats.status();
           return (*stats)->Report();
         },
         // History waits while batches arrive (README "Run history"); ~Collector stops the
         // writer before the counter goes.
         .activity = [c = collector.get()] { return c->batches_stored(); },
         .quiet = collector->options_.history_quiet,
         .max_defer = collector->options_.history_max_defer,
         .max_waiting = collector->options_.history_max_waiting},
        *std::move(store));
    if (!writer.ok()) return writer.status();
    collector->history_ = *std::move(writer);
  }
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
  Log(LogLevel::kInfo,
      absl::StrFormat("recovering %d process logs from %s", paths.size(), options_.data_dir));
  for (const std::string& path : paths) LoadFile(path, report);
  Log(LogLevel::kInfo,
      absl::StrFormat("loaded %d process logs from %s (%d batches, %d events, %d bytes); %d files "
                      "skipped, %d errors, %d warnings",
                      report->files_loaded, options_.data_dir, report->batches, report->events,
                      disk_bytes(), report->files_skipped, report->errors.size(),
                      report->warnings.size()));
  return absl::OkStatus();
}

void Collector::LoadFile(const std::string& path, LoadReport* report) {
  // One descriptor from here on: reading, truncating and, once loaded, appending all act on the
  // file that was checked, never on whatever the name points at later.
  absl::StatusOr<int> opened = OpenRegularFile(path, O_RDWR);
  if (!opened.ok()) {
    // A FIFO, link or device where a log belongs is someone else's doing: warn and go on.
    SkipFile(report,
             absl::IsFailedPrecondition(opened.status()) ? LogLevel::kWarning : LogLevel::kError,
             std::string(opened.status().message()));
    return;
  }
  auto process = std::make_shared<Process>();
  absl::MutexLock process_lock(&process->mu);
  process->fd = *opened;  // closed with `process` unless it is kept
  struct stat st {};
  if (::fstat(process->fd, &st) == 0 && static_cast<uint64_t>(st.st_size) < kLogMagic.size()) {
    std::string head(static_cast<size_t>(st.st_size), '\0');
    if (::pread(process->fd, head.data(), head.size(), 0) == st.st_size &&
        absl::StartsWith(kLogMagic, head)) {
      // The collector died while creating the file, before its first record.
      Log(LogLevel::kInfo, absl::StrFormat("%s: an unfinished empty log; removed", path));
      ::unlink(path.c_str());
      return;
    }
  }
  uint64_t events = 0;
  LogScan scan;
  absl::Status status = ReadLog(process.get(), path, &scan, &events);
  if (!status.ok()) {
    SkipFile(report, LogLevel::kError, std::string(status.message()));
    return;
  }
  if (scan.damaged && !CutDamage(process.get(), path, scan, report)) return;
  if (process->acked == 0) {
    // Nothing but the magic: the collector died between creating the file and its first record.
    Log(LogLevel::kInfo, absl::StrFormat("%s: holds no batches; removed", path));
    ::unlink(path.c_str());
    return;
  }
  Adopt(std::move(process), path, scan, events, report);
}

absl::Status Collector::ReadLog(Process* process, const std::string& path, LogScan* scan,
                                uint64_t* events) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Called with process->mu held.
  return ReadLogFd(
      process->fd, path,
      [&](uint64_t, absl::string_view payload) -> absl::Status {
        v1::EventBatch batch;
        if (!batch.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
          return absl::DataLossError("payload is not an EventBatch");
        }
        // The key is the first accepted batch's (acked is 0 until then).
        if (process->acked != 0 && !SameKey(batch.process(), process->key)) {
          return absl::DataLossError(absl::StrFormat("batch of process %s in the log of %s",
                                                     ProcessKeyString(batch.process()),
                                                     ProcessKeyString(process->key)));
        }
        // A jump forward is a takeover or a return after a failover (the sequences between are
        // at another collector); going back is damage.
        if (batch.sequence() <= process->acked || batch.sequence() == 0) {
          return absl::DataLossError(absl::StrFormat("sequence %d where %d was expected",
                                                     batch.sequence(), process->acked + 1));
        }
        if (process->acked == 0) process->key = batch.process();
        process->Hold(batch.sequence());
        ++process->changes;
        process->stats->Consume(batch);
        *events += static_cast<uint64_t>(batch.events_size());
        return absl::OkStatus();
      },
      scan);
}

bool Collector::CutDamage(Process* process, const std::string& path, const LogScan& scan,
                          LoadReport* report) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Called with process->mu held.
  uint64_t cut = scan.file_bytes - scan.valid_bytes;
  std::string kept = absl::StrFormat("%d good records before it (up to sequence %d) kept",
                                     scan.records, process->acked);
  bool truncated = false;
  if (scan.damaged_is_tail) {
    NoteLoad(report, LogLevel::kWarning,
             absl::StrFormat("%s: %s; truncated the torn tail (%d bytes), %s", path, scan.damage,
                             cut, kept));
  } else {
    absl::StatusOr<std::string> aside =
        SetAsideDamage(&process->fd, path, scan.valid_bytes, scan.file_bytes,
                       options_.max_aside_copy_bytes, options_.fsync);
    truncated = aside.ok();
    NoteLoad(report, LogLevel::kError,
             absl::StrFormat(
                 "%s: corrupt %s; %s; the %d bytes from there on were %s and cut from "
                 "the log",
                 path, scan.damage, kept, cut,
                 aside.ok() ? *aside : absl::StrCat("NOT saved (", aside.status().message(), ")")));
  }
  if (!truncated && ::ftruncate(process->fd, static_cast<off_t>(scan.valid_bytes)) != 0) {
    SkipFile(report, LogLevel::kError,
             absl::StrFormat("%s: cannot truncate to %d bytes: %s; file skipped", path,
                             scan.valid_bytes, strerror(errno)));
    return false;
  }
  report->truncated_bytes += cut;
  return true;
}

void Collector::Adopt(std::shared_ptr<Process> process, const std::string& path,
                      const LogScan& scan, uint64_t events,
                      LoadReport* report) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Called with process->mu held.
  std::string key = ProcessKeyString(process->key);
  absl::MutexLock lock(&mu_);
  if (processes_.contains(key) || finished_.contains(key)) {
    SkipFile(
        report, LogLevel::kError,
        absl::StrFormat("%s: a second log of process %s; skipped (move one of the two out of %s)",
                        path, key, options_.data_dir));
    return;
  }
  int flags = ::fcntl(process->fd, F_GETFL);
  if (flags < 0 || ::fcntl(process->fd, F_SETFL, flags | O_APPEND) != 0) {
    SkipFile(
        report, LogLevel::kError,
        absl::StrFormat("%s: cannot open for appending: %s; file skipped", path, strerror(errno)));
    return;
  }
  process->path = path;
  process->file_bytes = scan.valid_bytes;
  disk_bytes_.fetch_add(scan.valid_bytes, std::memory_order_relaxed);
  ++report->files_loaded;
  report->batches += scan.records;
  report->events += events;
  if (process->stats->finished()) {
    // Recovered finished processes go straight to the finished table (no engine, no descriptor).
    FillSummary(process->key, *process->stats, process->held, &process->summary);
    FillLiveStats(process->key, *process->stats, process->held, &process->live);
    process->stats.reset();
    ::close(process->fd);
    process->fd = -1;
    finished_.emplace(key, std::move(process));
    return;
  }
  processes_.emplace(key, std::move(process));
}

absl::Status Collector::CreateLog(Process* process) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Called with process->mu held.
  const std::string base = absl::StrCat(options_.data_dir, "/", LogBaseName(process->key));
  std::string path = absl::StrCat(base, ".vslog");
  int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) {
    // Taken: a file this collector skipped at start (damaged, a FIFO, a second log of this
    // process), or a hash collision. A random suffix cannot run out.
    path = absl::StrCat(base, "-XXXXXX.vslog");
    fd = ::mkostemps(path.data(), 6, O_APPEND | O_CLOEXEC);
  }
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

std::shared_ptr<Collector::Process> Collector::FindLocked(const std::string& name) const {
  auto it = processes_.find(name);
  if (it != processes_.end()) return it->second;
  it = finished_.find(name);
  if (it != finished_.end()) return it->second;
  return nullptr;
}

std::shared_ptr<Collector::Process> Collector::Find(const v1::ProcessKey& key) const {
  absl::MutexLock lock(&mu_);
  return FindLocked(ProcessKeyString(key));
}

size_t Collector::live_processes() const {
  absl::MutexLock lock(&mu_);
  return processes_.size();
}

size_t Collector::finished_processes() const {
  absl::MutexLock lock(&mu_);
  return finished_.size();
}

absl::StatusOr<std::shared_ptr<Collector::Process>> Collector::FindOrCreate(
    const v1::ProcessKey& key, uint64_t sequence, bool takeover, absl::string_view writer) {
  const std::string name = ProcessKeyString(key);
  absl::MutexLock lock(&mu_);
  if (std::shared_ptr<Process> found = FindLocked(name)) return found;
  if (sequence != 1 && !takeover) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "sequence gap for process %s: the collector holds none of its batches and expects "
        "sequence 1, got %d; resend from sequence 1",
        name, sequence));
  }
  // The limit is each writer's own (per token, or per client certificate): one client filling
  // its quota cannot lock out the others' agents.
  uint32_t& held = processes_by_writer_[writer];
  if (held >= options_.max_processes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s already has %d live processes at this collector (--max-processes=%d per writer; "
        "finished ones do not count); process %s refused (other writers are not affected)",
        writer.empty() ? std::string("this writer") : absl::StrCat("writer \"", writer, "\""), held,
        options_.max_processes, name));
  }
  ++held;
  auto created = std::make_shared<Process>();
  created->key = key;
  created->writer = std::string(writer);
  processes_.emplace(name, created);
  return created;
}

std::unique_ptr<ProcessStats> Collector::Retire(Process* process) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Called with process->mu held; takes mu_ after it, the order LoadFile uses.
  process->summary.Clear();
  process->live.Clear();
  FillSummary(process->key, *process->stats, process->held, &process->summary);
  FillLiveStats(process->key, *process->stats, process->held, &process->live);
  process->gauges = GaugeSnapshot(process->key, *process->stats);
  std::unique_ptr<ProcessStats> released = std::move(process->stats);
  ++process->changes;
  process->live_cache.Clear();
  if (process->fd >= 0) ::close(process->fd);
  process->fd = -1;
  const std::string name = ProcessKeyString(process->key);
  absl::MutexLock lock(&mu_);
  auto it = processes_.find(name);
  if (it == processes_.end()) return released;
  if (auto held = processes_by_writer_.find(process->writer);
      held != processes_by_writer_.end() && held->second > 0) {
    --held->second;
  }
  finished_.emplace(name, std::move(it->second));
  processes_.erase(it);
  return released;
}

absl::Status Collector::Revive(Process* process) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Called with process->mu held. A batch after the process's exit (a late DropEvent, counters):
  // rare, so the engine is simply rebuilt from the log.
  const std::string name = ProcessKeyString(process->key);
  {
    absl::MutexLock lock(&mu_);
    if (processes_by_writer_[process->writer] >= options_.max_processes) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "the writer of process %s already has %d live processes (--max-processes=%d per "
          "writer); a batch of the finished process refused",
          name, processes_by_writer_[process->writer], options_.max_processes));
    }
  }
  absl::StatusOr<std::unique_ptr<ProcessStats>> stats = RebuildStats(process->path);
  if (!stats.ok()) return absl::InternalError(stats.status().message());
  ++process->changes;
  absl::StatusOr<int> fd = OpenRegularFile(process->path, O_WRONLY | O_APPEND);
  if (!fd.ok()) return absl::InternalError(fd.status().message());
  struct stat st {};
  if (::fstat(*fd, &st) != 0) {
    ::close(*fd);
    return absl::InternalError(absl::StrFormat("fstat %s: %s", process->path, strerror(errno)));
  }
  process->fd = *fd;
  process->file_bytes = static_cast<uint64_t>(st.st_size);
  process->stats = std::move(*stats);
  absl::MutexLock lock(&mu_);
  auto it = finished_.find(name);
  if (it != finished_.end()) {
    processes_.emplace(name, std::move(it->second));
    finished_.erase(it);
    ++processes_by_writer_[process->writer];
  }
  return absl::OkStatus();
}

uint64_t Collector::StoredSequence(const v1::ProcessKey& key) const {
  std::shared_ptr<Process> process = Find(key);
  if (process == nullptr) return 0;
  // Not under mu_: loading takes a process's lock first and mu_ second.
  absl::MutexLock process_lock(&process->mu);
  return process->acked;
}

absl::StatusOr<uint64_t> Collector::Ingest(const v1::EventBatch& batch, absl::string_view wire,
                                           bool takeover, absl::string_view writer) {
  // Bytes from the wire were parsed, which checks every string; a batch built in memory was not.
  absl::Status valid = wire.empty() ? ValidateBatch(batch) : ValidateBatchHeader(batch);
  if (!valid.ok()) return valid;
  if (batch.sequence() == 0) {
    // A probe: an agent asks where this process stands before it sends anything.
    return StoredSequence(batch.process());
  }
  absl::StatusOr<std::shared_ptr<Process>> found =
      FindOrCreate(batch.process(), batch.sequence(), takeover, writer);
  if (!found.ok()) return found.status();
  Process* process = found->get();
  absl::MutexLock lock(&process->mu);
  return Append(process, batch, nullptr, wire, takeover);
}

absl::StatusOr<uint64_t> Collector::Ingest(const IngestMessage& message, absl::string_view wire,
                                           bool takeover, absl::string_view writer) {
  if (message.kind != IngestMessage::Kind::kBatch || message.batch == nullptr) {
    return absl::InvalidArgumentError("not a batch to store");
  }
  if (message.decoded == nullptr) return Ingest(*message.batch, wire, takeover, writer);
  // CheckIngestMessage validated it (the decoded events hold no strings).
  const v1::EventBatch& batch = *message.batch;
  if (batch.sequence() == 0) return StoredSequence(batch.process());
  absl::StatusOr<std::shared_ptr<Process>> found =
      FindOrCreate(batch.process(), batch.sequence(), takeover, writer);
  if (!found.ok()) return found.status();
  Process* process = found->get();
  absl::MutexLock lock(&process->mu);
  return Append(process, batch, message.decoded, wire, takeover);
}

absl::StatusOr<uint64_t> Collector::Refuse(const IngestMessage& refused, bool takeover,
                                           absl::string_view writer) {
  batches_refused_.fetch_add(1, std::memory_order_relaxed);
  const v1::ProcessKey& key = refused.process;
  const uint64_t sequence = refused.sequence;
  const uint64_t events = refused.events;
  // A key that cannot be filed gets nothing stored: every batch naming it is refused alike, so
  // there is no sequence to keep contiguous. (A host that is not UTF-8 arrives escaped in
  // `process`, which would validate: key_usable says what the sender's key was.)
  if (!refused.key_usable || !ValidateProcessKey(key).ok()) return uint64_t{0};
  if (sequence == 0) return StoredSequence(key);
  absl::StatusOr<std::shared_ptr<Process>> found = FindOrCreate(key, sequence, takeover, writer);
  if (!found.ok()) return found.status();
  Process* process = found->get();
  absl::MutexLock lock(&process->mu);
  // The sequence is consumed like a stored batch's: a DropEvent for the refused batch's events
  // stands in for it, so the process's later batches follow without a gap (also after a
  // restart, which reads the log back) and its report counts the loss in dropped_records.
  v1::EventBatch stand_in;
  *stand_in.mutable_process() = key;
  stand_in.set_sequence(sequence);
  stand_in.add_events()->mutable_drop()->set_dropped_records(events);
  return Append(process, stand_in, nullptr, {}, takeover);
}

absl::StatusOr<uint64_t> Collector::Append(Process* process, const v1::EventBatch& batch,
                                           const std::vector<BatchEvent>* decoded,
                                           absl::string_view wire,
                                           bool takeover) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Called with process->mu held.
  if (batch.sequence() <= process->acked) {  // a resend: already stored
    batches_duplicate_.fetch_add(1, std::memory_order_relaxed);
    return process->acked;
  }
  if (batch.sequence() != process->acked + 1 && takeover) {
    Log(LogLevel::kInfo,
        absl::StrFormat("process %s %s at sequence %d (sequences %d..%d are at another collector)",
                        ProcessKeyString(process->key), process->acked == 0 ? "taken over" : "back",
                        batch.sequence(), process->acked + 1, batch.sequence() - 1));
  } else if (batch.sequence() != process->acked + 1) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "sequence gap for process %s: stored up to %d, got %d; resend from sequence %d",
        ProcessKeyString(process->key), process->acked, batch.sequence(), process->acked + 1));
  }
  if (process->retired()) {
    absl::Status revived = Revive(process);
    if (!revived.ok()) return revived;
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
  ++process->changes;
  process->Hold(batch.sequence());
  const bool was_finished = process->stats->finished();
  process->stats->Consume(batch, decoded);
  CountStored(process,
              decoded != nullptr ? decoded->size() : static_cast<uint64_t>(batch.events_size()),
              was_finished);
  const bool newly_finished = !was_finished && process->stats->finished();
  const uint64_t acked = process->acked;
  if (process->stats->finished()) QueueFinishedRun(process, newly_finished);
  return acked;
}

void Collector::QueueFinishedRun(Process* process,
                                 bool newly_finished) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Called with process->mu held, the process finished: it leaves the live table.
  std::shared_ptr<const ProcessStats> released = Retire(process);
  if (history_ == nullptr || !newly_finished) return;
  // Its row: the history thread builds the report from the released engine (a report of a
  // long run costs milliseconds: not on the ingest thread) and writes the database; here only
  // a journal line naming the log is written (README "Run history").
  if (absl::Status queued =
          history_->EnqueueBuild(process->path, [released] { return released->Report(); });
      !queued.ok()) {
    Log(LogLevel::kError, absl::StrFormat("history: run of %s not queued: %s",
                                          ProcessKeyString(process->key), queued.message()));
  }
}

void Collector::CountStored(Process* process, uint64_t events,
                            bool was_finished) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Called with process->mu held, the engine live.
  batches_stored_.fetch_add(1, std::memory_order_relaxed);
  events_stored_.fetch_add(events, std::memory_order_relaxed);
  const uint64_t now = WallNs();
  if (!was_finished && process->stats->finished()) process->finished_wall_ns = now;
  const uint64_t last = process->stats->LastEventWallNs();
  if (events == 0 || last == 0) return;
  // A clock ahead of ours on the traced host reads as no lag rather than a negative one.
  const uint64_t lag_ns = now > last ? now - last : 0;
  const double seconds = static_cast<double>(lag_ns) / 1e9;
  size_t bucket = 0;
  while (bucket < kIngestLagBounds.size() && seconds > kIngestLagBounds[bucket]) ++bucket;
  lag_buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  lag_sum_ns_.fetch_add(lag_ns, std::memory_order_relaxed);
}

absl::StatusOr<v1::Report> Collector::GetReport(const v1::ProcessKey& key,
                                                const std::vector<v1::SequenceRange>& skip) const {
  std::shared_ptr<Process> process = Find(key);
  if (process == nullptr) {
    return absl::NotFoundError(
        absl::StrFormat("no process %s at this collector; ListProcesses names the known ones",
                        ProcessKeyString(key)));
  }
  absl::MutexLock lock(&process->mu);
  v1::Report report;
  if (process->retired() || !skip.empty()) {
    // Finished: its engine was released; the log holds everything it was built from. With
    // sequences to skip, the engine's figures include them: the log is read again as well.
    absl::StatusOr<std::unique_ptr<ProcessStats>> stats = RebuildStats(process->path, skip);
    if (!stats.ok()) return absl::InternalError(stats.status().message());
    report = (*stats)->Report();
  } else {
    report = process->stats->Report();
  }
  *report.mutable_process() = process->key;
  // What the report was computed from: the held ranges less `skip`.
  for (const v1::SequenceRange& range : process->held) {
    uint64_t first = range.first();
    while (first <= range.last()) {
      uint64_t last = range.last();
      bool skipped = false;
      for (const v1::SequenceRange& gap : skip) {
        if (gap.first() <= first && first <= gap.last()) {
          // Past the end of the range (also when gap.last() is the largest sequence).
          first = gap.last() >= range.last() ? range.last() : gap.last();
          skipped = true;
          break;
        }
        if (gap.first() > first && gap.first() <= last) last = gap.first() - 1;
      }
      if (skipped) {
        if (first == range.last()) break;
        ++first;
        continue;
      }
      v1::SequenceRange* held = report.add_held();
      held->set_first(first);
      held->set_last(last);
      if (last == range.last()) break;
      first = last + 1;
    }
  }
  return report;
}

std::vector<std::shared_ptr<Collector::Process>> Collector::Matching(
    const std::vector<v1::ProcessKey>& keys) const {
  std::vector<std::shared_ptr<Process>> out;
  absl::MutexLock lock(&mu_);
  if (keys.empty()) {
    out.reserve(processes_.size() + finished_.size());
    for (const auto& [name, process] : processes_) out.push_back(process);
    for (const auto& [name, process] : finished_) out.push_back(process);
  } else {
    for (const v1::ProcessKey& key : keys) {
      const std::string name = ProcessKeyString(key);
      auto it = processes_.find(name);
      if (it != processes_.end()) {
        out.push_back(it->second);
      } else if (it = finished_.find(name); it != finished_.end()) {
        out.push_back(it->second);
      }
    }
  }
  return out;
}

v1::ListProcessesResponse Collector::ListProcesses(bool include_finished) const {
  v1::ListProcessesResponse response;
  for (const std::shared_ptr<Process>& process : Matching({})) {
    absl::MutexLock lock(&process->mu);
    if (process->acked == 0) continue;  // refused before its first batch was stored
    if (process->retired()) {
      if (include_finished) *response.add_processes() = process->summary;
      continue;
    }
    if (process->stats->finished() && !include_finished) continue;
    FillSummary(process->key, *process->stats, process->held, response.add_processes());
  }
  std::sort(response.mutable_processes()->begin(), response.mutable_processes()->end(),
            [](const v1::ProcessSummary& a, const v1::ProcessSummary& b) {
              return ProcessKeyString(a.process()) < ProcessKeyString(b.process());
            });
  return response;
}

v1::StatsUpdate Collector::Snapshot(const v1::WatchRequest& request) const {
  v1::StatsUpdate update;
  update.set_time_ns(WallNs());
  std::vector<v1::ProcessKey> keys(request.processes().begin(), request.processes().end());
  for (const std::shared_ptr<Process>& process : Matching(keys)) {
    absl::MutexLock lock(&process->mu);
    if (process->acked == 0) continue;
    if (process->retired()) {
      *update.add_processes() = process->live;
      continue;
    }
    if (process->live_cached_at != process->changes) {
      process->live_cache.Clear();
      FillLiveStats(process->key, *process->stats, process->held, &process->live_cache);
      process->live_cached_at = process->changes;
    }
    *update.add_processes() = process->live_cache;
  }
  return update;
}

MetricsSnapshot Collector::Metrics(uint64_t finished_since_ns) const {
  MetricsSnapshot out;
  out.events_stored = events_stored_.load(std::memory_order_relaxed);
  out.batches_stored = batches_stored();
  out.batches_duplicate = batches_duplicate();
  out.batches_refused = batches_refused();
  out.disk_bytes = disk_bytes();
  for (size_t i = 0; i < out.lag_buckets.size(); ++i) {
    out.lag_buckets[i] = lag_buckets_[i].load(std::memory_order_relaxed);
  }
  out.lag_sum_seconds = static_cast<double>(lag_sum_ns_.load(std::memory_order_relaxed)) / 1e9;
  for (const std::shared_ptr<Process>& process : Matching({})) {
    absl::MutexLock lock(&process->mu);
    if (process->acked == 0) continue;
    const bool finished = process->retired() || process->stats->finished();
    ++(finished ? out.processes_finished : out.processes_live);
    if (finished &&
        (process->finished_wall_ns == 0 || process->finished_wall_ns < finished_since_ns)) {
      continue;
    }
    ProcessGaugeSnapshot& shown = out.processes.emplace_back(
        process->retired() ? process->gauges : GaugeSnapshot(process->key, *process->stats));
    shown.finished = finished;
    shown.finished_wall_ns = process->finished_wall_ns;
  }
  return out;
}

}  // namespace vramscope::collector
