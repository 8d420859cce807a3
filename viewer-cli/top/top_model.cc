#include "top/top_model.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "common/process_end.h"
#include "vramscope/process_key.h"

namespace vramscope::cli::top {
namespace {

constexpr std::string_view kTotalKey = "";
constexpr std::string_view kUntracedPrefix = "untraced/";
constexpr std::uint64_t kSecondNs = 1000000000;

std::string RowKeyText(const std::string& process_key, std::uint32_t device) {
  return absl::StrCat(process_key, "/", device);
}

// "1.2k", "35", "4.5M": at most 6 characters.
std::string ShortRate(double rate) {
  if (rate < 0) rate = 0;
  if (rate < 10) return absl::StrFormat("%.1f", rate);
  if (rate < 10000) return absl::StrFormat("%.0f", rate);
  if (rate < 1e6) return absl::StrFormat("%.1fk", rate / 1e3);
  if (rate < 1e9) return absl::StrFormat("%.1fM", rate / 1e6);
  return absl::StrFormat("%.1fG", rate / 1e9);
}

// Widths of the fixed columns; the command takes what is left.
constexpr std::size_t kPidWidth = 7;
constexpr std::size_t kDevWidth = 4;
constexpr std::size_t kBytesWidth = 7;
constexpr std::size_t kFragWidth = 6;
constexpr std::size_t kRateWidth = 8;
constexpr std::size_t kOomWidth = 5;
constexpr std::size_t kFixedWidth =
    kPidWidth + kDevWidth + 4 * kBytesWidth + kFragWidth + kRateWidth + kOomWidth + 1;

// Compares two rows by `column`, ascending; ties by key so the order is stable.
bool Less(const Row& a, const Row& b, SortColumn column) {
  auto tie = [&](auto x, auto y) {
    if (x != y) return x < y;
    return a.key < b.key;
  };
  switch (column) {
    case SortColumn::kReserved:
      return tie(a.reserved, b.reserved);
    case SortColumn::kPeakReserved:
      return tie(a.peak_reserved, b.peak_reserved);
    case SortColumn::kAllocated:
      return tie(a.allocated, b.allocated);
    case SortColumn::kPeakAllocated:
      return tie(a.peak_allocated, b.peak_allocated);
    case SortColumn::kFragmentation:
      return tie(a.fragmentation, b.fragmentation);
    case SortColumn::kRate:
      return tie(a.alloc_rate, b.alloc_rate);
    case SortColumn::kOoms:
      return tie(a.ooms, b.ooms);
    case SortColumn::kPid:
      return tie(a.process.pid(), b.process.pid());
    case SortColumn::kCommand:
      return tie(a.command, b.command);
  }
  return a.key < b.key;
}

}  // namespace

std::string SortColumnName(SortColumn column) {
  switch (column) {
    case SortColumn::kReserved:
      return "reserved";
    case SortColumn::kPeakReserved:
      return "peak reserved";
    case SortColumn::kAllocated:
      return "allocated";
    case SortColumn::kPeakAllocated:
      return "peak allocated";
    case SortColumn::kFragmentation:
      return "fragmentation";
    case SortColumn::kRate:
      return "alloc rate";
    case SortColumn::kOoms:
      return "OOMs";
    case SortColumn::kPid:
      return "pid";
    case SortColumn::kCommand:
      return "command";
  }
  return "?";
}

v1::StatsUpdate UpdateFromReports(const std::vector<v1::Report>& reports, std::uint64_t time_ns) {
  v1::StatsUpdate update;
  update.set_time_ns(time_ns);
  for (const v1::Report& report : reports) {
    v1::ProcessStats* stats = update.add_processes();
    *stats->mutable_process() = report.process();
    *stats->mutable_command_line() = report.command_line();
    stats->set_finished(report.finished());
    stats->set_exit_code(report.exit_code());
    stats->set_killed(report.killed());
    stats->set_signal(report.signal());
    stats->set_vanished(report.vanished());
    *stats->mutable_devices() = report.devices();
  }
  return update;
}

std::string ShortBytes(std::uint64_t bytes) {
  static const char kUnits[] = "BKMGTPE";
  if (bytes < 1000) return absl::StrCat(bytes, "B");
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 999.5 && unit < 6) {
    value /= 1024;
    ++unit;
  }
  const char suffix = kUnits[unit];
  if (value >= 99.95) return absl::StrFormat("%.0f%c", value, suffix);
  if (value >= 9.995) return absl::StrFormat("%.1f%c", value, suffix);
  return absl::StrFormat("%.2f%c", value, suffix);
}

