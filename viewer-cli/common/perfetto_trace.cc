#include "common/perfetto_trace.h"

#include <absl/container/flat_hash_map.h>
#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <google/protobuf/arena.h>

#include <algorithm>
#include <functional>
#include <map>
#include <queue>

#include "common/frame_text.h"
#include "perfetto/trace.pb.h"
#include "vramscope/utf8.h"

namespace vramscope::cli {
namespace {

namespace pp = ::perfetto::protos;

constexpr std::uint32_t kSequence = 1;

std::string SizeName(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.2f %s", value, kUnits[unit]);
}

// "cuMemAlloc" style short name of an allocation kind: ALLOCATION_KIND_POOLED -> "pooled".
std::string KindName(v1::AllocationKind kind) {
  std::string name = v1::AllocationKind_Name(kind);
  if (name.rfind("ALLOCATION_KIND_", 0) == 0) name = name.substr(16);
  return absl::AsciiStrToLower(name);
}

// The tracks of one (process, device).
struct DeviceTracks {
  std::uint64_t allocations = 0;                             // parent of the lanes
  std::uint64_t requested = 0, allocated = 0, reserved = 0;  // counter tracks
  std::uint64_t requested_bytes = 0, allocated_bytes = 0, reserved_bytes = 0;
  // The values last written (a counter gets a point only when its value changes).
  std::int64_t written[3] = {-1, -1, -1};
  std::vector<std::uint64_t> lanes;  // lane -> track uuid
  std::priority_queue<std::uint32_t, std::vector<std::uint32_t>, std::greater<>> free_lanes;
};

struct LiveAlloc {
  std::uint32_t device;
  std::uint32_t lane;
  std::uint64_t requested;
  std::uint64_t allocated;
  bool own_memory;  // not served from a pool reservation: counts as reserved too
};

class PerfettoBuilder {
 public:
  explicit PerfettoBuilder(const std::vector<v1::Report>& reports) : reports_(reports) {}
  void AddProcess(const ProcessEvents& process);
  std::string Finish() const { return trace_->SerializeAsString(); }

 private:
  pp::TracePacket* Packet(std::uint64_t time_ns);
  pp::TrackDescriptor* Track(std::uint64_t* uuid, std::uint64_t parent, const std::string& name);
  void StartProcess(const ProcessEvents& process);
  DeviceTracks& Device(std::uint32_t device);
  std::uint64_t Lane(DeviceTracks& tracks, std::uint32_t device, std::uint32_t* lane);
  void Counters(std::uint64_t time_ns, DeviceTracks& tracks);
  void OnAlloc(const v1::Event& event);
  void OnFree(const v1::Event& event);
  void OnReserve(const v1::Event& event, bool release);
  void OnNvtx(const v1::Event& event);
  void OnOom(const v1::Event& event);
  std::uint64_t Callstack(std::uint64_t site, pp::TracePacket* packet);
  std::uint64_t Intern(absl::flat_hash_map<std::string, std::uint64_t>& table,
                       const std::string& text, pp::InternedString* (*add)(pp::InternedData*),
                       pp::TracePacket* packet);
  std::uint64_t FrameIid(const std::string& text, pp::TracePacket* packet);
  void EndProcess(std::uint64_t end_ns);

