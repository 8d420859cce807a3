#include "export/torch_snapshot.h"

#include <absl/container/flat_hash_map.h>

#include <algorithm>
#include <map>
#include <vector>

#include "common/frame_text.h"
#include "vramscope/pickle/pickle_writer.h"

namespace vramscope::cli {
namespace {

struct Frame {
  std::string filename;
  std::int64_t line = 0;
  std::string name;
};

Frame ParseFrame(const std::string& text) {
  const FrameText parsed = ParseFrameText(text);
  return Frame{parsed.file, parsed.line, parsed.function};
}

struct Entry {
  const char* action;
  std::uint64_t addr;
  std::uint64_t size;
  std::uint64_t stream;
  std::uint64_t time_us;
  std::uint64_t site = 0;         // frames from this site
  std::uint32_t nvtx = 0;         // and this NVTX range
  std::int64_t device_free = -1;  // oom only
};

struct Live {
  std::uint32_t device;
  std::uint64_t size;       // the block: allocated bytes
  std::uint64_t requested;  // what the application asked for
  std::uint64_t stream;
  std::uint64_t site;
  std::uint32_t nvtx;
  bool own_segment;  // not inside a pool reservation: its memory is its own segment
};

struct Segment {
  std::uint32_t device;
  std::uint64_t size;
  bool own = false;  // an allocation's own memory, not pool reservations
};

class SnapshotBuilder {
 public:
  void Add(const v1::Event& event);
  std::string Pickle(TorchSnapshotStats* stats) const;

 private:
  void OnAlloc(const v1::Event& event);
  void OnFree(const v1::Event& event);
  bool InReservation(std::uint32_t device, std::uint64_t addr, std::uint64_t size) const;
  void Unreserve(std::uint32_t device, std::uint64_t addr, std::uint64_t size);
  void Push(std::uint32_t device, Entry entry) { traces_[device].push_back(entry); }
  void WriteFrames(pickle::PickleWriter& w, std::uint64_t site, std::uint32_t nvtx) const;
  void WriteEntry(pickle::PickleWriter& w, const Entry& e) const;
  void WriteSegments(pickle::PickleWriter& w, TorchSnapshotStats* stats) const;
  void WriteSegment(pickle::PickleWriter& w, std::uint64_t addr, const Segment& segment) const;

