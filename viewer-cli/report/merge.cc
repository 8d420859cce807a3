// Merging several collectors' reports and listings: see merge.h.
#include "report/merge.h"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <map>
#include <utility>

#include "vramscope/process_key.h"

namespace vramscope::cli {
namespace {

uint64_t Highest(const v1::Report& report) {
  uint64_t highest = 0;
  for (const v1::SequenceRange& range : report.held()) highest = std::max(highest, range.last());
  return highest;
}

template <typename Map>
void MaxInto(Map* into, const Map& from) {
  for (const auto& [name, value] : from) {
    auto& slot = (*into)[name];
    slot = std::max(slot, value);
  }
}

void MergeDevice(v1::DeviceReport* into, const v1::DeviceReport& part, bool latest) {
  into->set_peak_requested_bytes(
      std::max(into->peak_requested_bytes(), part.peak_requested_bytes()));
  into->set_peak_allocated_bytes(
      std::max(into->peak_allocated_bytes(), part.peak_allocated_bytes()));
  if (part.peak_reserved_bytes() > into->peak_reserved_bytes()) {
    into->set_peak_reserved_bytes(part.peak_reserved_bytes());
    *into->mutable_fragmentation_at_peak() = part.fragmentation_at_peak();
  }
  into->set_alloc_count(into->alloc_count() + part.alloc_count());
  into->set_free_count(into->free_count() + part.free_count());
  into->set_pool_reserve_count(into->pool_reserve_count() + part.pool_reserve_count());
  into->set_pool_release_count(into->pool_release_count() + part.pool_release_count());
  into->set_dropped_records(into->dropped_records() + part.dropped_records());
  for (const v1::OomRecord& oom : part.ooms()) *into->add_ooms() = oom;
  for (const v1::TimelinePoint& point : part.timeline()) *into->add_timeline() = point;
  for (const v1::SiteStats& site : part.top_sites()) *into->add_top_sites() = site;
  MaxInto(into->mutable_peak_bytes_by_kind(), part.peak_bytes_by_kind());
  MaxInto(into->mutable_peak_requested_bytes_by_library(), part.peak_requested_bytes_by_library());
  if (latest) {
    into->set_current_requested_bytes(part.current_requested_bytes());
    into->set_current_allocated_bytes(part.current_allocated_bytes());
    into->set_current_reserved_bytes(part.current_reserved_bytes());
    into->set_reserved_over_allocated(part.reserved_over_allocated());
    *into->mutable_fragmentation() = part.fragmentation();
    *into->mutable_leaks() = part.leaks();
    *into->mutable_cupti() = part.cupti();
    if (part.has_device()) *into->mutable_device() = part.device();
  }
}

}  // namespace

SequenceSet Normalize(std::vector<v1::SequenceRange> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) {
    return a.first() < b.first() || (a.first() == b.first() && a.last() < b.last());
  });
  SequenceSet out;
  for (const v1::SequenceRange& range : ranges) {
    if (range.last() < range.first()) continue;
    if (!out.empty() && range.first() <= out.back().last() + 1) {
      out.back().set_last(std::max(out.back().last(), range.last()));
    } else {
      out.push_back(range);
    }
  }
  return out;
}

SequenceSet Intersect(const SequenceSet& a, const SequenceSet& b) {
  std::vector<v1::SequenceRange> out;
  for (const v1::SequenceRange& x : a) {
    for (const v1::SequenceRange& y : b) {
      const uint64_t first = std::max(x.first(), y.first());
      const uint64_t last = std::min(x.last(), y.last());
      if (first > last) continue;
      v1::SequenceRange& range = out.emplace_back();
      range.set_first(first);
      range.set_last(last);
    }
  }
  return Normalize(std::move(out));
}

SequenceSet Union(const SequenceSet& a, const SequenceSet& b) {
  std::vector<v1::SequenceRange> all(a.begin(), a.end());
  all.insert(all.end(), b.begin(), b.end());
  return Normalize(std::move(all));
}

uint64_t Count(const SequenceSet& set) {
  uint64_t n = 0;
  for (const v1::SequenceRange& range : set) n += range.last() - range.first() + 1;
  return n;
}

