// ProcessStatsEngine: the statistics of one traced process, computed from its vramscope.v1 events.
//
// What it is: the collector's stats engine (no gRPC), also embedded in `vramscope run`. Feed it a
// process's events in order (Add / AddBatch) and, when available, the ring's exact counters
// (AddCounters); Report() builds a v1::Report at any time, per device:
//   - current and peak requested / allocated / reserved bytes. Reserved = pool reservations plus
//     every passed-through allocation kind (the driver holds it for the process); HOST and
//     IPC_IMPORT count no device bytes (the same rule as the ring writer, vramscope/ring.h).
//     Peaks come from the events and are raised to the ring counters' exact peaks; when records
//     were dropped, current values are taken from the counters too.
//   - reserved over allocated (each at its peak), rounding waste (allocated - requested);
//   - fragmentation from the latest PoolState (1 - largest free / total free, unreleasable free,
//     largest allocatable = largest free block), now and at the moment of peak reserved;
//   - OOMs with verdicts (a missing verdict is decided: free >= requested -> fragmentation);
//   - counts and rates; per NVTX range (name, domain) peak allocated while open, net growth,
//     allocations made with it innermost on the allocating thread, time; top allocation sites;
//     live allocations at exit (leaks, once a ProcessExit was seen); a timeline of at most
//     max_timeline_points points that keeps maxima; the NVTX range instances (start, end,
//     depth, thread; the first max_nvtx_instances per process) for shading on a plot.
//   - individual allocations (DeviceReport.allocations): every allocation live at the moment of
//     peak allocated bytes (largest first, at most max_peak_allocations) and the largest others
//     (max_allocations), with their NVTX range and the frames of their sites. The live set at
//     the peak is kept without copying: an allocation made before the peak (by event sequence)
//     and still live was live then, and those freed since the peak are kept aside until a new
//     peak clears them; the largest freed ones sit in a bounded min-heap per device.
//   - per calling library (sites recorded with VRAMSCOPE_STACKS), each library's own peak of live
//     requested bytes; the rule and the special keys are on
//     DeviceReport.peak_requested_bytes_by_library (report.proto) and in CallingLibrary below.
//   - CUPTI's driver view (CuptiMemory events), separately: current/peak device bytes (memory
//     kinds device, array, managed and their static forms), bytes by memory kind, counts, pool
//     operations and CUPTI's own dropped records; a release without bytes takes them from its
//     allocation (by address).
//
// Costs: Add is O(1) for allocation events (O(log max_allocations) for a free larger than the
// heap's smallest; a new peak clears the frees kept since the last one, amortised O(1)) (a
// flat_hash_map insert or erase, no allocation otherwise; a site's library index is cached on the
// site, which a live allocation points at, so no string work, and a free does no site lookup); a
// SiteDefinition costs O(frames + devices); an NVTX pop costs O(open ranges). Report() is O(live
// allocations + sites + ranges), plus sorting the allocation list (O(n log n), n = live + the
// max_allocations kept per device) unless ReportAllocations::kLeaveOut: stats_bench BM_Report on
// its 1M-event workload, 0.18-0.31 ms CPU before the list, 0.80-1.23 ms with it (BM_Ingest within
// the loaded machine's noise: 14-25 M events/s either way).
//
// Thread safety: none; one thread per instance (StatsEngine below is not thread-safe either).
// Error convention: events are trusted to be well-formed protos but not consistent: frees of
// unknown addresses, pops of unknown ranges and counters going negative are tolerated and never
// crash; nothing returns an error. Byte figures never wrap: a sum that would pass 2^64-1 (only a
// corrupt or hostile ring can get there) is held at 2^64-1 and its event counted in
// Report.saturated_events; signed figures (NVTX net growth) are held at the int64 range.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/types/span.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "stats/timeline.h"
#include "vramscope/v1/events.pb.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::collector {

struct StatsOptions {
  std::size_t max_timeline_points = 2000;
  std::size_t max_top_sites = 10;
  std::size_t max_leaks = 100;              // largest first
  std::size_t max_nvtx_ranges = 100;        // per device, by peak allocated
  std::size_t max_ooms = 100;               // first ones
  std::size_t max_nvtx_instances = 1000;    // per process, first closed (then open) ones
  std::size_t max_peak_allocations = 5000;  // per device: live at the peak, largest first
  std::size_t max_allocations = 2000;       // per device: the largest others
};

