#include "common/recorded_events.h"

#include <absl/strings/str_format.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "vramscope/collector/record_log.h"

namespace vramscope::cli {
namespace {

bool SameProcess(const v1::ProcessKey& a, const v1::ProcessKey& b) {
  return a.pid() == b.pid() && a.start_time_ns() == b.start_time_ns() && a.host() == b.host();
}

// The entry of `key`, added at the end when new. The last one is checked first: events come in
// runs of one process.
ProcessEvents& Find(std::vector<ProcessEvents>& processes, const v1::ProcessKey& key) {
  for (auto it = processes.rbegin(); it != processes.rend(); ++it) {
    if (SameProcess(it->key, key)) return *it;
  }
  processes.push_back(ProcessEvents{key, {}});
  return processes.back();
}

constexpr int kBatchEvents = 4096;

}  // namespace

bool RecordedEvents::Keeps(const v1::Event& event) {
  switch (event.payload_case()) {
    case v1::Event::kAlloc:
    case v1::Event::kFree:
    case v1::Event::kPoolReserve:
    case v1::Event::kPoolRelease:
    case v1::Event::kNvtxPush:
    case v1::Event::kNvtxPop:
    case v1::Event::kOom:
    case v1::Event::kSiteDefinition:
    case v1::Event::kProcessStart:
      return true;
    default:
      return false;
  }
}

void RecordedEvents::Add(const v1::ProcessKey& key, const v1::Event& event) {
  if (!Keeps(event)) return;
  if (events_ >= max_events_) {
    ++dropped_;
    return;
  }
  Find(processes_, key).events.push_back(event);
  ++events_;
}

absl::Status WriteEventLog(const std::string& path, const RecordedEvents& events) {
  std::string out(collector::kLogMagic);
  std::uint64_t sequence = 0;
  for (const ProcessEvents& process : events.processes()) {
    for (std::size_t i = 0; i < process.events.size(); i += kBatchEvents) {
      v1::EventBatch batch;
      *batch.mutable_process() = process.key;
      batch.set_sequence(++sequence);
      const std::size_t end = std::min(process.events.size(), i + kBatchEvents);
      for (std::size_t j = i; j < end; ++j) *batch.add_events() = process.events[j];
      out += collector::FrameRecord(batch.SerializeAsString());
    }
  }
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrFormat("%s: cannot create: %s", path, strerror(errno)));
  }
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = write(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      close(fd);
      return absl::InternalError(absl::StrFormat("%s: cannot write: %s", path, strerror(error)));
    }
    done += static_cast<std::size_t>(n);
  }
  if (close(fd) != 0) {
    return absl::InternalError(absl::StrFormat("%s: cannot write: %s", path, strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<RecordedEvents> ReadEventLog(const std::string& path) {
  RecordedEvents events(SIZE_MAX);
  collector::LogScan scan;
  absl::Status status = collector::ReadLog(
      path,
      [&](std::uint64_t, absl::string_view payload) {
        v1::EventBatch batch;
        if (!batch.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
          return absl::DataLossError("a record is not an EventBatch");
        }
        for (const v1::Event& event : batch.events()) events.Add(batch.process(), event);
        return absl::OkStatus();
      },
      &scan);
  if (!status.ok()) return status;
  if (scan.damaged && !scan.damaged_is_tail) {
    return absl::DataLossError(absl::StrFormat("%s: %s", path, scan.damage));
  }
  return events;
}

}  // namespace vramscope::cli
