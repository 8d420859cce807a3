#include "vramscope/agent/outbox.h"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_replace.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>
#include <utility>

#include "vramscope/agent/log.h"

namespace vramscope::agent {
namespace {

std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};

std::string FileSafe(const std::string& text) {
  std::string out = text.empty() ? "unknown" : text.substr(0, 64);
  for (char& c : out) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-';
    if (!ok) c = '_';
  }
  return out;
}

bool WriteWholeFile(const std::string& path, const std::string& bytes, std::string* error) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    *error = strerror(errno);
    return false;
  }
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error = n < 0 ? strerror(errno) : "short write";
      ::close(fd);
      ::unlink(path.c_str());
      return false;
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return true;
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
      absl::StrFormat("vramscope-agent %c %02d:%02d:%02d.%03d %s\n", tag, utc.tm_hour, utc.tm_min,
                      utc.tm_sec, ts.tv_nsec / 1000000, message);
  ssize_t ignored = ::write(2, line.data(), line.size());
  (void)ignored;
}

void SetMinLogLevel(LogLevel level) { g_min_level.store(static_cast<int>(level)); }

std::string ProcessKeyString(const v1::ProcessKey& key) {
  return absl::StrFormat("%s/%d/%d", key.host(), key.pid(), key.start_time_ns());
}