std::string Fit(std::string_view text, std::size_t width, bool right_align) {
  if (text.size() >= width) return std::string(text.substr(0, width));
  const std::string pad(width - text.size(), ' ');
  return right_align ? pad + std::string(text) : std::string(text) + pad;
}

TopModel::TopModel(TopModelOptions options) : options_(options) {}

void TopModel::Update(const v1::StatsUpdate& update) {
  const std::uint64_t now = update.time_ns();
  const double seconds = previous_time_ns_ > 0 && now > previous_time_ns_
                             ? static_cast<double>(now - previous_time_ns_) / 1e9
                             : 0.0;
  std::vector<Row> rows;
  std::map<std::string, std::uint64_t> counts;
  std::map<std::string, v1::DeviceReport> devices;
  Sample total{now, 0, 0};
  for (const v1::ProcessStats& stats : update.processes()) {
    const std::string process_key = ProcessKeyString(stats.process());
    const std::string command = absl::StrJoin(stats.command_line(), " ");
    std::string display = command;
    if (stats.command_line_size() > 0) {
      const std::string& program = stats.command_line(0);
      const std::size_t slash = program.rfind('/');
      if (slash != std::string::npos && slash + 1 < program.size())
        display = command.substr(slash + 1);
    }
    for (const v1::DeviceReport& device : stats.devices()) {
      Row row;
      row.process_key = process_key;
      row.process = stats.process();
      row.command = command;
      row.display = display;
      row.device = device.device().ordinal();
      row.key = RowKeyText(process_key, row.device);
      row.finished = stats.finished();
      row.killed = stats.killed();
      row.signal = stats.signal();
      row.allocated = device.current_allocated_bytes();
      row.peak_allocated = device.peak_allocated_bytes();
      row.reserved = device.current_reserved_bytes();
      row.peak_reserved = device.peak_reserved_bytes();
      row.fragmentation = device.fragmentation().external_fragmentation();
      row.alloc_count = device.alloc_count();
      row.ooms = static_cast<std::uint64_t>(device.ooms_size());
      row.dropped = device.dropped_records();
      auto previous = previous_counts_.find(row.key);
      if (previous != previous_counts_.end() && seconds > 0) {
        const std::uint64_t delta =
            row.alloc_count >= previous->second ? row.alloc_count - previous->second : 0;
        row.alloc_rate = static_cast<double>(delta) / seconds;
      } else if (previous == previous_counts_.end()) {
        row.alloc_rate = device.allocs_per_second();
      }
      counts[row.key] = row.alloc_count;
      devices[row.key] = device;
      AddSample(row.key, Sample{now, row.allocated, row.reserved});
      total.allocated += row.allocated;
      total.reserved += row.reserved;
      rows.push_back(std::move(row));
    }
  }
  AddSample(std::string(kTotalKey), total);
  // History of rows that went away is dropped with them (the untraced rows' goes with SetGpus).
  for (auto it = history_.begin(); it != history_.end();) {
    if (!it->first.empty() && counts.find(it->first) == counts.end() &&
        it->first.rfind(kUntracedPrefix, 0) != 0) {
      it = history_.erase(it);
    } else {
      ++it;
    }
  }
  previous_counts_ = std::move(counts);
  previous_time_ns_ = now;
  devices_ = std::move(devices);
  all_ = std::move(rows);
  time_ns_ = now;
  ++updates_;
  RebuildGpuRows();
  Rebuild();
}

