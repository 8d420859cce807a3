#include "run/chrome_trace.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <cstdio>

#include "vramscope/json/json_string.h"

namespace vramscope::cli {
namespace {

// Microseconds with nanosecond precision, as the format allows fractional ts.
std::string Micros(std::uint64_t ns) { return absl::StrFormat("%d.%03d", ns / 1000, ns % 1000); }

}  // namespace

void ChromeTrace::Add(std::uint32_t pid, const v1::Event& event) {
  if (event.time_ns() > last_time_ns_) last_time_ns_ = event.time_ns();
  switch (event.payload_case()) {
    case v1::Event::kNvtxPush: {
      const v1::NvtxPushEvent& push = event.nvtx_push();
      const std::uint64_t key = (std::uint64_t{pid} << 32) | push.range_id();
      open_[key] = Open{event.thread_id(), event.time_ns(), push.name(), push.domain()};
      break;
    }
    case v1::Event::kNvtxPop: {
      const std::uint64_t key = (std::uint64_t{pid} << 32) | event.nvtx_pop().range_id();
      auto it = open_.find(key);
      if (it == open_.end()) break;
      if (slices_.size() < max_slices_) {
        slices_.push_back(Slice{pid, it->second.tid, it->second.start_ns, event.time_ns(),
                                std::move(it->second.name), std::move(it->second.domain)});
      } else {
        ++slices_dropped_;
      }
      open_.erase(it);
      break;
    }
    case v1::Event::kOom: {
      const v1::OomEvent& oom = event.oom();
      // The same rule as the stats engine when the shim left the verdict to the reader.
      v1::OomVerdict verdict = oom.verdict();
      if (verdict == v1::OOM_VERDICT_UNSPECIFIED) {
        verdict = oom.free_bytes() >= oom.requested_bytes() ? v1::OOM_VERDICT_FRAGMENTATION
                                                            : v1::OOM_VERDICT_CAPACITY;
      }
      instants_.push_back(Instant{
          pid, event.thread_id(), event.time_ns(), absl::StrCat("OOM cuda:", event.device()),
          absl::StrFormat(
              "\"requested_bytes\":%d,\"free_bytes\":%d,\"largest_free_block_bytes\":%d,"
              "\"verdict\":%s",
              oom.requested_bytes(), oom.free_bytes(), oom.largest_free_block_bytes(),
              json::Quote(v1::OomVerdict_Name(verdict)))});
      break;
    }
    case v1::Event::kCuptiMemory:
      AddCupti(pid, event);
      break;
    case v1::Event::kAlloc:
    case v1::Event::kFree:
      AddAlloc(pid, event);
      break;
    default:
      break;
  }
}

void ChromeTrace::AddCupti(std::uint32_t pid, const v1::Event& event) {
  const v1::CuptiMemoryEvent& e = event.cupti_memory();
  // Device memory kinds (CUpti_ActivityMemoryKind device, array, managed, *_static), the
  // stats engine's CuptiStats rule.
  const bool device_memory = e.memory_kind() >= 3 && e.memory_kind() <= 7;
  const std::uint64_t key = (std::uint64_t{pid} << 32) | event.device();
  switch (e.operation()) {
    case v1::CuptiMemoryEvent::OPERATION_ALLOCATION:
    case v1::CuptiMemoryEvent::OPERATION_RELEASE: {
      if (!device_memory) return;
      std::uint64_t& current = cupti_bytes_[key];
      if (e.operation() == v1::CuptiMemoryEvent::OPERATION_ALLOCATION) {
        cupti_live_[{pid, e.address()}] = e.bytes();
        current += e.bytes();
      } else {
        auto it = cupti_live_.find(std::make_pair(pid, e.address()));
        if (it == cupti_live_.end()) return;
        current = current > it->second ? current - it->second : 0;
        cupti_live_.erase(it);
      }
      if (cupti_points_.size() < max_slices_) {
        cupti_points_.push_back(CuptiPoint{pid, event.device(), event.time_ns(), current});
      } else {
        ++slices_dropped_;
      }
      return;
    }
    case v1::CuptiMemoryEvent::OPERATION_POOL_CREATED:
    case v1::CuptiMemoryEvent::OPERATION_POOL_DESTROYED:
    case v1::CuptiMemoryEvent::OPERATION_POOL_TRIMMED:
      instants_.push_back(
          Instant{pid, event.thread_id(), event.time_ns(),
                  absl::StrCat("CUPTI ", v1::CuptiMemoryEvent::Operation_Name(e.operation()),
                               " cuda:", event.device()),
                  absl::StrFormat("\"pool_address\":%d,\"bytes\":%d", e.pool_address(), e.bytes()),
                  "cupti"});
      return;
    case v1::CuptiMemoryEvent::OPERATION_RECORDS_DROPPED:
      instants_.push_back(Instant{pid, event.thread_id(), event.time_ns(), "CUPTI records dropped",
                                  absl::StrFormat("\"records\":%d", e.records_dropped()), "cupti"});
      return;
    default:
      return;
  }
}

void ChromeTrace::AddAlloc(std::uint32_t pid, const v1::Event& event) {
  if (event.has_free()) {
    auto it = live_allocs_.find(std::make_pair(pid, event.free().address()));
    if (it == live_allocs_.end()) return;
    allocs_[it->second].end_ns = std::max(event.time_ns(), allocs_[it->second].start_ns);
    live_allocs_.erase(it);
    return;
  }
  const v1::AllocEvent& a = event.alloc();
  if (a.kind() == v1::ALLOCATION_KIND_HOST || a.kind() == v1::ALLOCATION_KIND_IPC_IMPORT) return;
  if (allocs_.size() >= max_slices_) {
    ++slices_dropped_;
    return;
  }
  auto [it, inserted] = live_allocs_.try_emplace(std::make_pair(pid, a.address()), allocs_.size());
  if (!inserted) return;  // a free was lost: keep the first
  allocs_.push_back(AllocSlice{pid, event.device(), a.address(), event.time_ns(), 0,
                               a.requested_bytes(), a.allocated_bytes(), a.stream(), a.kind()});
}

void ChromeTrace::EmitAllocs(const std::function<void(const std::string&)>& emit) const {
  for (std::size_t i = 0; i < allocs_.size(); ++i) {
    const AllocSlice& a = allocs_[i];
    const std::string name = json::Quote(absl::StrCat(a.requested, " B"));
    const std::string kind = json::Quote(v1::AllocationKind_Name(a.kind));
    // Nestable async events: one id per allocation, so overlapping ones never mis-nest.
    emit(absl::StrFormat(
        R"({"ph":"b","cat":"alloc","name":%s,"id":"0x%x","pid":%d,"tid":%d,"ts":%s,)"
        R"("args":{"device":%d,"requested_bytes":%d,"allocated_bytes":%d,"address":"0x%x",)"
        R"("stream":%d,"kind":%s}})",
        name, i + 1, a.pid, a.pid, Micros(a.start_ns), a.device, a.requested, a.allocated,
        a.address, a.stream, kind));
    const std::uint64_t end = a.end_ns != 0 ? a.end_ns : std::max(last_time_ns_, a.start_ns);
    emit(absl::StrFormat(
        R"({"ph":"e","cat":"alloc","name":%s,"id":"0x%x","pid":%d,"tid":%d,"ts":%s})", name, i + 1,
        a.pid, a.pid, Micros(end)));
  }
}

std::string ChromeTrace::Json(const std::vector<v1::Report>& reports) const {
  std::string out = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  bool first = true;
  auto emit = [&](const std::string& record) {
    if (!first) out += ",\n";
    first = false;
    out += record;
  };
  for (const v1::Report& report : reports) {
    const std::uint32_t pid = report.process().pid();
    std::string name = report.command_line_size() > 0 ? report.command_line(0) : "process";
    const std::size_t slash = name.rfind('/');
    if (slash != std::string::npos) name = name.substr(slash + 1);
    emit(absl::StrFormat(R"({"ph":"M","name":"process_name","pid":%d,"args":{"name":%s}})", pid,
                         json::Quote(absl::StrCat(name, " (pid ", pid, ")"))));
    for (const v1::DeviceReport& device : report.devices()) {
      const std::uint32_t d = device.device().ordinal();
      for (const v1::TimelinePoint& p : device.timeline()) {
        const std::string ts = Micros(p.time_ns());
        emit(absl::StrFormat(
            R"({"ph":"C","name":"cuda:%d allocated","pid":%d,"ts":%s,"args":{"bytes":%d}})", d, pid,
            ts, p.allocated_bytes()));
        emit(absl::StrFormat(
            R"({"ph":"C","name":"cuda:%d reserved","pid":%d,"ts":%s,"args":{"bytes":%d}})", d, pid,
            ts, p.reserved_bytes()));
        emit(absl::StrFormat(
            R"({"ph":"C","name":"cuda:%d requested","pid":%d,"ts":%s,"args":{"bytes":%d}})", d, pid,
            ts, p.requested_bytes()));
      }
    }
  }
  // CUPTI's driver view beside the shim's tracks, on the same clock.
  for (const CuptiPoint& p : cupti_points_) {
    emit(absl::StrFormat(
        R"({"ph":"C","name":"cuda:%d CUPTI device bytes","pid":%d,"ts":%s,"args":{"bytes":%d}})",
        p.device, p.pid, Micros(p.time_ns), p.bytes));
  }
  auto slice = [&](std::uint32_t pid, std::uint32_t tid, std::uint64_t start, std::uint64_t end,
                   const std::string& name, const std::string& domain) {
    emit(absl::StrFormat(
        R"({"ph":"X","cat":"nvtx","name":%s,"pid":%d,"tid":%d,"ts":%s,"dur":%s,"args":{"domain":%s}})",
        json::Quote(name), pid, tid, Micros(start), Micros(end > start ? end - start : 0),
        json::Quote(domain)));
  };
  EmitAllocs(emit);
  for (const Slice& s : slices_) slice(s.pid, s.tid, s.start_ns, s.end_ns, s.name, s.domain);
  // Ranges never popped end at the last event seen.
  for (const auto& [key, open] : open_) {
    slice(static_cast<std::uint32_t>(key >> 32), open.tid, open.start_ns, last_time_ns_, open.name,
          open.domain);
  }
  for (const Instant& i : instants_) {
    emit(absl::StrFormat(
        R"({"ph":"i","s":"p","cat":%s,"name":%s,"pid":%d,"tid":%d,"ts":%s,"args":{%s}})",
        json::Quote(i.cat), json::Quote(i.name), i.pid, i.tid, Micros(i.time_ns), i.args));
  }
  out += "\n]}\n";
  return out;
}

}  // namespace vramscope::cli