// Whether Report() lists individual allocations (DeviceReport.allocations and the fields after
// it): live updates (the collector's Watch) leave them out, which keeps Report() at
// O(devices + sites + ranges + leaks) instead of adding O(live + max_allocations) per device.
// kInclude: the whole report. kLeaveOut: without the allocation list. kFiguresOnly: also without
// the timeline, top sites, leaks and their sites (what a Watch update shows: built for every
// process on every tick, so the timeline's points alone were most of its cost).
enum class ReportAllocations { kInclude, kLeaveOut, kFiguresOnly };

// The accounting rule on the proto enum (mirrors vramscope_ring_alloc_kind_counts_*).
inline bool KindCountsBytes(v1::AllocationKind kind) {
  return kind != v1::ALLOCATION_KIND_HOST && kind != v1::ALLOCATION_KIND_IPC_IMPORT &&
         kind != v1::ALLOCATION_KIND_IPC_EXPORT;
}
inline bool KindCountsReserved(v1::AllocationKind kind) {
  return KindCountsBytes(kind) && kind != v1::ALLOCATION_KIND_POOLED;
}

// Keys of DeviceReport.peak_requested_bytes_by_library that name no module.
inline constexpr std::string_view kUnknownLibrary = "(unknown)";
inline constexpr std::string_view kUnresolvedLibrary = "(unresolved)";

// The calling library of a site from its frames as the drain names them ("PATH+0xOFFSET",
// "0xADDRESS" outside every module; innermost first): the basename of the innermost frame's
// module that is not the CUDA runtime, the driver or the shim (basenames starting with
// "libcudart", "libcuda.so", "libvramscope" are skipped). kUnknownLibrary when that frame has
// no module (or is not in the drain's form), or when every frame is skipped.
std::string CallingLibrary(absl::Span<const std::string> frames);

// ProcessStatsEngine::Gauges(): the figures of one device that a metrics scrape needs, the same
// values Report() gives for them, at O(1) cost per device.
struct DeviceGauges {
  std::uint32_t device = 0;
  std::uint64_t requested = 0, peak_requested = 0;
  std::uint64_t allocated = 0, peak_allocated = 0;
  std::uint64_t reserved = 0, peak_reserved = 0;
  double external_fragmentation = 0;  // DeviceReport.fragmentation.external_fragmentation
  std::uint64_t allocs = 0, frees = 0, ooms = 0, dropped_records = 0;
  bool has_cupti = false;  // the CUPTI figures below were recorded
  std::uint64_t cupti_bytes = 0, cupti_peak_bytes = 0, cupti_dropped_records = 0;
};

// One allocation or free as the collector decodes it straight from the wire (no v1::Event built),
// or, with `other` set, any other event (parsed): AddBatch takes a batch's events in this form.
// The fields are those of v1::Event and its AllocEvent / FreeEvent; a free uses address, device
// and time_ns (its bytes come from the allocation it frees).
struct MemoryEvent {
  std::uint64_t time_ns = 0;
  std::uint64_t address = 0;
  std::uint64_t requested_bytes = 0;
  std::uint64_t allocated_bytes = 0;
  std::uint64_t site = 0;
  std::uint32_t device = 0;
  std::uint32_t thread_id = 0;
  std::uint32_t nvtx_range = 0;
  v1::AllocationKind kind = v1::ALLOCATION_KIND_UNSPECIFIED;
  bool alloc = false;  // else a free
};
struct BatchEvent {
  const v1::Event* other = nullptr;  // set: this event; else `memory`
  MemoryEvent memory;
};

class ProcessStatsEngine {
 public:
  explicit ProcessStatsEngine(StatsOptions options = {});
  ~ProcessStatsEngine();
  ProcessStatsEngine(const ProcessStatsEngine&) = delete;
  ProcessStatsEngine& operator=(const ProcessStatsEngine&) = delete;

  void SetProcessKey(const v1::ProcessKey& key) {
    key_ = key;
    has_key_ = true;
  }
  void Add(const v1::Event& event);
  // An allocation or free: the same as Add() of the v1::Event it was decoded from.
  void Add(const MemoryEvent& event);
  // Events and counters of one batch (the batch's process key is taken if none was set).
  void AddBatch(const v1::EventBatch& batch);
  // The same with the batch's events given as `events` (batch.events() is not read).
  void AddBatch(const v1::EventBatch& batch, absl::Span<const BatchEvent> events);
  // The ring's exact counters for one device; the latest call wins.
  void AddCounters(const v1::DeviceCounters& counters);

  v1::Report Report(ReportAllocations allocations = ReportAllocations::kInclude) const;
  // Per device, by ordinal: the figures Report() gives for them, without building a report.
  std::vector<DeviceGauges> Gauges() const;
  // Wall-clock time (ns) of the latest event, as Report.end_time_ns; 0 when the process key
  // carries no start time (the event clock cannot be placed on the wall clock then).
  std::uint64_t LastEventWallNs() const;
  std::uint64_t events() const { return events_; }
  bool finished() const { return finished_; }