void TopModel::SetGpus(std::vector<GpuMemory> gpus, std::string local_host, std::uint64_t time_ns) {
  gpus_ = std::move(gpus);
  local_host_ = std::move(local_host);
  gpus_time_ns_ = time_ns;
  RebuildGpuRows();
  std::set<std::string> keys;
  for (const Row& row : gpu_rows_) {
    keys.insert(row.key);
    AddSample(row.key, Sample{time_ns, 0, row.reserved});
  }
  for (auto it = history_.begin(); it != history_.end();) {
    const bool gone = it->first.rfind(kUntracedPrefix, 0) == 0 && !keys.contains(it->first);
    it = gone ? history_.erase(it) : std::next(it);
  }
  Rebuild();
}

bool TopModel::OnGpu(const Row& row, const GpuMemory& gpu) const {
  // A traced row's device is the process's CUDA ordinal (CUDA_VISIBLE_DEVICES and
  // CUDA_DEVICE_ORDER decide it), NVML's index the PCI order: the UUID says which GPU it is;
  // without one, the ordinal is taken for the index.
  auto it = devices_.find(row.key);
  const std::string uuid = it == devices_.end() ? "" : it->second.device().uuid();
  return uuid.empty() ? row.device == gpu.index : uuid == gpu.uuid;
}

std::uint64_t TopModel::TracedBytesOn(const GpuMemory& gpu) const {
  std::uint64_t bytes = 0;
  for (const Row& row : all_) {
    if (!row.finished && row.process.host() == local_host_ && OnGpu(row, gpu)) {
      bytes += row.reserved;
    }
  }
  return bytes;
}

void TopModel::RebuildGpuRows() {
  gpu_rows_.clear();
  std::set<std::uint32_t> traced;
  for (const Row& row : all_) {
    if (!row.finished && row.process.host() == local_host_) traced.insert(row.process.pid());
  }
  for (const GpuMemory& gpu : gpus_) {
    Row row;
    row.untraced = true;
    row.device = gpu.index;
    const std::string id = gpu.uuid.empty() ? absl::StrCat(gpu.index) : gpu.uuid;
    row.key = std::string(kUntracedPrefix) + id;
    row.process.set_host(local_host_);
    for (const GpuProcess& process : gpu.processes) {
      if (traced.contains(process.pid)) continue;
      ++row.untraced_processes;
      row.reserved += process.used_bytes;
    }
    if (row.untraced_processes == 0) continue;
    std::uint64_t& peak = untraced_peaks_[row.key];
    peak = std::max(peak, row.reserved);
    row.peak_reserved = peak;
    row.command = "untraced";
    row.display = absl::StrCat("[untraced: ", row.untraced_processes,
                               row.untraced_processes == 1 ? " process]" : " processes]");
    gpu_rows_.push_back(std::move(row));
  }
}

Row TopModel::UntracedOn(const GpuMemory& gpu) const {
  for (const Row& row : gpu_rows_) {
    if (row.device == gpu.index) return row;
  }
  return Row{};
}

std::vector<std::string> TopModel::GpuLines(std::size_t width) const {
  std::vector<std::string> out;
  for (const GpuMemory& gpu : gpus_) {
    const Row row = UntracedOn(gpu);
    out.push_back(
        Fit(absl::StrCat("GPU ", gpu.index, " ", gpu.name, ": ", ShortBytes(gpu.used_bytes), " of ",
                         ShortBytes(gpu.total_bytes), " used, traced ",
                         ShortBytes(TracedBytesOn(gpu)), ", untraced ", ShortBytes(row.reserved),
                         " (", row.untraced_processes, " processes)"),
            width));
  }
  return out;
}

std::vector<std::string> TopModel::PlainGpuLines() const {
  std::vector<std::string> out;
  for (const GpuMemory& gpu : gpus_) {
    const Row row = UntracedOn(gpu);
    out.push_back(absl::StrFormat(
        "time_ns=%d gpu=%d uuid=%s total=%d used=%d traced=%d untraced=%d untraced_processes=%d "
        "name=%s",
        gpus_time_ns_, gpu.index, gpu.uuid.empty() ? "-" : gpu.uuid, gpu.total_bytes,
        gpu.used_bytes, TracedBytesOn(gpu), row.reserved, row.untraced_processes, gpu.name));
  }
  return out;
}

