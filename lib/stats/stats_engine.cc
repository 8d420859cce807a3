// ProcessStatsEngine: see stats_engine.h for what is computed and the accounting rules.
#include "stats/stats_engine.h"

#include <absl/container/node_hash_map.h>
#include <absl/strings/ascii.h>
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <utility>

namespace vramscope::collector {
namespace {

constexpr int kKinds = v1::AllocationKind_ARRAYSIZE;  // AllocationKind values 0..11

std::uint64_t SubtractSaturating(std::uint64_t a, std::uint64_t b) { return a > b ? a - b : 0; }

// a + b held at 2^64-1 (times and other figures that are not counted as saturated events).
std::uint64_t AddClamped(std::uint64_t a, std::uint64_t b) {
  std::uint64_t sum;
  return __builtin_add_overflow(a, b, &sum) ? UINT64_MAX : sum;
}

// a + b held at the int64 range.
std::int64_t AddClampedSigned(std::int64_t a, std::int64_t b) {
  std::int64_t sum;
  if (!__builtin_add_overflow(a, b, &sum)) return sum;
  return b > 0 ? INT64_MAX : INT64_MIN;
}

// to - from as a signed figure, held at the int64 range (byte counts can exceed INT64_MAX).
std::int64_t DifferenceClamped(std::uint64_t to, std::uint64_t from) {
  if (to >= from) {
    const std::uint64_t up = to - from;
    return up > static_cast<std::uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<std::int64_t>(up);
  }
  const std::uint64_t down = from - to;
  return down > static_cast<std::uint64_t>(INT64_MAX) ? INT64_MIN
                                                      : -static_cast<std::int64_t>(down);
}

// CUpti_ActivityMemoryKind values 0..7, and the ones that are device memory.
constexpr int kCuptiMemoryKinds = 8;
constexpr const char* kCuptiMemoryKindNames[kCuptiMemoryKinds] = {
    "unknown", "pageable", "pinned",        "device",
    "array",   "managed",  "device_static", "managed_static"};
bool CuptiKindIsDevice(std::uint32_t kind) { return kind >= 3 && kind <= 7; }

int KindIndex(v1::AllocationKind kind) {
  const int k = static_cast<int>(kind);
  return k >= 0 && k < kKinds ? k : 0;
}

std::string KindName(int kind) {
  std::string name = v1::AllocationKind_Name(static_cast<v1::AllocationKind>(kind));
  constexpr std::string_view kPrefix = "ALLOCATION_KIND_";
  if (name.rfind(kPrefix, 0) == 0) name = name.substr(kPrefix.size());
  return absl::AsciiStrToLower(name);
}

bool StartsWith(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

// The module path of a drain-named frame "PATH+0xOFFSET"; empty for "0xADDRESS" and anything
// not in that form.
std::string_view FrameModule(std::string_view frame) {
  const std::size_t plus = frame.rfind("+0x");
  if (plus == std::string_view::npos || plus == 0) return {};
  const std::string_view hex = frame.substr(plus + 3);
  if (hex.empty() || !std::all_of(hex.begin(), hex.end(), [](char c) {
        return absl::ascii_isxdigit(static_cast<unsigned char>(c));
      })) {
    return {};
  }
  return frame.substr(0, plus);
}

// Min-heap order for Device::largest: the smallest request on top.
bool LargerRequest(const std::uint64_t a, const std::uint64_t b) { return a > b; }

}  // namespace

std::string CallingLibrary(absl::Span<const std::string> frames) {
  for (const std::string& frame : frames) {
    const std::string_view module = FrameModule(frame);
    if (module.empty()) return std::string(kUnknownLibrary);
    const std::size_t slash = module.rfind('/');
    const std::string_view base =
        slash == std::string_view::npos ? module : module.substr(slash + 1);
    if (StartsWith(base, "libcudart") || StartsWith(base, "libcuda.so") ||
        StartsWith(base, "libvramscope")) {
      continue;
    }
    if (base.empty()) return std::string(kUnknownLibrary);
    return std::string(base);
  }
  return std::string(kUnknownLibrary);
}

struct ProcessStatsEngine::Site {
  std::uint64_t id = 0;
  std::uint64_t alloc_count = 0, total_bytes = 0, live_bytes = 0, peak_live_bytes = 0;
  // Live requested bytes of the kinds that count (KindCountsBytes), held by `library`, the
  // site's calling library when the site was last attributed (0 = unresolved).
  std::uint64_t counted_live = 0;
  std::uint32_t library = 0;
};

struct ProcessStatsEngine::Device {
  std::uint32_t id = 0;
  std::size_t slot = 0;
  std::uint64_t cur_requested = 0, peak_requested = 0;
  std::uint64_t cur_allocated = 0, peak_allocated = 0;
  std::uint64_t cur_reserved = 0, peak_reserved = 0;
  std::uint64_t alloc_count = 0, free_count = 0, reserve_count = 0, release_count = 0;
  std::array<std::uint64_t, kKinds> kind_current{};
  std::array<std::uint64_t, kKinds> kind_peak{};
  bool has_pool_state = false;
  v1::PoolStateEvent pool_state;
  // At the last new peak of reserved: the pool state then and requested/allocated then. The
  // shim writes its POOL_STATE record just after the allocation whose reservation made the peak,
  // so the first state that arrives while reserved is still at a new peak replaces the older one
  // copied at the reservation (awaiting_state); later states at the same peak (the pool keeping
  // its reservation while allocations are freed, up to exit) describe other moments and do not.
  bool at_peak_has_state = false;
  bool at_peak_awaiting_state = false;
  v1::PoolStateEvent at_peak_state;
  std::uint64_t at_peak_requested = 0, at_peak_allocated = 0;
  std::vector<v1::OomRecord> ooms;  // the first max_ooms
  std::uint64_t oom_count = 0;      // all of them
  Timeline timeline;
  bool has_counters = false;
  v1::DeviceCounters counters;
  bool has_cupti = false;
  v1::CuptiStats cupti;
  std::array<std::uint64_t, kCuptiMemoryKinds> cupti_kind_current{};
  std::array<std::uint64_t, kCuptiMemoryKinds> cupti_kind_peak{};
  // By id; node_hash_map: Live::site points into it.
  absl::node_hash_map<std::uint64_t, Site> sites;
  // By calling library index, always sized to ProcessStatsEngine::library_names_: live and peak
  // requested bytes.
  struct LibraryBytes {
    std::uint64_t live = 0, peak = 0;
  };
  std::vector<LibraryBytes> libraries;
  bool any_site = false;  // an allocation of a counted kind had a site
  std::uint64_t no_site_live = 0, no_site_peak = 0;
  // DeviceReport.allocations: allocations of counted kinds seen; the event number and time of
  // the last new peak of allocated bytes; what was live then and freed since (cleared at a new
  // peak); the largest freed allocations, a min-heap by requested bytes (LargerRequest).
  std::uint64_t counted_allocs = 0;
  bool has_peak = false;
  std::uint64_t peak_seq = 0, peak_time_ns = 0;
  std::vector<Freed> freed_since_peak;
  std::vector<Freed> largest;