 private:
  struct Device;
  struct Site;  // one allocation site's figures on one device
  struct Live {
    std::uint64_t requested;
    std::uint64_t allocated;
    Site* site;  // nullptr: none recorded; stable (Device::sites is a node_hash_map)
    std::uint64_t time_ns;
    std::uint32_t device;
    v1::AllocationKind kind;
    std::uint64_t seq = 0;  // the event's number (events_), for "made before the peak"
    std::uint32_t thread_id = 0;
    std::int32_t range_agg = -1;  // innermost NVTX range (index into ranges_), -1 = none
  };
  // A freed allocation kept for DeviceReport.allocations.
  struct Freed {
    std::uint64_t address;
    Live live;
    std::uint64_t free_ns;
  };
  struct RangeAgg;
  struct OpenRange {
    std::uint32_t range_id;
    std::uint32_t thread_id;
    std::size_t agg;  // index into ranges_
    std::uint64_t start_ns;
    std::vector<std::uint64_t> at_push;  // allocated per device slot at push
    std::vector<std::uint64_t> running;  // highest allocated per slot since push, own share
    std::uint32_t depth = 0;             // ranges open on its thread at push
  };
  // A range instance for DeviceReport.nvtx_instances; devices with slot < devices_seen get it.
  struct RangeInstance {
    std::size_t agg;
    std::uint64_t start_ns;
    std::uint64_t end_ns;
    std::uint32_t depth;
    std::uint32_t thread_id;
    std::size_t devices_seen;
  };

  // The device's figures (created at first sight); the last one asked for is cached.
  Device& DeviceFor(std::uint32_t device) {
    if (last_device_ != nullptr && last_device_id_ == device) return *last_device_;
    return NewDeviceFor(device);
  }
  Device& NewDeviceFor(std::uint32_t device);
  void OnSiteDefinition(const v1::SiteDefinition& site);
  // An allocation of `bytes` requested from site `site` (0 = none) made on `device`, or freed;
  // `counts`: its kind counts device bytes (KindCountsBytes). Per site and per library.
  // SiteAlloc returns the site's entry for Live::site (nullptr for site 0).
  Site* SiteAlloc(Device& device, std::uint64_t site, std::uint64_t bytes, bool counts);
  void SiteFree(Device& device, Site* site, std::uint64_t bytes, bool counts);
  // Adds `bytes` to library `library`'s live requested bytes on `device`, raising its peak.
  void AddLibraryBytes(Device& device, std::uint32_t library, std::uint64_t bytes);
  void OnAlloc(const MemoryEvent& event);
  void OnFree(const MemoryEvent& event);
  // The part of Add common to every event: counts it and keeps the first and last times.
  void Count(std::uint64_t time_ns);
  // Counts an OOM and keeps its record (up to max_ooms), with a verdict if the shim gave none.
  void OnOom(const v1::Event& event);
  // Keeps a freed allocation for DeviceReport.allocations (live at the peak, or among the
  // largest).
  void KeepFreed(Device& device, std::uint64_t address, const Live& live, std::uint64_t free_ns);
  // Fills DeviceReport.allocations and the fields after it for `device`.
  // Offers a freed allocation not live at the current peak to Device::largest.
  void OfferLargest(Device& device, const Freed& freed) const;
  void ListAllocations(const Device& device, v1::DeviceReport* out) const;
  void AddAllocationSite(std::uint64_t site, v1::DeviceReport* out) const;
  // Report()'s parts: the process fields; per device its figures, NVTX ranges (`ranges`: with
  // the open ones closed), top sites, then timeline, range instances, allocations, CUPTI and
  // bytes by kind and library; the leaks per device; the frames of the sites they name.
  void ReportProcess(v1::Report* report) const;
  void ReportDeviceFigures(const Device& d, double seconds, v1::DeviceReport* out) const;
  void ReportNvtxRanges(const Device& d, const std::vector<RangeAgg>& ranges,
                        v1::DeviceReport* out) const;
  void ReportTopSites(const Device& d, v1::DeviceReport* out) const;
  void ReportDeviceRest(const Device& d, const std::vector<RangeAgg>& ranges,
                        const std::vector<RangeInstance>& instances,
                        std::uint64_t instances_dropped, ReportAllocations allocations,
                        v1::DeviceReport* out) const;
  void ReportLeaks(v1::Report* report) const;
  void ReportAllocationSites(v1::Report* report) const;
  void OnReserve(Device& device, std::uint64_t bytes, std::uint64_t time_ns);
  void OnRelease(Device& device, std::uint64_t bytes, std::uint64_t time_ns);
  void OnPoolState(const v1::PoolStateEvent& state, Device& device);
  // CUPTI's driver view (DeviceReport.cupti), kept apart from every other figure.
  void OnCupti(const v1::Event& event);
  void OnNvtxPush(const v1::Event& event);
  void OnNvtxPop(const v1::Event& event);
  // Folds open range `index` into the aggregates (as if popped at time_ns) and returns nothing;
  // `ranges` is the aggregate table to update (a copy in Report()).
  void CloseRange(std::vector<OpenRange>& open, std::size_t index, std::uint64_t time_ns,
                  std::vector<RangeAgg>& ranges) const;
  void AllocatedRose(Device& device);
  // a + b, held at 2^64-1; a sum that had to be held marks the current event as saturated.
  std::uint64_t Plus(std::uint64_t a, std::uint64_t b) {
    std::uint64_t sum;
    if (!__builtin_add_overflow(a, b, &sum)) return sum;
    // Only a corrupt or hostile ring gets here (2^64 bytes is far beyond any device): hold the
    // figure at its maximum, which keeps peaks and comparisons sane, and count the event.
    saturated_now_ = true;
    return UINT64_MAX;
  }
  void Sample(Device& device, std::uint64_t time_ns);
  // Current and peak requested/allocated/reserved bytes and dropped records of `device` as
  // reported: peaks raised to the ring counters, current values from them when records dropped.
  DeviceGauges Figures(const Device& device) const;