void TopModel::AddSample(const std::string& key, const Sample& sample) {
  std::deque<Sample>& samples = history_[key];
  samples.push_back(sample);
  while (samples.size() > options_.max_samples ||
         (!samples.empty() && sample.time_ns > options_.history_ns &&
          samples.front().time_ns < sample.time_ns - options_.history_ns)) {
    samples.pop_front();
  }
}

void TopModel::SetDetails(const v1::Report& report) {
  details_ = report;
  details_key_ = ProcessKeyString(report.process());
}

std::size_t TopModel::processes() const {
  std::set<std::string> keys;
  for (const Row& row : all_) keys.insert(row.process_key);
  return keys.size();
}

void TopModel::SetSort(SortColumn column) {
  if (column == sort_) return;
  sort_ = column;
  // Figures are most useful largest first, names and pids in their natural order.
  descending_ = column != SortColumn::kPid && column != SortColumn::kCommand;
  Rebuild();
}

void TopModel::CycleSort() {
  SetSort(static_cast<SortColumn>((static_cast<int>(sort_) + 1) % kSortColumns));
}

void TopModel::ReverseSort() {
  descending_ = !descending_;
  Rebuild();
}

void TopModel::SetFilter(std::string filter) {
  filter_ = std::move(filter);
  Rebuild();
}

void TopModel::Rebuild() {
  visible_.clear();
  for (const std::vector<Row>* rows : {&all_, &gpu_rows_}) {
    for (const Row& row : *rows) {
      if (!filter_.empty() && row.command.find(filter_) == std::string::npos &&
          (row.untraced || absl::StrCat(row.process.pid()).find(filter_) == std::string::npos)) {
        continue;
      }
      visible_.push_back(row);
    }
  }
  std::sort(visible_.begin(), visible_.end(), [&](const Row& a, const Row& b) {
    return descending_ ? Less(b, a, sort_) : Less(a, b, sort_);
  });
  selected_index_ = 0;
  bool found = false;
  for (std::size_t i = 0; i < visible_.size(); ++i) {
    if (visible_[i].key == selected_key_) {
      selected_index_ = i;
      found = true;
      break;
    }
  }
  if (!found) selected_key_ = visible_.empty() ? "" : visible_[0].key;
  if (!details_key_.empty() && details_key_ != SelectedProcessKey()) {
    details_.reset();
    details_key_.clear();
  }
}

const Row* TopModel::selected() const {
  if (visible_.empty()) return nullptr;
  return &visible_[selected_index_];
}

void TopModel::MoveSelection(int delta) {
  if (visible_.empty()) return;
  const long long last = static_cast<long long>(visible_.size()) - 1;
  const long long index = std::clamp(static_cast<long long>(selected_index_) + delta, 0ll, last);
  selected_index_ = static_cast<std::size_t>(index);
  selected_key_ = visible_[selected_index_].key;
  Rebuild();
}

void TopModel::SelectFirst() { MoveSelection(-static_cast<int>(visible_.size())); }
void TopModel::SelectLast() { MoveSelection(static_cast<int>(visible_.size())); }

std::string TopModel::SelectedProcessKey() const {
  const Row* row = selected();
  return row == nullptr ? "" : row->process_key;
}

std::string TopModel::GraphKey() const {
  if (graph_total_) return std::string(kTotalKey);
  const Row* row = selected();
  return row == nullptr ? "\n" : row->key;  // "\n": no row, no history
}

