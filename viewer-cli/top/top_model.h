// TopModel: what `vramscope top` shows, without a terminal. It turns the collector's StatsUpdates
// (or `vramscope run --live`'s reports) into rows, one per process and device, and keeps the
// dashboard's state: sort column and order, filter, selection (which follows its row across
// updates and re-sorts), a history of memory per row and in total for the graph, and the
// selected process's NVTX ranges and top sites. Formatting (table lines, plain lines, graph
// columns) lives here too so that tests check exactly what is drawn.
//
// Thread safety: none; one thread owns an instance. Errors: none; every input is accepted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "top/nvml.h"
#include "vramscope/v1/collector.pb.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::cli::top {

enum class SortColumn {
  kReserved,  // current reserved (the default: what the driver holds now)
  kPeakReserved,
  kAllocated,
  kPeakAllocated,
  kFragmentation,
  kRate,
  kOoms,
  kPid,
  kCommand,
};
inline constexpr int kSortColumns = 9;
std::string SortColumnName(SortColumn column);

// One process on one device.
struct Row {
  std::string key;          // "host/pid/start_time_ns/device": stable across updates
  std::string process_key;  // "host/pid/start_time_ns"
  v1::ProcessKey process;
  std::string command;  // the command line joined with spaces
  std::string display;  // the same with the program's directory left out (the table's text)
  std::uint32_t device = 0;
  bool finished = false;
  bool killed = false;      // ended by a signal or vanished without an exit record
  std::int32_t signal = 0;  // the signal, when known
  std::uint64_t allocated = 0;
  std::uint64_t peak_allocated = 0;
  std::uint64_t reserved = 0;
  std::uint64_t peak_reserved = 0;
  double fragmentation = 0;  // external fragmentation now, 0..1
  double alloc_rate = 0;     // allocations per second since the previous update
  std::uint64_t alloc_count = 0;
  std::uint64_t ooms = 0;
  std::uint64_t dropped = 0;
  // The memory of this machine's processes that vramscope does not trace, on one GPU, from
  // NVML (SetGpus): `reserved` is their sum now, `peak_reserved` the most seen; no pid;
  // `device` is NVML's index (nvidia-smi's), which a traced row's CUDA ordinal need not be.
  bool untraced = false;
  std::size_t untraced_processes = 0;
};

// One point of a row's (or the total's) memory over time.
struct Sample {
  std::uint64_t time_ns = 0;
  std::uint64_t allocated = 0;
  std::uint64_t reserved = 0;
};

// One column of the graph: the highest reserved and allocated bytes in its time slice, or
// nothing (no data yet).
struct GraphColumn {
  bool has_data = false;
  std::uint64_t allocated = 0;
  std::uint64_t reserved = 0;
};

struct TopModelOptions {
  // How far back the history (and the graph) reaches at most.
  std::uint64_t history_ns = 60ull * 60 * 1000000000;
  // The graph spans the shortest of 30 s, 1, 2, 5, 10, 15, 30, 60 min that holds the graphed
  // row's whole history (so a short job fills the width), never more than history_ns; false:
  // always history_ns.
  bool fit_window = true;
  // Samples kept per row at most (older ones are dropped first).
  std::size_t max_samples = 4096;
};

class TopModel {
 public:
  explicit TopModel(TopModelOptions options = {});

  // A new snapshot: rows replaced, history extended, rates from the previous snapshot's counts
  // (the first one uses the report's average rate). Rows of processes no longer present go.
  void Update(const v1::StatsUpdate& update);
  // This machine's GPUs as NVML sees them at `time_ns` (same clock as the updates), and the
  // host name its traced processes carry: per GPU, the processes NVML lists that are not traced
  // rows of `local_host` become one untraced row. An empty list removes them (no NVML).
  void SetGpus(std::vector<GpuMemory> gpus, std::string local_host, std::uint64_t time_ns);
  const std::vector<GpuMemory>& gpus() const { return gpus_; }
  // One line per GPU: "GPU 0 NAME: USED of TOTAL used, traced X, untraced Y (N processes)",
  // each exactly `width` characters, numbered as nvidia-smi does; a traced row counts on the
  // GPU its device's UUID names (without a UUID, the GPU whose index is its ordinal); nothing
  // without NVML.
  std::vector<std::string> GpuLines(std::size_t width) const;
  // The same for plain output: key=value, bytes as integers.
  std::vector<std::string> PlainGpuLines() const;
  // The selected process's full report (top sites, NVTX ranges): kept until another process is
  // selected or a newer one arrives.
  void SetDetails(const v1::Report& report);