v1::Report MergeReports(const std::vector<v1::Report>& parts) {
  if (parts.empty()) return {};
  if (parts.size() == 1) return parts[0];
  std::vector<const v1::Report*> ordered;
  for (const v1::Report& part : parts) ordered.push_back(&part);
  // In sequence order: the earliest part first, the one holding the highest sequence last.
  std::stable_sort(ordered.begin(), ordered.end(), [](const v1::Report* a, const v1::Report* b) {
    return Highest(*a) < Highest(*b);
  });
  v1::Report merged;
  *merged.mutable_process() = ordered[0]->process();
  std::map<uint32_t, v1::DeviceReport> devices;
  std::vector<v1::SequenceRange> held;
  for (size_t i = 0; i < ordered.size(); ++i) {
    const v1::Report& part = *ordered[i];
    const bool latest = i + 1 == ordered.size();
    if (merged.command_line().empty()) *merged.mutable_command_line() = part.command_line();
    if (merged.mode().empty()) merged.set_mode(part.mode());
    if (merged.uid() == 0) merged.set_uid(part.uid());
    if (merged.identity() == v1::PROCESS_IDENTITY_UNSPECIFIED) merged.set_identity(part.identity());
    if (merged.labels().empty()) *merged.mutable_labels() = part.labels();
    if (part.start_time_ns() != 0 &&
        (merged.start_time_ns() == 0 || part.start_time_ns() < merged.start_time_ns())) {
      merged.set_start_time_ns(part.start_time_ns());
    }
    merged.set_end_time_ns(std::max(merged.end_time_ns(), part.end_time_ns()));
    merged.set_events(merged.events() + part.events());
    merged.set_saturated_events(merged.saturated_events() + part.saturated_events());
    if (latest) {
      merged.set_finished(part.finished());
      merged.set_exit_code(part.exit_code());
      merged.set_killed(part.killed());
      merged.set_signal(part.signal());
      merged.set_vanished(part.vanished());
    }
    for (const v1::DeviceReport& device : part.devices()) {
      auto [it, inserted] = devices.try_emplace(device.device().ordinal());
      if (inserted) *it->second.mutable_device() = device.device();
      MergeDevice(&it->second, device, latest);
    }
    held.insert(held.end(), part.held().begin(), part.held().end());
  }
  for (auto& [ordinal, device] : devices) {
    std::sort(device.mutable_timeline()->begin(), device.mutable_timeline()->end(),
              [](const auto& a, const auto& b) { return a.time_ns() < b.time_ns(); });
    *merged.add_devices() = std::move(device);
  }
  SequenceSet all = Normalize(std::move(held));
  merged.mutable_held()->Assign(all.begin(), all.end());
  return merged;
}

v1::ListProcessesResponse MergeListings(const std::vector<v1::ListProcessesResponse>& lists,
                                        std::vector<std::string>* overlap) {
  struct Merged {
    v1::ProcessSummary summary;
    SequenceSet held;
    uint64_t highest = 0;
  };
  std::map<std::string, Merged> by_key;
  for (const v1::ListProcessesResponse& list : lists) {
    for (const v1::ProcessSummary& part : list.processes()) {
      const std::string key = ProcessKeyString(part.process());
      SequenceSet held = Normalize({part.held().begin(), part.held().end()});
      uint64_t highest = held.empty() ? 0 : held.back().last();
      auto [it, inserted] = by_key.try_emplace(key);
      Merged& merged = it->second;
      if (inserted) {
        merged.summary = part;
        merged.held = std::move(held);
        merged.highest = highest;
        continue;
      }
      if (overlap != nullptr && !Intersect(merged.held, held).empty()) overlap->push_back(key);
      merged.summary.set_events(merged.summary.events() + part.events());
      merged.summary.set_peak_reserved_bytes(
          std::max(merged.summary.peak_reserved_bytes(), part.peak_reserved_bytes()));
      if (merged.summary.command_line().empty()) {
        *merged.summary.mutable_command_line() = part.command_line();
      }
      if (highest > merged.highest) {
        merged.highest = highest;
        merged.summary.set_finished(part.finished());
        merged.summary.set_exit_code(part.exit_code());
        merged.summary.set_killed(part.killed());
        merged.summary.set_signal(part.signal());
        merged.summary.set_vanished(part.vanished());
      }
      merged.held = Union(merged.held, held);
    }
  }
  v1::ListProcessesResponse out;
  for (auto& [key, merged] : by_key) {
    merged.summary.mutable_held()->Assign(merged.held.begin(), merged.held.end());
    *out.add_processes() = std::move(merged.summary);
  }
  return out;
}

}  // namespace vramscope::cli