std::uint64_t TopModel::WindowNs() const {
  if (!options_.fit_window) return options_.history_ns;
  std::uint64_t age = 0;
  auto it = history_.find(GraphKey());
  if (it != history_.end() && !it->second.empty() && time_ns_ > it->second.front().time_ns) {
    age = time_ns_ - it->second.front().time_ns;
  }
  for (std::uint64_t seconds : {30, 60, 120, 300, 600, 900, 1800, 3600}) {
    if (seconds * kSecondNs >= age) return std::min(seconds * kSecondNs, options_.history_ns);
  }
  return options_.history_ns;
}

std::vector<GraphColumn> TopModel::Graph(std::size_t width) const {
  std::vector<GraphColumn> columns(width);
  if (width == 0) return columns;
  auto it = history_.find(GraphKey());
  if (it == history_.end() || it->second.empty()) return columns;
  // Column i holds the samples aged [(width - 1 - i), (width - i)) * span / width before
  // time_ns(): the newest lands in the last column.
  const std::uint64_t end = time_ns_;
  const std::uint64_t span = WindowNs();
  for (const Sample& sample : it->second) {
    const std::uint64_t age = end > sample.time_ns ? end - sample.time_ns : 0;
    if (age >= span) continue;
    const auto slot = static_cast<std::size_t>(static_cast<long double>(age) * width / span);
    GraphColumn& column = columns[width - 1 - std::min(slot, width - 1)];
    column.has_data = true;
    column.allocated = std::max(column.allocated, sample.allocated);
    column.reserved = std::max(column.reserved, sample.reserved);
  }
  // A slice without a sample carries the value before it (memory did not change unseen).
  bool seen = false;
  GraphColumn last;
  for (GraphColumn& column : columns) {
    if (column.has_data) {
      seen = true;
      last = column;
    } else if (seen) {
      column = last;
    }
  }
  return columns;
}

std::string TopModel::GraphTitle() const {
  std::uint64_t peak = 0;
  for (const GraphColumn& column : Graph(256)) peak = std::max(peak, column.reserved);
  const std::uint64_t span = WindowNs();
  const std::string window = span < 60 * kSecondNs || span % (60 * kSecondNs) != 0
                                 ? absl::StrCat(span / kSecondNs, " s")
                                 : absl::StrCat(span / (60 * kSecondNs), " min");
  if (graph_total_) {
    return absl::StrCat("total of ", visible_.size() == all_.size() ? "all rows" : "shown rows",
                        ", last ", window, ", max ", ShortBytes(peak));
  }
  const Row* row = selected();
  if (row == nullptr) return "no process";
  if (row->untraced) {
    return absl::StrCat("untraced processes cuda:", row->device, ", last ", window, ", max ",
                        ShortBytes(peak));
  }
  return absl::StrCat("pid ", row->process.pid(), " cuda:", row->device, ", last ", window,
                      ", max ", ShortBytes(peak));
}

const v1::DeviceReport* TopModel::SelectedDeviceReport() const {
  const Row* row = selected();
  if (row == nullptr) return nullptr;
  if (details_ && details_key_ == row->process_key) {
    for (const v1::DeviceReport& device : details_->devices()) {
      if (device.device().ordinal() == row->device) return &device;
    }
  }
  auto it = devices_.find(row->key);
  return it == devices_.end() ? nullptr : &it->second;
}

std::vector<v1::NvtxRangeStats> TopModel::SelectedRanges() const {
  std::vector<v1::NvtxRangeStats> out;
  const Row* row = selected();
  if (row == nullptr) return out;
  // The live update is newer than the details.
  auto it = devices_.find(row->key);
  const v1::DeviceReport* device = it != devices_.end() && it->second.nvtx_ranges_size() > 0
                                       ? &it->second
                                       : SelectedDeviceReport();
  if (device == nullptr) return out;
  out.assign(device->nvtx_ranges().begin(), device->nvtx_ranges().end());
  std::stable_sort(out.begin(), out.end(),
                   [](const v1::NvtxRangeStats& a, const v1::NvtxRangeStats& b) {
                     return a.peak_allocated_bytes() > b.peak_allocated_bytes();
                   });
  return out;
}