  StatsOptions options_;
  v1::ProcessKey key_;
  bool has_key_ = false;
  v1::ProcessStartEvent start_;
  bool has_start_ = false;
  std::uint64_t start_monotonic_ns_ = 0;
  bool finished_ = false;
  std::int32_t exit_code_ = 0;
  bool killed_ = false;  // ProcessExitEvent: killed, signal, vanished
  std::int32_t signal_ = 0;
  bool vanished_ = false;
  std::uint64_t events_ = 0;
  std::uint64_t first_time_ns_ = 0;
  std::uint64_t last_time_ns_ = 0;
  std::uint64_t dropped_ = 0;
  std::uint64_t saturated_events_ = 0;  // Report.saturated_events
  bool saturated_now_ = false;          // the event being added saturated a sum

  std::vector<std::unique_ptr<Device>> devices_;  // by slot, in order of first appearance
  absl::flat_hash_map<std::uint32_t, std::size_t> device_slots_;
  Device* last_device_ = nullptr;
  std::uint32_t last_device_id_ = 0;  // last_device_'s id

  absl::flat_hash_map<std::uint64_t, Live> live_;
  struct CuptiLive {
    std::uint64_t bytes;
    std::uint32_t memory_kind;
    std::uint32_t device;
  };
  absl::flat_hash_map<std::uint64_t, CuptiLive> cupti_live_;  // CUPTI allocations by address
  absl::flat_hash_map<std::uint64_t, std::vector<std::string>> site_frames_;
  // Calling libraries: names by index (0 = kUnresolvedLibrary), the index of each name, and
  // each defined site's library (Site caches it for the hot path).
  std::vector<std::string> library_names_;
  absl::flat_hash_map<std::string, std::uint32_t> library_index_;
  absl::flat_hash_map<std::uint64_t, std::uint32_t> site_library_;

  std::vector<RangeAgg> ranges_;
  absl::flat_hash_map<std::string, std::size_t> range_index_;  // domain + '\0' + name
  std::vector<OpenRange> open_ranges_;                         // in push order
  std::vector<RangeInstance> range_instances_;  // closed ones, first max_nvtx_instances
  std::uint64_t range_instances_dropped_ = 0;
  absl::flat_hash_map<std::uint32_t, std::vector<std::uint32_t>> thread_ranges_;  // tid -> ids
};

// Many processes, keyed by ProcessKey (host, pid, start time).
class StatsEngine {
 public:
  explicit StatsEngine(StatsOptions options = {}) : options_(options) {}
  ProcessStatsEngine& Process(const v1::ProcessKey& key);
  void AddBatch(const v1::EventBatch& batch) { Process(batch.process()).AddBatch(batch); }
  std::vector<v1::Report> Reports() const;
  std::size_t size() const { return processes_.size(); }

 private:
  StatsOptions options_;
  absl::flat_hash_map<std::string, std::unique_ptr<ProcessStatsEngine>> processes_;
  std::vector<std::string> order_;
};

}  // namespace vramscope::collector