  std::map<std::uint32_t, std::vector<Entry>> traces_;
  absl::flat_hash_map<std::uint64_t, std::vector<Frame>> sites_;
  absl::flat_hash_map<std::uint32_t, std::string> nvtx_names_;  // range id -> name
  std::map<std::uint64_t, Segment> reservations_;               // live pool reservations by address
  std::map<std::uint64_t, Live> live_;                          // live allocations by address
  std::uint64_t allocs_ = 0;
  std::uint64_t frees_ = 0;
};

void SnapshotBuilder::Add(const v1::Event& event) {
  const std::uint64_t us = event.time_ns() / 1000;
  switch (event.payload_case()) {
    case v1::Event::kAlloc:
      OnAlloc(event);
      break;
    case v1::Event::kFree:
      OnFree(event);
      break;
    // Pool memory is mapped and unmapped piece by piece (a release may cover part of a
    // reservation, or several): memory_viz's segment_map / segment_unmap, which join adjacent
    // mapped memory of one stream and split it again, as for PyTorch's expandable segments.
    case v1::Event::kPoolReserve: {
      const auto& r = event.pool_reserve();
      Unreserve(event.device(), r.address(), r.bytes());  // a lost release: never twice
      reservations_[r.address()] = Segment{event.device(), r.bytes()};
      Push(event.device(), Entry{"segment_map", r.address(), r.bytes(), 0, us});
      break;
    }
    case v1::Event::kPoolRelease: {
      const auto& r = event.pool_release();
      Unreserve(event.device(), r.address(), r.bytes());
      Push(event.device(), Entry{"segment_unmap", r.address(), r.bytes(), 0, us});
      break;
    }
    case v1::Event::kNvtxPush:
      nvtx_names_[event.nvtx_push().range_id()] = event.nvtx_push().name();
      break;
    case v1::Event::kSiteDefinition: {
      std::vector<Frame>& frames = sites_[event.site_definition().site()];
      frames.clear();
      for (const std::string& f : event.site_definition().frames()) frames.push_back(ParseFrame(f));
      break;
    }
    case v1::Event::kOom: {
      Entry e{"oom", 0, event.oom().requested_bytes(), 0, us};
      e.device_free = static_cast<std::int64_t>(event.oom().free_bytes());
      Push(event.device(), e);
      break;
    }
    default:
      break;
  }
}

bool SnapshotBuilder::InReservation(std::uint32_t device, std::uint64_t addr,
                                    std::uint64_t size) const {
  // The pool maps memory in granules (VMM) and one block may span several adjacent mappings:
  // walk the run of contiguous reservations from the one holding `addr`.
  auto it = reservations_.upper_bound(addr);
  if (it == reservations_.begin()) return false;
  --it;
  if (addr - it->first >= it->second.size) return false;
  const std::uint64_t end = addr + size;
  std::uint64_t covered = it->first;
  for (; it != reservations_.end() && it->first == covered && it->second.device == device; ++it) {
    covered = it->first + it->second.size;
    if (covered >= end) return true;
  }
  return false;
}

// Takes [addr, addr + size) out of the device's reservations: those inside go, those that
// straddle an edge keep the part outside.
void SnapshotBuilder::Unreserve(std::uint32_t device, std::uint64_t addr, std::uint64_t size) {
  const std::uint64_t end = addr + size;
  auto it = reservations_.upper_bound(addr);
  if (it != reservations_.begin()) --it;
  while (it != reservations_.end() && it->first < end) {
    const std::uint64_t start = it->first;
    const Segment segment = it->second;
    const std::uint64_t stop = start + segment.size;
    if (stop <= addr || segment.device != device) {
      ++it;
      continue;
    }
    it = reservations_.erase(it);
    if (start < addr) reservations_[start] = Segment{device, addr - start};
    if (stop > end) it = reservations_.emplace(end, Segment{device, stop - end}).first;
  }
}

void SnapshotBuilder::OnAlloc(const v1::Event& event) {
  const v1::AllocEvent& a = event.alloc();
  // Pinned host memory and IPC imports (another process's memory) are not this process's device
  // memory (the stats engine's rule).
  if (a.kind() == v1::ALLOCATION_KIND_HOST || a.kind() == v1::ALLOCATION_KIND_IPC_IMPORT) return;
  const std::uint64_t size = a.allocated_bytes() > 0 ? a.allocated_bytes() : a.requested_bytes();
  if (size == 0 || live_.count(a.address()) > 0) return;  // nothing to show, or a lost free
  const std::uint64_t us = event.time_ns() / 1000;
  const bool own =
      a.kind() != v1::ALLOCATION_KIND_POOLED || !InReservation(event.device(), a.address(), size);
  live_[a.address()] =
      Live{event.device(), size, a.requested_bytes(), a.stream(), a.site(), a.nvtx_range(), own};
  if (own) Push(event.device(), Entry{"segment_alloc", a.address(), size, a.stream(), us});
  Entry e{"alloc", a.address(), size, a.stream(), us, a.site(), a.nvtx_range()};
  Push(event.device(), e);
  ++allocs_;
}

void SnapshotBuilder::OnFree(const v1::Event& event) {
  auto it = live_.find(event.free().address());
  if (it == live_.end()) return;
  const Live& live = it->second;
  const std::uint64_t us = event.time_ns() / 1000;
  Push(live.device, Entry{"free_requested", it->first, live.size, live.stream, us});
  Push(live.device, Entry{"free_completed", it->first, live.size, live.stream, us});
  if (live.own_segment) {
    Push(live.device, Entry{"segment_free", it->first, live.size, live.stream, us});
  }
  live_.erase(it);
  ++frees_;
}

void SnapshotBuilder::WriteFrames(pickle::PickleWriter& w, std::uint64_t site,
                                  std::uint32_t nvtx) const {
  w.BeginList();
  auto write = [&w](const std::string& filename, std::int64_t line, const std::string& name) {
    w.BeginDict();
    w.String("filename");
    w.String(filename);
    w.String("line");
    w.Int(line);
    w.String("name");
    w.String(name);
    w.EndDict();
  };
  if (auto it = sites_.find(site); site != 0 && it != sites_.end()) {
    for (const Frame& f : it->second) write(f.filename, f.line, f.name);
  }
  if (auto it = nvtx_names_.find(nvtx); nvtx != 0 && it != nvtx_names_.end()) {
    write("<nvtx>", 0, it->second);
  }
  w.EndList();
}

void SnapshotBuilder::WriteEntry(pickle::PickleWriter& w, const Entry& e) const {
  w.BeginDict();
  w.String("action");
  w.String(e.action);
  w.String("addr");
  w.UInt(e.addr);
  w.String("size");
  w.UInt(e.size);
  w.String("stream");
  w.UInt(e.stream);
  w.String("time_us");
  w.UInt(e.time_us);
  if (e.device_free >= 0) {
    w.String("device_free");
    w.Int(e.device_free);
  }
  w.String("frames");
  WriteFrames(w, e.site, e.nvtx);
  w.EndDict();
}

struct Block {
  std::uint64_t addr;
  std::uint64_t size;
  std::uint64_t requested;
  bool active;
  std::uint64_t site;
  std::uint32_t nvtx;
};

void SnapshotBuilder::WriteSegment(pickle::PickleWriter& w, std::uint64_t addr,
                                   const Segment& segment) const {
  // The segment's blocks: its live allocations by address, the gaps between them inactive.
  std::vector<Block> blocks;
  std::uint64_t at = addr, allocated = 0, requested = 0, stream = 0;
  const std::uint64_t end = addr + segment.size;
  for (auto it = live_.lower_bound(addr); it != live_.end() && it->first < end; ++it) {
    const Live& live = it->second;
    if (live.device != segment.device || (live.own_segment && it->first != addr)) continue;
    if (it->first > at) blocks.push_back(Block{at, it->first - at, 0, false, 0, 0});
    blocks.push_back(Block{it->first, live.size, live.requested, true, live.site, live.nvtx});
    at = it->first + live.size;
    allocated += live.size;
    requested += live.requested;
    if (segment.own) stream = live.stream;  // pool memory: stream 0, as its segment_map
    if (live.own_segment) break;
  }
  if (at < end) blocks.push_back(Block{at, end - at, 0, false, 0, 0});
  w.BeginDict();
  const std::pair<const char*, std::uint64_t> numbers[] = {{"device", segment.device},
                                                           {"address", addr},
                                                           {"total_size", segment.size},
                                                           {"allocated_size", allocated},
                                                           {"active_size", allocated},
                                                           {"requested_size", requested},
                                                           {"stream", stream}};
  for (const auto& [key, value] : numbers) {
    w.String(key);
    w.UInt(value);
  }
  w.String("segment_type");
  w.String(segment.size > (std::uint64_t{1} << 20) ? "large" : "small");
  w.String("segment_pool_id");
  w.BeginTuple();
  w.Int(0);
  w.Int(0);
  w.EndTuple();
  w.String("is_expandable");
  w.Bool(!segment.own);
  w.String("frames");
  w.BeginList();
  w.EndList();
  w.String("blocks");
  w.BeginList();
  for (const Block& b : blocks) {
    w.BeginDict();
    w.String("address");
    w.UInt(b.addr);
    w.String("size");
    w.UInt(b.size);
    w.String("requested_size");
    w.UInt(b.requested);
    w.String("state");
    w.String(b.active ? "active_allocated" : "inactive");
    w.String("frames");
    WriteFrames(w, b.site, b.nvtx);
    w.EndDict();
  }
  w.EndList();
  w.EndDict();
}

void SnapshotBuilder::WriteSegments(pickle::PickleWriter& w, TorchSnapshotStats* stats) const {
  // Live reservations, adjacent ones of a device joined into one segment (blocks may span
  // them), and the allocations that are their own segments, by address.
  std::map<std::uint64_t, Segment> segments;
  for (const auto& [addr, reservation] : reservations_) {
    if (!segments.empty()) {
      auto& [last_addr, last] = *segments.rbegin();
      if (last.device == reservation.device && last_addr + last.size == addr) {
        last.size += reservation.size;
        continue;
      }
    }
    segments[addr] = reservation;
  }
  for (const auto& [addr, live] : live_) {
    if (live.own_segment) segments[addr] = Segment{live.device, live.size, /*own=*/true};
  }
  w.BeginList();
  for (const auto& [addr, segment] : segments) WriteSegment(w, addr, segment);
  w.EndList();
  if (stats != nullptr) stats->segments_at_end = segments.size();
}

std::string SnapshotBuilder::Pickle(TorchSnapshotStats* stats) const {
  pickle::PickleWriter w;
  w.BeginDict();
  w.String("segments");
  WriteSegments(w, stats);
  // One trace per device ordinal, from 0 to the highest seen (memory_viz indexes them so).
  const std::uint32_t devices = traces_.empty() ? 1 : traces_.rbegin()->first + 1;
  w.String("device_traces");
  w.BeginList();
  for (std::uint32_t d = 0; d < devices; ++d) {
    w.BeginList();
    if (auto it = traces_.find(d); it != traces_.end()) {
      for (const Entry& e : it->second) WriteEntry(w, e);
    }
    w.EndList();
  }
  w.EndList();
  w.EndDict();
  if (stats != nullptr) {
    stats->allocs = allocs_;
    stats->frees = frees_;
    stats->devices = devices;
  }
  return w.Finish();
}

}  // namespace

std::string TorchSnapshot(const ProcessEvents& process, TorchSnapshotStats* stats) {
  SnapshotBuilder builder;
  for (const v1::Event& event : process.events) builder.Add(event);
  return builder.Pickle(stats);
}

}  // namespace vramscope::cli