  const std::vector<v1::Report>& reports_;
  // Every packet on one arena: a trace is hundreds of thousands of small messages, and malloc and
  // free of each were most of the time.
  google::protobuf::Arena arena_;
  pp::Trace* trace_ = google::protobuf::Arena::CreateMessage<pp::Trace>(&arena_);
  std::uint64_t next_uuid_ = 1;
  bool first_packet_ = true;
  // Per trace: the interning tables.
  absl::flat_hash_map<std::string, std::uint64_t> function_names_, source_paths_, mapping_paths_,
      frames_;
  absl::flat_hash_map<std::string, std::uint64_t> mappings_;    // module path -> mapping iid
  absl::flat_hash_map<std::string, std::uint64_t> callstacks_;  // frame iids joined -> iid
  std::uint64_t next_iid_ = 1;
  // Per process.
  std::uint32_t pid_ = 0;
  std::uint64_t process_track_ = 0;
  std::map<std::uint32_t, DeviceTracks> devices_;
  absl::flat_hash_map<std::uint64_t, LiveAlloc> live_;
  absl::flat_hash_map<std::uint64_t, std::vector<std::string>> sites_;
  absl::flat_hash_map<std::uint64_t, std::uint64_t> site_callstacks_;  // site -> callstack iid
  absl::flat_hash_map<std::uint32_t, std::uint64_t> threads_;          // tid -> track
  absl::flat_hash_map<std::uint32_t, std::string> nvtx_names_;         // range id -> name
  absl::flat_hash_map<std::uint32_t, std::uint32_t> open_ranges_;      // range id -> tid
};

pp::TracePacket* PerfettoBuilder::Packet(std::uint64_t time_ns) {
  pp::TracePacket* packet = trace_->add_packet();
  packet->set_trusted_packet_sequence_id(kSequence);
  if (first_packet_) {
    packet->set_sequence_flags(pp::TracePacket::SEQ_INCREMENTAL_STATE_CLEARED);
    first_packet_ = false;
  } else {
    packet->set_sequence_flags(pp::TracePacket::SEQ_NEEDS_INCREMENTAL_STATE);
  }
  if (time_ns != 0) packet->set_timestamp(time_ns);
  return packet;
}

pp::TrackDescriptor* PerfettoBuilder::Track(std::uint64_t* uuid, std::uint64_t parent,
                                            const std::string& name) {
  *uuid = next_uuid_++;
  pp::TrackDescriptor* track = Packet(0)->mutable_track_descriptor();
  track->set_uuid(*uuid);
  if (parent != 0) track->set_parent_uuid(parent);
  if (!name.empty()) track->set_name(ToValidUtf8(name));
  return track;
}

void PerfettoBuilder::StartProcess(const ProcessEvents& process) {
  pid_ = process.key.pid();
  std::vector<std::string> command;
  for (const v1::Report& report : reports_) {
    if (report.process().pid() != pid_) continue;
    command.assign(report.command_line().begin(), report.command_line().end());
  }
  for (const v1::Event& event : process.events) {
    if (command.empty() && event.has_process_start()) {
      command.assign(event.process_start().command_line().begin(),
                     event.process_start().command_line().end());
    }
  }
  std::string name = command.empty() ? "process" : command[0];
  if (const std::size_t slash = name.rfind('/'); slash != std::string::npos) {
    name = name.substr(slash + 1);
  }
  pp::TrackDescriptor* track = Track(&process_track_, 0, "");
  pp::ProcessDescriptor* descriptor = track->mutable_process();
  descriptor->set_pid(static_cast<std::int32_t>(pid_));
  descriptor->set_process_name(ToValidUtf8(name));
  for (const std::string& arg : command) descriptor->add_cmdline(ToValidUtf8(arg));
}

DeviceTracks& PerfettoBuilder::Device(std::uint32_t device) {
  auto [it, inserted] = devices_.try_emplace(device);
  DeviceTracks& tracks = it->second;
  if (!inserted) return tracks;
  const std::string prefix = absl::StrCat("cuda:", device, " ");
  std::pair<std::uint64_t*, const char*> counters[] = {{&tracks.requested, "requested"},
                                                       {&tracks.allocated, "allocated"},
                                                       {&tracks.reserved, "reserved"}};
  for (auto& [uuid, what] : counters) {
    pp::CounterDescriptor* counter = Track(uuid, process_track_, prefix + what)->mutable_counter();
    counter->set_unit(pp::CounterDescriptor::UNIT_SIZE_BYTES);
  }
  Track(&tracks.allocations, process_track_, prefix + "allocations");
  return tracks;
}

std::uint64_t PerfettoBuilder::Lane(DeviceTracks& tracks, std::uint32_t device,
                                    std::uint32_t* lane) {
  if (!tracks.free_lanes.empty()) {
    *lane = tracks.free_lanes.top();
    tracks.free_lanes.pop();
    return tracks.lanes[*lane];
  }
  *lane = static_cast<std::uint32_t>(tracks.lanes.size());
  std::uint64_t uuid = 0;
  Track(&uuid, tracks.allocations, absl::StrCat("cuda:", device, " lane ", *lane));
  tracks.lanes.push_back(uuid);
  return uuid;
}

void PerfettoBuilder::Counters(std::uint64_t time_ns, DeviceTracks& tracks) {
  const std::pair<std::uint64_t, std::uint64_t> values[] = {
      {tracks.requested, tracks.requested_bytes},
      {tracks.allocated, tracks.allocated_bytes},
      {tracks.reserved, tracks.reserved_bytes}};
  for (int i = 0; i < 3; ++i) {
    const auto& [uuid, value] = values[i];
    if (tracks.written[i] == static_cast<std::int64_t>(value)) continue;
    tracks.written[i] = static_cast<std::int64_t>(value);
    pp::TrackEvent* event = Packet(time_ns)->mutable_track_event();
    event->set_type(pp::TrackEvent::TYPE_COUNTER);
    event->set_track_uuid(uuid);
    event->set_counter_value(static_cast<std::int64_t>(value));
  }
}

void Annotate(pp::TrackEvent* event, const char* name, std::uint64_t value, bool pointer = false) {
  pp::DebugAnnotation* a = event->add_debug_annotations();
  a->set_name(name);
  if (pointer) {
    a->set_pointer_value(value);
  } else {
    a->set_uint_value(value);
  }
}

void PerfettoBuilder::OnAlloc(const v1::Event& event) {
  const v1::AllocEvent& a = event.alloc();
  // As the stats engine counts: pinned host memory and IPC imports (another process's memory)
  // are not this process's device memory.
  if (a.kind() == v1::ALLOCATION_KIND_HOST || a.kind() == v1::ALLOCATION_KIND_IPC_IMPORT ||
      live_.contains(a.address())) {
    return;
  }
  DeviceTracks& tracks = Device(event.device());
  std::uint32_t lane = 0;
  const std::uint64_t track = Lane(tracks, event.device(), &lane);
  const bool own = a.kind() != v1::ALLOCATION_KIND_POOLED;
  live_[a.address()] =
      LiveAlloc{event.device(), lane, a.requested_bytes(), a.allocated_bytes(), own};
  tracks.requested_bytes += a.requested_bytes();
  tracks.allocated_bytes += a.allocated_bytes();
  if (own) tracks.reserved_bytes += a.allocated_bytes();
  pp::TracePacket* packet = Packet(event.time_ns());
  pp::TrackEvent* slice = packet->mutable_track_event();
  slice->set_type(pp::TrackEvent::TYPE_SLICE_BEGIN);
  slice->set_track_uuid(track);
  slice->add_categories("alloc");
  slice->set_name(SizeName(a.requested_bytes()));
  Annotate(slice, "requested_bytes", a.requested_bytes());
  Annotate(slice, "allocated_bytes", a.allocated_bytes());
  Annotate(slice, "address", a.address(), /*pointer=*/true);
  Annotate(slice, "stream", a.stream(), /*pointer=*/true);
  pp::DebugAnnotation* kind = slice->add_debug_annotations();
  kind->set_name("kind");
  kind->set_string_value(KindName(a.kind()));
  if (auto it = nvtx_names_.find(a.nvtx_range()); a.nvtx_range() != 0 && it != nvtx_names_.end()) {
    pp::DebugAnnotation* range = slice->add_debug_annotations();
    range->set_name("nvtx_range");
    range->set_string_value(ToValidUtf8(it->second));
  }
  if (a.site() != 0) {
    if (const std::uint64_t iid = Callstack(a.site(), packet); iid != 0) {
      slice->set_callstack_iid(iid);
    }
  }
  Counters(event.time_ns(), tracks);
}

void PerfettoBuilder::OnFree(const v1::Event& event) {
  auto it = live_.find(event.free().address());
  if (it == live_.end()) return;
  const LiveAlloc live = it->second;
  live_.erase(it);
  DeviceTracks& tracks = Device(live.device);
  pp::TrackEvent* end = Packet(event.time_ns())->mutable_track_event();
  end->set_type(pp::TrackEvent::TYPE_SLICE_END);
  end->set_track_uuid(tracks.lanes[live.lane]);
  tracks.free_lanes.push(live.lane);
  tracks.requested_bytes -= std::min(tracks.requested_bytes, live.requested);
  tracks.allocated_bytes -= std::min(tracks.allocated_bytes, live.allocated);
  if (live.own_memory) tracks.reserved_bytes -= std::min(tracks.reserved_bytes, live.allocated);
  Counters(event.time_ns(), tracks);
}

void PerfettoBuilder::OnReserve(const v1::Event& event, bool release) {
  DeviceTracks& tracks = Device(event.device());
  const std::uint64_t bytes = release ? event.pool_release().bytes() : event.pool_reserve().bytes();
  if (release) {
    tracks.reserved_bytes -= std::min(tracks.reserved_bytes, bytes);
  } else {
    tracks.reserved_bytes += bytes;
  }
  Counters(event.time_ns(), tracks);
}

void PerfettoBuilder::OnNvtx(const v1::Event& event) {
  std::uint32_t tid = event.thread_id();
  std::uint32_t range = 0;
  if (event.has_nvtx_push()) {
    range = event.nvtx_push().range_id();
    nvtx_names_[range] = event.nvtx_push().name();
    open_ranges_[range] = tid;
  } else {
    range = event.nvtx_pop().range_id();
    auto open = open_ranges_.find(range);
    if (open == open_ranges_.end()) return;
    tid = open->second;  // ends on the thread that pushed it
    open_ranges_.erase(open);
  }
  auto [it, inserted] = threads_.try_emplace(tid, 0);
  if (inserted) {
    pp::ThreadDescriptor* thread = Track(&it->second, process_track_, "")->mutable_thread();
    thread->set_pid(static_cast<std::int32_t>(pid_));
    thread->set_tid(static_cast<std::int32_t>(tid));
  }
  pp::TrackEvent* slice = Packet(event.time_ns())->mutable_track_event();
  slice->set_track_uuid(it->second);
  if (event.has_nvtx_push()) {
    slice->set_type(pp::TrackEvent::TYPE_SLICE_BEGIN);
    slice->add_categories("nvtx");
    slice->set_name(ToValidUtf8(event.nvtx_push().name()));
  } else {
    slice->set_type(pp::TrackEvent::TYPE_SLICE_END);
  }
}

void PerfettoBuilder::OnOom(const v1::Event& event) {
  DeviceTracks& tracks = Device(event.device());
  pp::TrackEvent* instant = Packet(event.time_ns())->mutable_track_event();
  instant->set_type(pp::TrackEvent::TYPE_INSTANT);
  instant->set_track_uuid(tracks.allocations);
  instant->add_categories("oom");
  instant->set_name(absl::StrCat("OOM cuda:", event.device()));
  Annotate(instant, "requested_bytes", event.oom().requested_bytes());
  Annotate(instant, "free_bytes", event.oom().free_bytes());
  Annotate(instant, "largest_free_block_bytes", event.oom().largest_free_block_bytes());
}

std::uint64_t PerfettoBuilder::Intern(absl::flat_hash_map<std::string, std::uint64_t>& table,
                                      const std::string& text,
                                      pp::InternedString* (*add)(pp::InternedData*),
                                      pp::TracePacket* packet) {
  auto [it, inserted] = table.try_emplace(text, 0);
  if (!inserted) return it->second;
  it->second = next_iid_++;
  pp::InternedString* entry = add(packet->mutable_interned_data());
  entry->set_iid(it->second);
  entry->set_str(ToValidUtf8(text));
  return it->second;
}

std::uint64_t PerfettoBuilder::FrameIid(const std::string& text, pp::TracePacket* packet) {
  if (auto it = frames_.find(text); it != frames_.end()) return it->second;
  const FrameText parsed = ParseFrameText(text);
  // Every frame gets a mapping (older trace processors drop frames without one): the module
  // for an address, the source file for a symbolized frame.
  std::uint64_t& mapping = mappings_[parsed.file];
  if (mapping == 0) {
    const std::uint64_t path = Intern(
        mapping_paths_, parsed.file, [](pp::InternedData* d) { return d->add_mapping_paths(); },
        packet);
    mapping = next_iid_++;
    pp::Mapping* m = packet->mutable_interned_data()->add_mappings();
    m->set_iid(mapping);
    m->add_path_string_ids(path);
  }
  pp::Frame* frame = packet->mutable_interned_data()->add_frames();
  frame->set_iid(next_iid_++);
  frame->set_function_name_id(Intern(
      function_names_, parsed.function, [](pp::InternedData* d) { return d->add_function_names(); },
      packet));
  frame->set_mapping_id(mapping);
  frame->set_rel_pc(parsed.offset);
  if (parsed.symbolized) {
    frame->set_source_path_iid(Intern(
        source_paths_, parsed.file, [](pp::InternedData* d) { return d->add_source_paths(); },
        packet));
    frame->set_line_number(static_cast<std::uint32_t>(parsed.line));
  }
  frames_[text] = frame->iid();
  return frame->iid();
}

std::uint64_t PerfettoBuilder::Callstack(std::uint64_t site, pp::TracePacket* packet) {
  if (auto it = site_callstacks_.find(site); it != site_callstacks_.end()) return it->second;
  auto frames = sites_.find(site);
  if (frames == sites_.end() || frames->second.empty()) return 0;
  // Sites list frames innermost first; a Perfetto callstack starts at the bottom.
  std::vector<std::uint64_t> ids;
  for (auto f = frames->second.rbegin(); f != frames->second.rend(); ++f) {
    ids.push_back(FrameIid(*f, packet));
  }
  const std::string key = absl::StrJoin(ids, ",");
  std::uint64_t& iid = callstacks_[key];
  if (iid == 0) {
    iid = next_iid_++;
    pp::Callstack* callstack = packet->mutable_interned_data()->add_callstacks();
    callstack->set_iid(iid);
    for (std::uint64_t id : ids) callstack->add_frame_ids(id);
  }
  site_callstacks_[site] = iid;
  return iid;
}

void PerfettoBuilder::EndProcess(std::uint64_t end_ns) {
  // Allocations never freed end with the process's last event.
  for (const auto& [address, live] : live_) {
    pp::TrackEvent* end = Packet(end_ns)->mutable_track_event();
    end->set_type(pp::TrackEvent::TYPE_SLICE_END);
    end->set_track_uuid(devices_[live.device].lanes[live.lane]);
  }
  for (const auto& [range, tid] : open_ranges_) {
    pp::TrackEvent* end = Packet(end_ns)->mutable_track_event();
    end->set_type(pp::TrackEvent::TYPE_SLICE_END);
    end->set_track_uuid(threads_[tid]);
  }
  devices_.clear();
  live_.clear();
  sites_.clear();
  site_callstacks_.clear();
  threads_.clear();
  nvtx_names_.clear();
  open_ranges_.clear();
}

void PerfettoBuilder::AddProcess(const ProcessEvents& process) {
  StartProcess(process);
  std::uint64_t last_ns = 0;
  for (const v1::Event& event : process.events) {
    last_ns = std::max(last_ns, event.time_ns());
    switch (event.payload_case()) {
      case v1::Event::kAlloc:
        OnAlloc(event);
        break;
      case v1::Event::kFree:
        OnFree(event);
        break;
      case v1::Event::kPoolReserve:
        OnReserve(event, /*release=*/false);
        break;
      case v1::Event::kPoolRelease:
        OnReserve(event, /*release=*/true);
        break;
      case v1::Event::kNvtxPush:
      case v1::Event::kNvtxPop:
        OnNvtx(event);
        break;
      case v1::Event::kOom:
        OnOom(event);
        break;
      case v1::Event::kSiteDefinition:
        sites_[event.site_definition().site()].assign(event.site_definition().frames().begin(),
                                                      event.site_definition().frames().end());
        break;
      default:
        break;
    }
  }
  EndProcess(last_ns);
}

}  // namespace

std::string PerfettoTrace(const RecordedEvents& events, const std::vector<v1::Report>& reports) {
  PerfettoBuilder builder(reports);
  for (const ProcessEvents& process : events.processes()) builder.AddProcess(process);
  return builder.Finish();
}

}  // namespace vramscope::cli