Outbox::Outbox(OutboxOptions options) : options_(std::move(options)) {
  if (options_.spool_dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(options_.spool_dir, ec);
  if (ec) {
    Log(LogLevel::kError, absl::StrFormat("cannot create the spool directory %s: %s; spooling "
                                          "will fail and overflow will be dropped",
                                          options_.spool_dir, ec.message()));
    return;
  }
  // Batches spooled by an earlier agent carry that agent's sequence numbers, which this one
  // cannot continue; they are discarded, and said so.
  int stale = 0;
  for (const auto& entry : std::filesystem::directory_iterator(options_.spool_dir, ec)) {
    if (absl::EndsWith(entry.path().string(), ".batch")) {
      std::filesystem::remove(entry.path(), ec);
      ++stale;
    }
  }
  if (stale > 0) {
    Log(LogLevel::kWarning,
        absl::StrFormat("discarded %d batches spooled in %s by an earlier agent run", stale,
                        options_.spool_dir));
  }
}

Outbox::~Outbox() {
  absl::MutexLock lock(&mu_);
  for (Entry& entry : pending_) Forget(entry);
}

bool Outbox::Spool(Entry& entry, const v1::EventBatch& batch) {
  entry.spool_path =
      absl::StrFormat("%s/%s_%d.batch", options_.spool_dir,
                      FileSafe(absl::StrReplaceAll(entry.process, {{"/", "_"}})), entry.sequence);
  std::string error;
  if (!WriteWholeFile(entry.spool_path, batch.SerializeAsString(), &error)) {
    Log(LogLevel::kError, absl::StrFormat("cannot spool batch %d of %s to %s: %s", entry.sequence,
                                          entry.process, entry.spool_path, error));
    entry.spool_path.clear();
    return false;
  }
  counters_.spool_bytes += entry.bytes;
  ++counters_.batches_spooled;
  return true;
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

bool Outbox::Add(v1::EventBatch batch) {
  absl::MutexLock lock(&mu_);
  const std::string name = ProcessKeyString(batch.process());
  Process& process = processes_[name];
  if (process.next_sequence == 1 && process.acked == 0) process.key = batch.process();
  if (process.pending_drop_events > 0) {
    v1::Event* drop = batch.add_events();
    drop->set_time_ns(batch.events_size() > 1 ? batch.events(0).time_ns() : 0);
    drop->mutable_drop()->set_dropped_records(process.pending_drop_events);
    auto* events = batch.mutable_events();
    std::rotate(events->pointer_begin(), events->pointer_end() - 1, events->pointer_end());
  }
  batch.set_sequence(process.next_sequence);
  const uint64_t bytes = batch.ByteSizeLong();
  const bool memory_room = counters_.memory_bytes + bytes <= options_.max_memory_bytes;
  const bool spool_room =
      !options_.spool_dir.empty() && counters_.spool_bytes + bytes <= options_.max_spool_bytes;

  Entry entry;
  entry.process = name;
  entry.sequence = process.next_sequence;
  entry.bytes = bytes;
  entry.events = batch.events_size();
  bool stored = false;
  if (spool_room && (!counters_.connected || !memory_room)) stored = Spool(entry, batch);
  if (!stored && memory_room) {
    entry.batch = std::make_shared<const v1::EventBatch>(std::move(batch));
    counters_.memory_bytes += bytes;
    stored = true;
  }
  if (!stored) {
    // No sequence number is used up, so the collector sees no gap; the loss is reported to it.
    const int lost = entry.events - (process.pending_drop_events > 0 ? 1 : 0);
    process.pending_drop_events += static_cast<uint64_t>(lost);
    ++counters_.batches_dropped;
    counters_.events_dropped += static_cast<uint64_t>(lost);
    if (counters_.batches_dropped <= 10 || counters_.batches_dropped % 1000 == 0) {
      Log(LogLevel::kWarning,
          absl::StrFormat(
              "dropped a batch of %d events of %s: %d bytes unacknowledged in memory (limit %d), "
              "%d in the spool (limit %d%s); %d batches / %d events dropped so far, reported to "
              "the collector as a DropEvent",
              lost, name, counters_.memory_bytes, options_.max_memory_bytes, counters_.spool_bytes,
              options_.max_spool_bytes, options_.spool_dir.empty() ? ", no --spool-dir" : "",
              counters_.batches_dropped, counters_.events_dropped));
    }
    return false;
  }
  process.pending_drop_events = 0;
  ++process.next_sequence;
  ++counters_.batches_cut;
  counters_.events_cut += static_cast<uint64_t>(entry.events);
  pending_.push_back(std::move(entry));
  return true;
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
  Process& process = processes_[ProcessKeyString(key)];
  if (process.next_sequence != 1) return;  // batches were numbered already: too late
  process.key = key;
  process.acked = acked_sequence;
  process.next_sequence = acked_sequence + 1;
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
    uint64_t next = acked_sequence + 1;
    for (Entry& entry : pending_) {
      if (entry.process != it->first) continue;
      if (entry.batch != nullptr) {
        auto copy = std::make_shared<v1::EventBatch>(*entry.batch);
        copy->set_sequence(next);
        entry.batch = std::move(copy);
      }
      entry.sequence = next++;
      ++counters_.batches_renumbered;
    }
    Log(LogLevel::kWarning,
        absl::StrFormat("the collector already holds batches 1..%d of %s from an earlier agent; "
                        "renumbered %d unacknowledged batches after them",
                        acked_sequence, it->first, next - acked_sequence - 1));
    process.next_sequence = next;
    process.acked = acked_sequence;
    sent_count_ = 0;
  } else {
    process.acked = acked_sequence;
  }
  PopAcked();
}

std::shared_ptr<const v1::EventBatch> Outbox::NextToSend(absl::Duration timeout) {
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
  if (entry.batch != nullptr) return entry.batch;
  auto batch = std::make_shared<v1::EventBatch>();
  std::ifstream in(entry.spool_path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!batch->ParseFromString(bytes)) {
    // The spool is ours alone; a file we cannot read back is lost. Send the sequence anyway, with
    // a DropEvent in place of the events, so the collector sees no gap and counts the loss.
    Log(LogLevel::kError, absl::StrFormat("spooled batch %s is unreadable; %d events lost",
                                          entry.spool_path, entry.events));
    batch->Clear();
    *batch->mutable_process() = processes_[entry.process].key;
    batch->add_events()->mutable_drop()->set_dropped_records(static_cast<uint64_t>(entry.events));
  }
  batch->set_sequence(entry.sequence);
  return batch;
}

void Outbox::Rewind() {
  absl::MutexLock lock(&mu_);
  sent_count_ = 0;
  interrupted_ = false;
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