  // Rows as shown: filtered, then sorted.
  const std::vector<Row>& rows() const { return visible_; }
  std::size_t total_rows() const { return all_.size(); }
  std::size_t processes() const;
  std::uint64_t time_ns() const { return time_ns_; }
  bool has_data() const { return updates_ > 0; }

  SortColumn sort() const { return sort_; }
  bool descending() const { return descending_; }
  void SetSort(SortColumn column);
  void CycleSort();  // next column
  void ReverseSort();

  // Substring of the command line or the pid (decimal); empty = everything.
  void SetFilter(std::string filter);
  const std::string& filter() const { return filter_; }

  // Selection by row key; it follows the row when the order changes. With no selection (or the
  // selected row gone or filtered out) the first row is selected.
  const Row* selected() const;
  std::size_t selected_index() const { return selected_index_; }
  void MoveSelection(int delta);  // clamped to the rows
  void SelectFirst();
  void SelectLast();
  // Key of the process (not row) whose details are wanted, or empty.
  std::string SelectedProcessKey() const;

  // The graph: total over all (filtered) rows, or the selected row.
  bool graph_total() const { return graph_total_; }
  void ToggleGraphTotal() { graph_total_ = !graph_total_; }
  // `width` columns covering the history_ns before time_ns(); each is the highest value sampled
  // in its slice, or carries the previous column's value when the slice has no sample.
  std::vector<GraphColumn> Graph(std::size_t width) const;
  std::string GraphTitle() const;
  // The time the graph spans (see TopModelOptions::fit_window).
  std::uint64_t WindowNs() const;

  // The selected row's NVTX ranges (from the update, else the details) and top sites (details).
  std::vector<v1::NvtxRangeStats> SelectedRanges() const;
  std::vector<v1::SiteStats> SelectedSites() const;
  bool has_details() const { return details_.has_value(); }

  // Text for the table: the header and one row, exactly `width` characters (width >= 40).
  std::string HeaderLine(std::size_t width) const;
  std::string RowLine(const Row& row, std::size_t width) const;
  // One line per row for plain (non-terminal) output: key=value, bytes as integers, the
  // command last.
  std::string PlainLine(const Row& row) const;

  const TopModelOptions& options() const { return options_; }

 private:
  void Rebuild();
  void RebuildGpuRows();
  void AddSample(const std::string& key, const Sample& sample);
  std::string GraphKey() const;
  bool OnGpu(const Row& row, const GpuMemory& gpu) const;
  std::uint64_t TracedBytesOn(const GpuMemory& gpu) const;
  Row UntracedOn(const GpuMemory& gpu) const;  // an empty row where none is untraced
  const v1::DeviceReport* SelectedDeviceReport() const;

  TopModelOptions options_;
  std::uint64_t time_ns_ = 0;
  std::uint64_t updates_ = 0;
  std::vector<Row> all_;
  std::vector<Row> visible_;
  SortColumn sort_ = SortColumn::kReserved;
  bool descending_ = true;
  std::string filter_;
  std::string selected_key_;
  std::size_t selected_index_ = 0;
  bool graph_total_ = false;
  // Previous snapshot's allocation counts and time, per row key (for rates).
  std::map<std::string, std::uint64_t> previous_counts_;
  std::uint64_t previous_time_ns_ = 0;
  std::map<std::string, std::deque<Sample>> history_;  // by row key; "" = total
  std::map<std::string, v1::DeviceReport> devices_;    // latest device report by row key
  std::optional<v1::Report> details_;
  std::string details_key_;  // process key of details_
  std::vector<GpuMemory> gpus_;
  std::string local_host_;
  std::uint64_t gpus_time_ns_ = 0;
  std::vector<Row> gpu_rows_;                            // untraced, one per GPU
  std::map<std::string, std::uint64_t> untraced_peaks_;  // by row key
};

// The StatsUpdate a set of reports makes (live updates leave timelines, sites and leaks out;
// here they are kept: the model ignores them).
v1::StatsUpdate UpdateFromReports(const std::vector<v1::Report>& reports, std::uint64_t time_ns);
// Bytes as the table shows them: "1.50G", "512M", "12.0K", "800B": at most 6 characters.
std::string ShortBytes(std::uint64_t bytes);
// Fits `text` into exactly `width` characters (cut, or padded with spaces on the right; or on
// the left with `right_align`).
std::string Fit(std::string_view text, std::size_t width, bool right_align = false);

}  // namespace vramscope::cli::top