  explicit Device(std::size_t max_points) : timeline(max_points) {}
};

struct ProcessStatsEngine::RangeAgg {
  std::string name;
  std::string domain;
  std::uint64_t count = 0;
  std::uint64_t total_time_ns = 0;
  struct PerDevice {
    bool touched = false;
    std::uint64_t peak_allocated = 0;
    std::int64_t net_growth = 0;
    std::uint64_t alloc_count = 0;
  };
  std::vector<PerDevice> devices;  // by device slot
  PerDevice& At(std::size_t slot) {
    if (devices.size() <= slot) devices.resize(slot + 1);
    return devices[slot];
  }
};

ProcessStatsEngine::ProcessStatsEngine(StatsOptions options) : options_(options) {
  library_names_.emplace_back(kUnresolvedLibrary);
  library_index_.emplace(kUnresolvedLibrary, 0);
}
ProcessStatsEngine::~ProcessStatsEngine() = default;

ProcessStatsEngine::Device& ProcessStatsEngine::NewDeviceFor(std::uint32_t device) {
  auto [it, inserted] = device_slots_.try_emplace(device, devices_.size());
  if (inserted) {
    devices_.push_back(std::make_unique<Device>(options_.max_timeline_points));
    devices_.back()->id = device;
    devices_.back()->slot = it->second;
    devices_.back()->libraries.resize(library_names_.size());
  }
  last_device_ = devices_[it->second].get();
  last_device_id_ = device;
  return *last_device_;
}

void ProcessStatsEngine::Sample(Device& device, std::uint64_t time_ns) {
  device.timeline.Add(time_ns, device.cur_requested, device.cur_allocated, device.cur_reserved);
}

void ProcessStatsEngine::AllocatedRose(Device& device) {
  if (device.cur_allocated > device.peak_allocated) device.peak_allocated = device.cur_allocated;
  // Only the newest open range tracks the running maximum; older ones take it over at pop
  // (CloseRange), which keeps this O(1) per allocation.
  if (!open_ranges_.empty()) {
    OpenRange& newest = open_ranges_.back();
    if (newest.running.size() <= device.slot) newest.running.resize(device.slot + 1, 0);
    newest.running[device.slot] = std::max(newest.running[device.slot], device.cur_allocated);
  }
}

void ProcessStatsEngine::Count(std::uint64_t t) {
  ++events_;
  if (t != 0) {
    if (first_time_ns_ == 0 || t < first_time_ns_) first_time_ns_ = t;
    if (t > last_time_ns_) last_time_ns_ = t;
  }
}

void ProcessStatsEngine::Add(const MemoryEvent& event) {
  Count(event.time_ns);
  if (event.alloc) {
    OnAlloc(event);
  } else {
    OnFree(event);
  }
  if (saturated_now_) {
    saturated_now_ = false;
    ++saturated_events_;
  }
}

void ProcessStatsEngine::Add(const v1::Event& event) {
  // Allocations and frees take the one path the collector's decoded events take.
  if (event.payload_case() == v1::Event::kAlloc) {
    const v1::AllocEvent& alloc = event.alloc();
    Add(MemoryEvent{event.time_ns(), alloc.address(), alloc.requested_bytes(),
                    alloc.allocated_bytes(), alloc.site(), event.device(), event.thread_id(),
                    alloc.nvtx_range(), alloc.kind(), /*alloc=*/true});
    return;
  }
  if (event.payload_case() == v1::Event::kFree) {
    const v1::FreeEvent& free = event.free();
    Add(MemoryEvent{event.time_ns(), free.address(), free.requested_bytes(), free.allocated_bytes(),
                    0, event.device(), event.thread_id(), 0, free.kind(),
                    /*alloc=*/false});
    return;
  }
  const std::uint64_t t = event.time_ns();
  Count(t);
  switch (event.payload_case()) {
    case v1::Event::kAlloc:
    case v1::Event::kFree:
      break;  // above
    case v1::Event::kPoolReserve: {
      Device& device = DeviceFor(event.device());
      ++device.reserve_count;
      OnReserve(device, event.pool_reserve().bytes(), t);
      break;
    }
    case v1::Event::kPoolRelease: {
      Device& device = DeviceFor(event.device());
      ++device.release_count;
      OnRelease(device, event.pool_release().bytes(), t);
      break;
    }
    case v1::Event::kNvtxPush:
      OnNvtxPush(event);
      break;
    case v1::Event::kNvtxPop:
      OnNvtxPop(event);
      break;
    case v1::Event::kOom:
      OnOom(event);
      break;
    case v1::Event::kPoolState:
      OnPoolState(event.pool_state(), DeviceFor(event.device()));
      break;
    case v1::Event::kProcessStart:
      start_ = event.process_start();
      has_start_ = true;
      start_monotonic_ns_ = t;
      for (const v1::DeviceInfo& info : start_.devices()) DeviceFor(info.ordinal());
      break;
    case v1::Event::kProcessExit:
      finished_ = true;
      exit_code_ = event.process_exit().exit_code();
      killed_ = event.process_exit().killed();
      signal_ = event.process_exit().signal();
      vanished_ = event.process_exit().vanished();
      break;
    case v1::Event::kDrop:
      dropped_ = Plus(dropped_, event.drop().dropped_records());
      break;
    case v1::Event::kSiteDefinition:
      OnSiteDefinition(event.site_definition());
      break;
    case v1::Event::kCuptiMemory:
      OnCupti(event);
      break;
    case v1::Event::PAYLOAD_NOT_SET:
      break;
  }
  if (saturated_now_) {
    saturated_now_ = false;
    ++saturated_events_;
  }
}

void ProcessStatsEngine::OnOom(const v1::Event& event) {
  const std::uint64_t t = event.time_ns();
  Device& device = DeviceFor(event.device());
  ++device.oom_count;
  if (device.ooms.size() < options_.max_ooms) {
    const v1::OomEvent& oom = event.oom();
    v1::OomRecord& record = device.ooms.emplace_back();
    record.set_time_ns(t);
    record.set_requested_bytes(oom.requested_bytes());
    record.set_free_bytes(oom.free_bytes());
    record.set_largest_free_block_bytes(oom.largest_free_block_bytes());
    v1::OomVerdict verdict = oom.verdict();
    if (verdict == v1::OOM_VERDICT_UNSPECIFIED) {
      verdict = oom.free_bytes() >= oom.requested_bytes() ? v1::OOM_VERDICT_FRAGMENTATION
                                                          : v1::OOM_VERDICT_CAPACITY;
    }
    record.set_verdict(verdict);
  }
}

void ProcessStatsEngine::AddLibraryBytes(Device& device, std::uint32_t library,
                                         std::uint64_t bytes) {
  Device::LibraryBytes& held = device.libraries[library];  // sized to library_names_
  held.live = Plus(held.live, bytes);
  held.peak = std::max(held.peak, held.live);
}

void ProcessStatsEngine::OnSiteDefinition(const v1::SiteDefinition& site) {
  std::vector<std::string>& frames = site_frames_[site.site()];
  frames.assign(site.frames().begin(), site.frames().end());
  if (site.site() == 0) return;  // 0 means "no site" on an AllocEvent
  std::string name = CallingLibrary(frames);
  auto [named, added] = library_index_.try_emplace(
      std::move(name), static_cast<std::uint32_t>(library_names_.size()));
  if (added) {
    library_names_.push_back(named->first);
    for (const auto& device : devices_) device->libraries.resize(library_names_.size());
  }
  const std::uint32_t library = named->second;
  auto [known, inserted] = site_library_.try_emplace(site.site(), library);
  if (!inserted) {
    if (known->second == library) return;  // sent again (a resend): nothing moves
    known->second = library;
  }
  // Allocations that named this site before its definition arrived (another thread's alloc
  // overtook it in the ring) were counted as unresolved: their live bytes move to the library
  // now. What the library held only while unresolved stays in the unresolved peak.
  for (const auto& device : devices_) {
    auto entry = device->sites.find(site.site());
    if (entry == device->sites.end() || entry->second.library == library) continue;
    Site& moved = entry->second;
    Device::LibraryBytes& from = device->libraries[moved.library];
    from.live = SubtractSaturating(from.live, moved.counted_live);
    moved.library = library;
    AddLibraryBytes(*device, library, moved.counted_live);
  }
}

void ProcessStatsEngine::OnCupti(const v1::Event& event) {
  const v1::CuptiMemoryEvent& e = event.cupti_memory();
  Device& device = DeviceFor(event.device());
  device.has_cupti = true;
  v1::CuptiStats& c = device.cupti;
  c.set_last_time_ns(std::max(c.last_time_ns(), event.time_ns()));
  auto add = [&](std::uint32_t kind, std::uint64_t bytes) {
    const int k = kind < kCuptiMemoryKinds ? static_cast<int>(kind) : 0;
    device.cupti_kind_current[k] = Plus(device.cupti_kind_current[k], bytes);
    device.cupti_kind_peak[k] = std::max(device.cupti_kind_peak[k], device.cupti_kind_current[k]);
    if (CuptiKindIsDevice(kind)) {
      c.set_current_bytes(Plus(c.current_bytes(), bytes));
      c.set_peak_bytes(std::max(c.peak_bytes(), c.current_bytes()));
    }
  };
  auto remove = [&](Device& d, std::uint32_t kind, std::uint64_t bytes) {
    const int k = kind < kCuptiMemoryKinds ? static_cast<int>(kind) : 0;
    d.cupti_kind_current[k] = SubtractSaturating(d.cupti_kind_current[k], bytes);
    if (CuptiKindIsDevice(kind)) {
      d.cupti.set_current_bytes(SubtractSaturating(d.cupti.current_bytes(), bytes));
    }
  };
  switch (e.operation()) {
    case v1::CuptiMemoryEvent::OPERATION_ALLOCATION: {
      c.set_alloc_count(c.alloc_count() + 1);
      auto [it, inserted] = cupti_live_.try_emplace(e.address());
      if (!inserted) {
        // Its release was lost (dropped records): retire it first.
        remove(DeviceFor(it->second.device), it->second.memory_kind, it->second.bytes);
      }
      it->second = CuptiLive{e.bytes(), e.memory_kind(), event.device()};
      add(e.memory_kind(), e.bytes());
      break;
    }
    case v1::CuptiMemoryEvent::OPERATION_RELEASE: {
      c.set_free_count(c.free_count() + 1);
      auto it = cupti_live_.find(e.address());
      if (it == cupti_live_.end()) {
        // Allocated before CUPTI started, or its record was dropped: never counted.
        break;
      }
      const CuptiLive live = it->second;
      cupti_live_.erase(it);
      remove(DeviceFor(live.device), live.memory_kind, live.bytes);
      break;
    }
    case v1::CuptiMemoryEvent::OPERATION_POOL_CREATED:
    case v1::CuptiMemoryEvent::OPERATION_POOL_DESTROYED:
    case v1::CuptiMemoryEvent::OPERATION_POOL_TRIMMED:
      c.set_pool_operations(c.pool_operations() + 1);
      break;
    case v1::CuptiMemoryEvent::OPERATION_RECORDS_DROPPED:
      c.set_dropped_records(Plus(c.dropped_records(), e.records_dropped()));
      break;
    default:
      break;
  }
}

void ProcessStatsEngine::OnAlloc(const MemoryEvent& alloc) {
  const v1::AllocationKind kind = alloc.kind;
  const std::uint64_t t = alloc.time_ns;
  Device* device = &DeviceFor(alloc.device);
  ++device->alloc_count;
  // An address still live means its free was lost (dropped records): retire it first.
  auto [it, inserted] = live_.try_emplace(alloc.address);
  if (!inserted) {
    const std::uint32_t old_device = it->second.device;
    MemoryEvent implicit_free;
    implicit_free.time_ns = t;
    implicit_free.address = alloc.address;
    OnFree(implicit_free);               // erases the entry
    --DeviceFor(old_device).free_count;  // not a real free
    it = live_.try_emplace(alloc.address).first;
    device = &DeviceFor(alloc.device);  // OnFree moved the cache (Device entries are stable)
  }
  it->second =
      Live{alloc.requested_bytes, alloc.allocated_bytes, nullptr, t, alloc.device, kind, events_,
           alloc.thread_id};
  Device& d = *device;
  const int k = KindIndex(kind);
  d.kind_current[k] = Plus(d.kind_current[k], alloc.allocated_bytes);
  d.kind_peak[k] = std::max(d.kind_peak[k], d.kind_current[k]);
  const bool counts = KindCountsBytes(kind);
  if (counts) {
    d.cur_requested = Plus(d.cur_requested, alloc.requested_bytes);
    d.peak_requested = std::max(d.peak_requested, d.cur_requested);
    d.cur_allocated = Plus(d.cur_allocated, alloc.allocated_bytes);
    ++d.counted_allocs;
    if (d.cur_allocated > d.peak_allocated) {
      // A new peak: what is live now is the state at the peak; frees kept for the old one go.
      d.has_peak = true;
      d.peak_seq = events_;
      d.peak_time_ns = t;
      for (const Freed& freed : d.freed_since_peak) OfferLargest(d, freed);
      d.freed_since_peak.clear();
    }
    AllocatedRose(d);
    if (KindCountsReserved(kind)) {
      OnReserve(d, alloc.allocated_bytes, t);  // samples the timeline
    } else {
      Sample(d, t);
    }
  }
  it->second.site = SiteAlloc(d, alloc.site, alloc.requested_bytes, counts);
  if (!open_ranges_.empty()) {
    // Innermost range: the one the shim named, else the top of the thread's stack.
    std::uint32_t range = alloc.nvtx_range;
    if (range == 0) {
      auto stack = thread_ranges_.find(alloc.thread_id);
      if (stack != thread_ranges_.end() && !stack->second.empty()) range = stack->second.back();
    }
    if (range != 0) {
      for (auto open = open_ranges_.rbegin(); open != open_ranges_.rend(); ++open) {
        if (open->range_id == range) {
          ranges_[open->agg].At(d.slot).alloc_count++;
          it->second.range_agg = static_cast<std::int32_t>(open->agg);
          break;
        }
      }
    }
  }
}

ProcessStatsEngine::Site* ProcessStatsEngine::SiteAlloc(Device& d, std::uint64_t site_id,
                                                        std::uint64_t bytes, bool counts) {
  if (site_id == 0) {
    if (counts) {
      d.no_site_live = Plus(d.no_site_live, bytes);
      d.no_site_peak = std::max(d.no_site_peak, d.no_site_live);
    }
    return nullptr;
  }
  auto [entry, inserted] = d.sites.try_emplace(site_id);
  Site& site = entry->second;
  if (inserted) {
    // First use of the site on this device: its library, or unresolved until defined.
    site.id = site_id;
    auto library = site_library_.find(site_id);
    if (library != site_library_.end()) site.library = library->second;
  }
  ++site.alloc_count;
  site.total_bytes = Plus(site.total_bytes, bytes);
  site.live_bytes = Plus(site.live_bytes, bytes);
  site.peak_live_bytes = std::max(site.peak_live_bytes, site.live_bytes);
  if (counts) {
    d.any_site = true;
    site.counted_live = Plus(site.counted_live, bytes);
    AddLibraryBytes(d, site.library, bytes);
  }
  return &site;
}

void ProcessStatsEngine::SiteFree(Device& d, Site* entry, std::uint64_t bytes, bool counts) {
  if (entry == nullptr) {
    if (counts) d.no_site_live = SubtractSaturating(d.no_site_live, bytes);
    return;
  }
  Site& site = *entry;
  site.live_bytes = SubtractSaturating(site.live_bytes, bytes);
  if (counts) {
    // The library the site's bytes are held by now (moved there if defined meanwhile).
    site.counted_live = SubtractSaturating(site.counted_live, bytes);
    Device::LibraryBytes& held = d.libraries[site.library];
    held.live = SubtractSaturating(held.live, bytes);
  }
}

void ProcessStatsEngine::OnFree(const MemoryEvent& event) {
  auto it = live_.find(event.address);
  if (it == live_.end()) {
    // Unknown address: its allocation was dropped (or predates tracing). Its bytes were never
    // added, so none are taken away; the ring counters correct the totals.
    ++DeviceFor(event.device).free_count;
    return;
  }
  const Live live = it->second;
  live_.erase(it);
  // Frees are routed by address, not by the device current on the freeing thread.
  Device& d = DeviceFor(live.device);
  ++d.free_count;
  const int k = KindIndex(live.kind);
  d.kind_current[k] = SubtractSaturating(d.kind_current[k], live.allocated);
  const bool counts = KindCountsBytes(live.kind);
  SiteFree(d, live.site, live.requested, counts);
  if (!counts) return;
  KeepFreed(d, event.address, live, event.time_ns);
  d.cur_requested = SubtractSaturating(d.cur_requested, live.requested);
  d.cur_allocated = SubtractSaturating(d.cur_allocated, live.allocated);
  if (KindCountsReserved(live.kind)) {
    OnRelease(d, live.allocated, event.time_ns);
  } else {
    Sample(d, event.time_ns);
  }
}

void ProcessStatsEngine::KeepFreed(Device& d, std::uint64_t address, const Live& live,
                                   std::uint64_t free_ns) {
  // Made before the peak and live until now: part of the state at the peak, listed apart; it
  // competes for the largest others only once a new peak leaves it behind.
  if (d.has_peak && live.seq <= d.peak_seq) {
    d.freed_since_peak.push_back(Freed{address, live, free_ns});
    return;
  }
  // Most frees are no larger than the smallest of a full heap: OfferLargest would keep nothing.
  const std::size_t cap = options_.max_allocations;
  if (cap == 0 || (d.largest.size() >= cap && live.requested <= d.largest.front().live.requested)) {
    return;
  }
  OfferLargest(d, Freed{address, live, free_ns});
}

void ProcessStatsEngine::OfferLargest(Device& d, const Freed& freed) const {
  const std::size_t cap = options_.max_allocations;
  if (cap == 0) return;
  auto order = [](const Freed& a, const Freed& b) {
    return LargerRequest(a.live.requested, b.live.requested);
  };
  if (d.largest.size() < cap) {
    d.largest.push_back(freed);
    std::push_heap(d.largest.begin(), d.largest.end(), order);
  } else if (freed.live.requested > d.largest.front().live.requested) {
    std::pop_heap(d.largest.begin(), d.largest.end(), order);
    d.largest.back() = freed;
    std::push_heap(d.largest.begin(), d.largest.end(), order);
  }
}

void ProcessStatsEngine::OnReserve(Device& device, std::uint64_t bytes, std::uint64_t time_ns) {
  device.cur_reserved = Plus(device.cur_reserved, bytes);
  if (device.cur_reserved > device.peak_reserved) {
    device.peak_reserved = device.cur_reserved;
    device.at_peak_requested = device.cur_requested;
    device.at_peak_allocated = device.cur_allocated;
    device.at_peak_has_state = device.has_pool_state;
    if (device.has_pool_state) device.at_peak_state = device.pool_state;
    device.at_peak_awaiting_state = true;
  }
  Sample(device, time_ns);
}

void ProcessStatsEngine::OnRelease(Device& device, std::uint64_t bytes, std::uint64_t time_ns) {
  device.cur_reserved = SubtractSaturating(device.cur_reserved, bytes);
  // Left the peak before a state described it: the state copied at the reservation stays.
  if (device.cur_reserved < device.peak_reserved) device.at_peak_awaiting_state = false;
  Sample(device, time_ns);
}

void ProcessStatsEngine::OnPoolState(const v1::PoolStateEvent& state, Device& device) {
  device.pool_state = state;
  device.has_pool_state = true;
  // The first snapshot after reserved reached a new peak (and still at it) describes the pool at
  // that moment better than the one copied at the reservation; later ones do not (see Device).
  if (device.at_peak_awaiting_state && device.cur_reserved == device.peak_reserved) {
    device.at_peak_awaiting_state = false;
    device.at_peak_state = state;
    device.at_peak_has_state = true;
    device.at_peak_requested = device.cur_requested;
    device.at_peak_allocated = device.cur_allocated;
  }
}

void ProcessStatsEngine::OnNvtxPush(const v1::Event& event) {
  const v1::NvtxPushEvent& push = event.nvtx_push();
  std::string key = push.domain();
  key.push_back('\0');
  key += push.name();
  auto [it, inserted] = range_index_.try_emplace(std::move(key), ranges_.size());
  if (inserted) {
    RangeAgg& agg = ranges_.emplace_back();
    agg.name = push.name();
    agg.domain = push.domain();
  }
  OpenRange& open = open_ranges_.emplace_back();
  open.range_id = push.range_id();
  open.thread_id = event.thread_id();
  open.agg = it->second;
  open.start_ns = event.time_ns();
  open.at_push.resize(devices_.size());
  for (const auto& device : devices_) open.at_push[device->slot] = device->cur_allocated;
  open.running = open.at_push;
  std::vector<std::uint32_t>& thread_stack = thread_ranges_[event.thread_id()];
  open.depth = static_cast<std::uint32_t>(thread_stack.size());
  thread_stack.push_back(push.range_id());
}

void ProcessStatsEngine::CloseRange(std::vector<OpenRange>& open, std::size_t index,
                                    std::uint64_t time_ns, std::vector<RangeAgg>& ranges) const {
  OpenRange& range = open[index];
  RangeAgg& agg = ranges[range.agg];
  ++agg.count;
  agg.total_time_ns = AddClamped(agg.total_time_ns, SubtractSaturating(time_ns, range.start_ns));
  // The highest allocated since this push is the maximum over this range's running value and
  // those of every range opened after it.
  std::vector<std::uint64_t> peak = range.running;
  for (std::size_t j = index + 1; j < open.size(); ++j) {
    const std::vector<std::uint64_t>& later = open[j].running;
    if (peak.size() < later.size()) peak.resize(later.size(), 0);
    for (std::size_t s = 0; s < later.size(); ++s) peak[s] = std::max(peak[s], later[s]);
  }
  for (const auto& device : devices_) {
    const std::size_t s = device->slot;
    RangeAgg::PerDevice& per = agg.At(s);
    per.touched = true;
    const std::uint64_t at_push = s < range.at_push.size() ? range.at_push[s] : 0;
    const std::uint64_t high = std::max(s < peak.size() ? peak[s] : 0, at_push);
    per.peak_allocated = std::max(per.peak_allocated, high);
    per.net_growth =
        AddClampedSigned(per.net_growth, DifferenceClamped(device->cur_allocated, at_push));
  }
  // Hand this range's running maximum to the range opened just before it, which covers it.
  if (index > 0) {
    std::vector<std::uint64_t>& before = open[index - 1].running;
    if (before.size() < range.running.size()) before.resize(range.running.size(), 0);
    for (std::size_t s = 0; s < range.running.size(); ++s) {
      before[s] = std::max(before[s], range.running[s]);
    }
  }
  open.erase(open.begin() + static_cast<std::ptrdiff_t>(index));
}

void ProcessStatsEngine::OnNvtxPop(const v1::Event& event) {
  const std::uint32_t id = event.nvtx_pop().range_id();
  // Newest first: a pop nearly always closes the most recent push.
  for (std::size_t i = open_ranges_.size(); i-- > 0;) {
    if (open_ranges_[i].range_id != id) continue;
    auto stack = thread_ranges_.find(open_ranges_[i].thread_id);
    if (stack != thread_ranges_.end()) {
      std::vector<std::uint32_t>& ids = stack->second;
      auto pos = std::find(ids.rbegin(), ids.rend(), id);
      if (pos != ids.rend()) ids.erase(std::next(pos).base());
    }
    const OpenRange& closing = open_ranges_[i];
    if (range_instances_.size() < options_.max_nvtx_instances) {
      range_instances_.push_back({closing.agg, closing.start_ns, event.time_ns(), closing.depth,
                                  closing.thread_id, devices_.size()});
    } else {
      ++range_instances_dropped_;
    }
    CloseRange(open_ranges_, i, event.time_ns(), ranges_);
    return;
  }
}

void ProcessStatsEngine::AddBatch(const v1::EventBatch& batch) {
  if (!has_key_ && batch.has_process()) {
    key_ = batch.process();
    has_key_ = true;
  }
  for (const v1::Event& event : batch.events()) Add(event);
  for (const v1::DeviceCounters& counters : batch.counters()) AddCounters(counters);
}

void ProcessStatsEngine::AddBatch(const v1::EventBatch& batch,
                                  absl::Span<const BatchEvent> events) {
  if (!has_key_ && batch.has_process()) {
    key_ = batch.process();
    has_key_ = true;
  }
  for (const BatchEvent& event : events) {
    if (event.other != nullptr) {
      Add(*event.other);
    } else {
      Add(event.memory);
    }
  }
  for (const v1::DeviceCounters& counters : batch.counters()) AddCounters(counters);
}

void ProcessStatsEngine::AddCounters(const v1::DeviceCounters& counters) {
  Device& device = DeviceFor(counters.device());
  device.counters = counters;
  device.has_counters = true;
}

namespace {

void FillFragmentation(bool has_state, const v1::PoolStateEvent& state, std::uint64_t requested,
                       std::uint64_t allocated, std::uint64_t reserved,
                       v1::FragmentationStats* out) {
  out->set_rounding_waste_bytes(SubtractSaturating(allocated, requested));
  if (has_state) {
    out->set_free_bytes(state.free_bytes());
    out->set_largest_free_block_bytes(state.largest_free_block_bytes());
    out->set_unreleasable_free_bytes(state.unreleasable_free_bytes());
    out->set_largest_allocatable_bytes(state.largest_free_block_bytes());
    out->set_pending_fence_bytes(std::min(state.pending_bytes(), state.free_bytes()));
    // Freed blocks still waiting for their fence are not fragmentation (they become one free
    // run again once it completes): the ratio is over the free bytes usable now.
    const std::uint64_t usable = SubtractSaturating(state.free_bytes(), state.pending_bytes());
    out->set_external_fragmentation(
        usable == 0
            ? 0.0
            : 1.0 - static_cast<double>(std::min(state.largest_free_block_bytes(), usable)) /
                        static_cast<double>(usable));
  } else {
    // No pool snapshot (passthrough, or none recorded yet): only what the totals say.
    out->set_free_bytes(SubtractSaturating(reserved, allocated));
  }
}

}  // namespace

DeviceGauges ProcessStatsEngine::Figures(const Device& d) const {
  DeviceGauges g;
  g.device = d.id;
  g.requested = d.cur_requested;
  g.peak_requested = d.peak_requested;
  g.allocated = d.cur_allocated;
  g.peak_allocated = d.peak_allocated;
  g.reserved = d.cur_reserved;
  g.peak_reserved = d.peak_reserved;
  g.dropped_records = dropped_;
  if (d.has_counters) {
    const v1::DeviceCounters& c = d.counters;
    g.dropped_records = std::max(g.dropped_records, c.records_dropped());
    g.peak_requested = std::max(g.peak_requested, c.peak_requested_bytes());
    g.peak_allocated = std::max(g.peak_allocated, c.peak_allocated_bytes());
    g.peak_reserved = std::max(g.peak_reserved, c.peak_reserved_bytes());
    if (g.dropped_records > 0) {
      // Events are incomplete: the writer's running totals are the truth.
      g.requested = c.current_requested_bytes();
      g.allocated = c.current_allocated_bytes();
      g.reserved = c.current_reserved_bytes();
    }
  }
  return g;
}

std::vector<DeviceGauges> ProcessStatsEngine::Gauges() const {
  std::vector<DeviceGauges> out;
  out.reserve(devices_.size());
  for (const auto& d : devices_) {
    DeviceGauges g = Figures(*d);
    v1::FragmentationStats fragmentation;
    FillFragmentation(d->has_pool_state, d->pool_state, g.requested, g.allocated, g.reserved,
                      &fragmentation);
    g.external_fragmentation = fragmentation.external_fragmentation();
    g.allocs = d->alloc_count;
    g.frees = d->free_count;
    g.ooms = d->oom_count;
    g.has_cupti = d->has_cupti;
    g.cupti_bytes = d->cupti.current_bytes();
    g.cupti_peak_bytes = d->cupti.peak_bytes();
    g.cupti_dropped_records = d->cupti.dropped_records();
    out.push_back(g);
  }
  std::sort(out.begin(), out.end(),
            [](const DeviceGauges& a, const DeviceGauges& b) { return a.device < b.device; });
  return out;
}

std::uint64_t ProcessStatsEngine::LastEventWallNs() const {
  if (!has_key_ || key_.start_time_ns() == 0) return 0;
  const std::uint64_t origin = has_start_ ? start_monotonic_ns_ : first_time_ns_;
  return AddClamped(key_.start_time_ns(), SubtractSaturating(last_time_ns_, origin));
}

v1::Report ProcessStatsEngine::Report(ReportAllocations allocations) const {
  v1::Report report;
  ReportProcess(&report);

  // Ranges still open are reported as if they closed at the last event.
  std::vector<RangeAgg> ranges = ranges_;
  std::vector<OpenRange> open = open_ranges_;
  std::vector<RangeInstance> instances = range_instances_;
  std::uint64_t instances_dropped = range_instances_dropped_;
  for (const OpenRange& range : open) {
    if (instances.size() < options_.max_nvtx_instances) {
      instances.push_back({range.agg, range.start_ns, std::max(last_time_ns_, range.start_ns),
                           range.depth, range.thread_id, devices_.size()});
    } else {
      ++instances_dropped;
    }
  }
  std::stable_sort(
      instances.begin(), instances.end(),
      [](const RangeInstance& a, const RangeInstance& b) { return a.start_ns < b.start_ns; });
  while (!open.empty()) CloseRange(open, open.size() - 1, last_time_ns_, ranges);

  const double seconds =
      static_cast<double>(SubtractSaturating(last_time_ns_, first_time_ns_)) / 1e9;
  // Top sites, timeline and leaks (kFiguresOnly leaves them out).
  const bool details = allocations != ReportAllocations::kFiguresOnly;
  std::vector<const Device*> sorted;
  for (const auto& device : devices_) sorted.push_back(device.get());
  std::sort(sorted.begin(), sorted.end(),
            [](const Device* a, const Device* b) { return a->id < b->id; });

  for (const Device* d : sorted) {
    v1::DeviceReport* out = report.add_devices();
    ReportDeviceFigures(*d, seconds, out);
    ReportNvtxRanges(*d, ranges, out);
    if (details) ReportTopSites(*d, out);
    ReportDeviceRest(*d, ranges, instances, instances_dropped, allocations, out);
  }

  if (details) ReportLeaks(&report);
  ReportAllocationSites(&report);
  return report;
}

void ProcessStatsEngine::ReportProcess(v1::Report* report) const {
  v1::ProcessKey* key = report->mutable_process();
  if (has_key_) *key = key_;
  if (has_start_) {
    if (key->pid() == 0) key->set_pid(start_.pid());
    if (key->host().empty()) key->set_host(start_.host());
    *report->mutable_command_line() = start_.command_line();
    report->set_mode(start_.mode());
    report->set_uid(start_.uid());
    report->set_identity(start_.identity());
    *report->mutable_labels() = start_.labels();
  }
  report->set_saturated_events(saturated_events_);
  report->set_finished(finished_);
  report->set_exit_code(exit_code_);
  report->set_killed(killed_);
  report->set_signal(signal_);
  report->set_vanished(vanished_);
  report->set_events(events_);
  // Wall-clock when the key carries the start time (the ring's), else the event clock.
  const std::uint64_t origin = has_start_ ? start_monotonic_ns_ : first_time_ns_;
  if (key->start_time_ns() != 0) {
    report->set_start_time_ns(key->start_time_ns());
    report->set_end_time_ns(
        AddClamped(key->start_time_ns(), SubtractSaturating(last_time_ns_, origin)));
  } else {
    report->set_start_time_ns(origin);
    report->set_end_time_ns(last_time_ns_);
  }
}

void ProcessStatsEngine::ReportDeviceFigures(const Device& d, double seconds,
                                             v1::DeviceReport* out) const {
  out->mutable_device()->set_ordinal(d.id);
  if (has_start_) {
    for (const v1::DeviceInfo& info : start_.devices()) {
      if (info.ordinal() == d.id) *out->mutable_device() = info;
    }
  }
  const DeviceGauges g = Figures(d);
  const std::uint64_t cur_req = g.requested, cur_alloc = g.allocated, cur_res = g.reserved;
  const std::uint64_t peak_alloc = g.peak_allocated, peak_res = g.peak_reserved;
  out->set_dropped_records(g.dropped_records);
  out->set_current_requested_bytes(cur_req);
  out->set_peak_requested_bytes(g.peak_requested);
  out->set_current_allocated_bytes(cur_alloc);
  out->set_peak_allocated_bytes(peak_alloc);
  out->set_current_reserved_bytes(cur_res);
  out->set_peak_reserved_bytes(peak_res);
  out->set_reserved_over_allocated(
      peak_alloc == 0 ? 0.0 : static_cast<double>(peak_res) / static_cast<double>(peak_alloc));
  FillFragmentation(d.has_pool_state, d.pool_state, cur_req, cur_alloc, cur_res,
                    out->mutable_fragmentation());
  FillFragmentation(d.at_peak_has_state, d.at_peak_state, d.at_peak_requested, d.at_peak_allocated,
                    d.peak_reserved, out->mutable_fragmentation_at_peak());
  out->set_alloc_count(d.alloc_count);
  out->set_free_count(d.free_count);
  out->set_allocs_per_second(seconds > 0 ? static_cast<double>(d.alloc_count) / seconds : 0.0);
  out->set_pool_reserve_count(d.reserve_count);
  out->set_pool_release_count(d.release_count);
  for (const v1::OomRecord& oom : d.ooms) *out->add_ooms() = oom;
}

void ProcessStatsEngine::ReportNvtxRanges(const Device& d, const std::vector<RangeAgg>& ranges,
                                          v1::DeviceReport* out) const {
  // NVTX ranges touched on this device, highest peak first.
  std::vector<std::pair<const RangeAgg*, const RangeAgg::PerDevice*>> device_ranges;
  for (const RangeAgg& agg : ranges) {
    if (d.slot < agg.devices.size() && agg.devices[d.slot].touched) {
      device_ranges.emplace_back(&agg, &agg.devices[d.slot]);
    }
  }
  std::sort(device_ranges.begin(), device_ranges.end(), [](const auto& a, const auto& b) {
    if (a.second->peak_allocated != b.second->peak_allocated) {
      return a.second->peak_allocated > b.second->peak_allocated;
    }
    return a.first->name < b.first->name;
  });
  if (device_ranges.size() > options_.max_nvtx_ranges) {
    device_ranges.resize(options_.max_nvtx_ranges);
  }
  for (const auto& [agg, per] : device_ranges) {
    v1::NvtxRangeStats* stats = out->add_nvtx_ranges();
    stats->set_name(agg->name);
    stats->set_domain(agg->domain);
    stats->set_count(agg->count);
    stats->set_peak_allocated_bytes(per->peak_allocated);
    stats->set_net_growth_bytes(per->net_growth);
    stats->set_alloc_count(per->alloc_count);
    stats->set_total_time_ns(agg->total_time_ns);
  }
}

void ProcessStatsEngine::ReportTopSites(const Device& d, v1::DeviceReport* out) const {
  // Top sites by peak live bytes.
  std::vector<std::pair<std::uint64_t, const Site*>> sites;
  sites.reserve(d.sites.size());
  for (const auto& [site, stats] : d.sites) sites.emplace_back(site, &stats);
  std::sort(sites.begin(), sites.end(), [](const auto& a, const auto& b) {
    if (a.second->peak_live_bytes != b.second->peak_live_bytes) {
      return a.second->peak_live_bytes > b.second->peak_live_bytes;
    }
    return a.first < b.first;
  });
  if (sites.size() > options_.max_top_sites) sites.resize(options_.max_top_sites);
  for (const auto& [site, stats] : sites) {
    v1::SiteStats* s = out->add_top_sites();
    s->set_site(site);
    auto frames = site_frames_.find(site);
    if (frames != site_frames_.end()) {
      for (const std::string& frame : frames->second) s->add_frames(frame);
    }
    s->set_alloc_count(stats->alloc_count);
    s->set_total_bytes(stats->total_bytes);
    s->set_peak_live_bytes(stats->peak_live_bytes);
  }
}

void ProcessStatsEngine::ReportDeviceRest(const Device& d, const std::vector<RangeAgg>& ranges,
                                          const std::vector<RangeInstance>& instances,
                                          std::uint64_t instances_dropped,
                                          ReportAllocations allocations,
                                          v1::DeviceReport* out) const {
  if (allocations != ReportAllocations::kFiguresOnly) d.timeline.AppendTo(out->mutable_timeline());
  for (const RangeInstance& instance : instances) {
    if (d.slot >= instance.devices_seen) continue;
    v1::NvtxRangeInstance* shown = out->add_nvtx_instances();
    shown->set_name(ranges[instance.agg].name);
    shown->set_domain(ranges[instance.agg].domain);
    shown->set_start_ns(instance.start_ns);
    shown->set_end_ns(instance.end_ns);
    shown->set_depth(instance.depth);
    shown->set_thread_id(instance.thread_id);
  }
  out->set_nvtx_instances_dropped(instances_dropped);
  if (allocations == ReportAllocations::kInclude) ListAllocations(d, out);
  if (d.has_cupti) {
    v1::CuptiStats* cupti = out->mutable_cupti();
    *cupti = d.cupti;
    for (int k = 0; k < kCuptiMemoryKinds; ++k) {
      if (d.cupti_kind_peak[k] == 0) continue;
      (*cupti->mutable_peak_bytes_by_memory_kind())[kCuptiMemoryKindNames[k]] =
          d.cupti_kind_peak[k];
      (*cupti->mutable_current_bytes_by_memory_kind())[kCuptiMemoryKindNames[k]] =
          d.cupti_kind_current[k];
    }
  }
  for (int k = 0; k < kKinds; ++k) {
    if (d.kind_peak[k] != 0) (*out->mutable_peak_bytes_by_kind())[KindName(k)] = d.kind_peak[k];
  }
  if (d.any_site) {
    for (std::size_t i = 0; i < d.libraries.size(); ++i) {
      if (d.libraries[i].peak == 0) continue;
      (*out->mutable_peak_requested_bytes_by_library())[library_names_[i]] = d.libraries[i].peak;
    }
    out->set_unattributed_peak_requested_bytes(d.no_site_peak);
  }
}

void ProcessStatsEngine::ReportLeaks(v1::Report* report) const {
  // Leaks: what is still live once the process ended, largest first, per device.
  if (finished_) {
    std::vector<std::pair<std::uint64_t, const Live*>> leaks;
    for (const auto& [address, live] : live_) leaks.emplace_back(address, &live);
    std::sort(leaks.begin(), leaks.end(), [](const auto& a, const auto& b) {
      if (a.second->requested != b.second->requested)
        return a.second->requested > b.second->requested;
      return a.first < b.first;
    });
    std::vector<std::size_t> per_device(report->devices_size(), 0);
    for (const auto& [address, live] : leaks) {
      for (int i = 0; i < report->devices_size(); ++i) {
        if (report->devices(i).device().ordinal() != live->device) continue;
        if (per_device[i]++ >= options_.max_leaks) break;
        v1::Leak* leak = report->mutable_devices(i)->add_leaks();
        leak->set_address(address);
        leak->set_requested_bytes(live->requested);
        leak->set_kind(live->kind);
        leak->set_site(live->site != nullptr ? live->site->id : 0);
        leak->set_time_ns(live->time_ns);
        break;
      }
    }
  }
}

void ProcessStatsEngine::ReportAllocationSites(v1::Report* report) const {
  // The frames of every site the allocations and leaks name.
  for (v1::DeviceReport& device : *report->mutable_devices()) {
    std::vector<std::uint64_t> sites;
    for (const v1::AllocationRecord& a : device.allocations()) sites.push_back(a.site());
    for (const v1::Leak& leak : device.leaks()) sites.push_back(leak.site());
    std::sort(sites.begin(), sites.end());
    sites.erase(std::unique(sites.begin(), sites.end()), sites.end());
    for (const std::uint64_t site : sites) {
      if (site != 0) AddAllocationSite(site, &device);
    }
  }
}

void ProcessStatsEngine::AddAllocationSite(std::uint64_t site, v1::DeviceReport* out) const {
  v1::AllocationSite* entry = out->add_allocation_sites();
  entry->set_site(site);
  auto frames = site_frames_.find(site);
  if (frames != site_frames_.end()) {
    for (const std::string& frame : frames->second) entry->add_frames(frame);
  }
  auto library = site_library_.find(site);
  entry->set_library(library != site_library_.end() ? library_names_[library->second]
                                                    : std::string(kUnresolvedLibrary));
}

void ProcessStatsEngine::ListAllocations(const Device& d, v1::DeviceReport* out) const {
  struct Item {
    std::uint64_t address;
    const Live* live;
    std::uint64_t free_ns;  // 0: still live
    bool at_peak;
  };
  auto larger = [](const Item& a, const Item& b) {
    if (a.live->requested != b.live->requested) return a.live->requested > b.live->requested;
    return a.live->seq < b.live->seq;
  };
  // The state at the peak: made before it and live now, or freed since.
  std::vector<Item> peak;
  std::vector<Item> others;
  for (const auto& [address, live] : live_) {
    if (live.device != d.id || !KindCountsBytes(live.kind)) continue;
    const bool at_peak = d.has_peak && live.seq <= d.peak_seq;
    (at_peak ? peak : others).push_back({address, &live, 0, at_peak});
  }
  for (const Freed& freed : d.freed_since_peak) {
    peak.push_back({freed.address, &freed.live, freed.free_ns, true});
  }
  std::sort(peak.begin(), peak.end(), larger);
  out->set_peak_time_ns(d.has_peak ? d.peak_time_ns : 0);
  out->set_peak_live_count(peak.size());
  std::uint64_t omitted_bytes = 0;
  for (std::size_t i = options_.max_peak_allocations; i < peak.size(); ++i) {
    omitted_bytes = AddClamped(omitted_bytes, peak[i].live->requested);
  }
  if (peak.size() > options_.max_peak_allocations) {
    out->set_peak_live_omitted(peak.size() - options_.max_peak_allocations);
    peak.resize(options_.max_peak_allocations);
  }
  out->set_peak_live_omitted_bytes(omitted_bytes);
  // The largest others: freed ones from the heap (which holds none live at the peak) and the
  // live ones made after the peak.
  for (const Freed& freed : d.largest) {
    others.push_back({freed.address, &freed.live, freed.free_ns, false});
  }
  std::sort(others.begin(), others.end(), larger);
  if (others.size() > options_.max_allocations) others.resize(options_.max_allocations);
  std::vector<Item> listed = std::move(peak);
  listed.insert(listed.end(), others.begin(), others.end());
  std::sort(listed.begin(), listed.end(),
            [](const Item& a, const Item& b) { return a.live->seq < b.live->seq; });
  for (const Item& item : listed) {
    v1::AllocationRecord* a = out->add_allocations();
    a->set_address(item.address);
    a->set_requested_bytes(item.live->requested);
    a->set_allocated_bytes(item.live->allocated);
    a->set_kind(item.live->kind);
    a->set_site(item.live->site != nullptr ? item.live->site->id : 0);
    a->set_alloc_time_ns(item.live->time_ns);
    a->set_free_time_ns(item.free_ns);
    a->set_live_at_peak(item.at_peak);
    if (item.live->range_agg >= 0) {
      const RangeAgg& range = ranges_[static_cast<std::size_t>(item.live->range_agg)];
      a->set_nvtx_name(range.name);
      a->set_nvtx_domain(range.domain);
    }
    a->set_thread_id(item.live->thread_id);
  }
  out->set_allocations_omitted(SubtractSaturating(d.counted_allocs, listed.size()));
}

ProcessStatsEngine& StatsEngine::Process(const v1::ProcessKey& key) {
  std::string id = absl::StrCat(key.host(), "/", key.pid(), "/", key.start_time_ns());
  auto it = processes_.find(id);
  if (it == processes_.end()) {
    auto stats = std::make_unique<ProcessStatsEngine>(options_);
    stats->SetProcessKey(key);
    order_.push_back(id);
    it = processes_.emplace(std::move(id), std::move(stats)).first;
  }
  return *it->second;
}

std::vector<v1::Report> StatsEngine::Reports() const {
  std::vector<v1::Report> reports;
  reports.reserve(order_.size());
  for (const std::string& id : order_) reports.push_back(processes_.at(id)->Report());
  return reports;
}

}  // namespace vramscope::collector