std::vector<v1::SiteStats> TopModel::SelectedSites() const {
  std::vector<v1::SiteStats> out;
  const v1::DeviceReport* device = SelectedDeviceReport();
  if (device == nullptr) return out;
  out.assign(device->top_sites().begin(), device->top_sites().end());
  std::stable_sort(out.begin(), out.end(), [](const v1::SiteStats& a, const v1::SiteStats& b) {
    return a.peak_live_bytes() > b.peak_live_bytes();
  });
  return out;
}

std::string TopModel::HeaderLine(std::size_t width) const {
  // The sort column is named in the title line, not marked here: every label keeps its width.
  const std::string line = absl::StrCat(
      Fit("PID", kPidWidth, true), Fit("DEV", kDevWidth, true), Fit("ALLOC", kBytesWidth, true),
      Fit("PK-ALL", kBytesWidth, true), Fit("RESERV", kBytesWidth, true),
      Fit("PK-RES", kBytesWidth, true), Fit("FRAG", kFragWidth, true),
      Fit("ALLOC/s", kRateWidth, true), Fit("OOM", kOomWidth, true), " COMMAND");
  return Fit(line, width);
}

std::string TopModel::RowLine(const Row& row, std::size_t width) const {
  if (row.untraced) {
    const std::string line = absl::StrCat(
        Fit("-", kPidWidth, true), Fit(absl::StrCat(row.device), kDevWidth, true),
        Fit("-", kBytesWidth, true), Fit("-", kBytesWidth, true),
        Fit(ShortBytes(row.reserved), kBytesWidth, true),
        Fit(ShortBytes(row.peak_reserved), kBytesWidth, true), Fit("-", kFragWidth, true),
        Fit("-", kRateWidth, true), Fit("-", kOomWidth, true), " ",
        Fit(row.display, width > kFixedWidth ? width - kFixedWidth : 0));
    return Fit(line, width);
  }
  std::string command = row.display;
  if (row.finished) {
    command = absl::StrCat("[", ProcessEndTag(true, row.killed, row.signal), "] ", command);
  }
  std::string line =
      absl::StrCat(Fit(absl::StrCat(row.process.pid()), kPidWidth, true),
                   Fit(absl::StrCat(row.device), kDevWidth, true),
                   Fit(ShortBytes(row.allocated), kBytesWidth, true),
                   Fit(ShortBytes(row.peak_allocated), kBytesWidth, true),
                   Fit(ShortBytes(row.reserved), kBytesWidth, true),
                   Fit(ShortBytes(row.peak_reserved), kBytesWidth, true),
                   Fit(absl::StrFormat("%.0f%%", row.fragmentation * 100), kFragWidth, true),
                   Fit(ShortRate(row.alloc_rate), kRateWidth, true),
                   Fit(absl::StrCat(row.ooms), kOomWidth, true), " ",
                   Fit(command, width > kFixedWidth ? width - kFixedWidth : 0));
  return Fit(line, width);
}

std::string TopModel::PlainLine(const Row& row) const {
  if (row.untraced) {
    return absl::StrFormat(
        "time_ns=%d host=%s untraced_processes=%d device=%d reserved=%d peak_reserved=%d "
        "cmd=%s",
        gpus_time_ns_, local_host_.empty() ? "-" : local_host_, row.untraced_processes, row.device,
        row.reserved, row.peak_reserved, row.display);
  }
  return absl::StrFormat(
      "time_ns=%d host=%s pid=%d device=%d allocated=%d peak_allocated=%d reserved=%d "
      "peak_reserved=%d fragmentation=%.3f allocs_per_s=%.1f ooms=%d finished=%d killed=%d "
      "signal=%d cmd=%s",
      time_ns_, row.process.host().empty() ? "-" : row.process.host(), row.process.pid(),
      row.device, row.allocated, row.peak_allocated, row.reserved, row.peak_reserved,
      row.fragmentation, row.alloc_rate, row.ooms, row.finished ? 1 : 0, row.killed ? 1 : 0,
      row.signal, row.command);
}

}  // namespace vramscope::cli::top
