// viewer-cli/export over crafted events of two devices (pool reservations, pooled and
// passthrough allocations, a pinned host allocation, symbolized and raw stacks, an NVTX range,
// an OOM, blocks live at the end):
//   - the PyTorch snapshot passes check_snapshot.py (Python's pickle: keys, actions, sizes,
//     addresses, frees after allocs, segments covering allocations) with the expected counts and
//     frames, and replays (LoadSnapshotBytes) with the same allocs and peak live as the events;
//   - the Perfetto trace parses with proto/perfetto/trace.proto: slices balance on lanes that
//     never overlap, counters end at the live bytes, callstacks resolve to interned frames,
//     NVTX ranges are thread slices;
//   - the event log reads back as written.
#include <absl/strings/str_cat.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <set>
#include <string>

#include "common/perfetto_trace.h"
#include "common/recorded_events.h"
#include "export/torch_snapshot.h"
#include "perfetto/trace.pb.h"
#include "replay/snapshot_loader.h"
#include "vramscope/pickle/pickle_writer.h"

namespace vramscope::cli {
namespace {

namespace pp = ::perfetto::protos;
using namespace std::string_literals;

constexpr std::uint64_t kPool0 = 0x7f0000000000, kPool1 = 0x7f1000000000;
constexpr std::uint64_t kMiB = 1 << 20;

v1::Event At(std::uint64_t ms, std::uint32_t device, std::uint32_t tid = 7) {
  v1::Event e;
  e.set_time_ns(ms * 1000000);
  e.set_device(device);
  e.set_thread_id(tid);
  return e;
}

void Alloc(ProcessEvents& p, std::uint64_t ms, std::uint32_t device, std::uint64_t addr,
           std::uint64_t bytes, v1::AllocationKind kind, std::uint64_t site, std::uint32_t nvtx) {
  v1::Event e = At(ms, device);
  v1::AllocEvent* a = e.mutable_alloc();
  a->set_address(addr);
  a->set_requested_bytes(bytes - 100);
  a->set_allocated_bytes(bytes);
  a->set_kind(kind);
  a->set_site(site);
  a->set_nvtx_range(nvtx);
  p.events.push_back(e);
}

void Free(ProcessEvents& p, std::uint64_t ms, std::uint32_t device, std::uint64_t addr) {
  v1::Event e = At(ms, device);
  e.mutable_free()->set_address(addr);
  p.events.push_back(e);
}

void Reserve(ProcessEvents& p, std::uint64_t ms, std::uint32_t device, std::uint64_t addr,
             std::uint64_t bytes, bool release) {
  v1::Event e = At(ms, device);
  auto* r = release ? e.mutable_pool_release() : nullptr;
  if (r != nullptr) {
    r->set_address(addr);
    r->set_bytes(bytes);
  } else {
    e.mutable_pool_reserve()->set_address(addr);
    e.mutable_pool_reserve()->set_bytes(bytes);
  }
  p.events.push_back(e);
}

// Device 0: a 64 MiB pool reservation, 6 pooled allocations of 4 MiB (site 1, symbolized, inside
// NVTX range "fwd"), 4 freed, 16 MiB in the middle of the reservation released; a 2 MiB passthrough
// allocation (site 2, raw frames) freed; a host allocation and an IPC import (both left out).
// Device 1: a reservation released after its only allocation's free, then a second reservation with
// one live allocation. An OOM on device 1. Then device 0 again: a block spanning two adjacent
// reservations.
ProcessEvents Crafted() {
  ProcessEvents p;
  p.key.set_host("h");
  p.key.set_pid(4242);
  p.key.set_start_time_ns(1);
  v1::Event start = At(1, 0);
  start.mutable_process_start()->add_command_line("/usr/bin/train");
  p.events.push_back(start);
  v1::Event site1 = At(1, 0);
  site1.mutable_site_definition()->set_site(1);
  site1.mutable_site_definition()->add_frames("cudaMalloc (cuda_runtime.cc:10)");
  site1.mutable_site_definition()->add_frames("Model::forward() (model.cc:42)");
  site1.mutable_site_definition()->add_frames("main (main.cc:7)");
  p.events.push_back(site1);
  v1::Event site2 = At(1, 0);
  site2.mutable_site_definition()->set_site(2);
  site2.mutable_site_definition()->add_frames("/usr/lib/libfoo.so+0x1234");
  p.events.push_back(site2);
  v1::Event push = At(2, 0);
  push.mutable_nvtx_push()->set_range_id(9);
  push.mutable_nvtx_push()->set_name("fwd");
  p.events.push_back(push);
  Reserve(p, 3, 0, kPool0, 64 * kMiB, false);
  for (int i = 0; i < 6; ++i) {
    Alloc(p, 4 + i, 0, kPool0 + i * 4 * kMiB, 4 * kMiB, v1::ALLOCATION_KIND_POOLED, 1, 9);
  }
  Alloc(p, 10, 0, 0x7e0000000000, 2 * kMiB, v1::ALLOCATION_KIND_DRIVER, 2, 0);
  Alloc(p, 10, 0, 0x600000, kMiB, v1::ALLOCATION_KIND_HOST, 0, 0);
  Alloc(p, 10, 0, 0x7d0000000000, kMiB, v1::ALLOCATION_KIND_IPC_IMPORT, 0, 0);
  for (int i = 0; i < 4; ++i) Free(p, 11 + i, 0, kPool0 + i * 4 * kMiB);
  // The vmm pool gives 16 MiB in the middle of its 64 MiB mapping back (one piece of it).
  Reserve(p, 15, 0, kPool0 + 32 * kMiB, 16 * kMiB, true);
  Free(p, 15, 0, 0x7e0000000000);
  v1::Event pop = At(16, 0);
  pop.mutable_nvtx_pop()->set_range_id(9);
  p.events.push_back(pop);
  Reserve(p, 17, 1, kPool1, 8 * kMiB, false);
  Alloc(p, 18, 1, kPool1, kMiB, v1::ALLOCATION_KIND_POOLED, 0, 0);
  Free(p, 19, 1, kPool1);
  Reserve(p, 20, 1, kPool1, 8 * kMiB, true);
  Reserve(p, 21, 1, kPool1 + 16 * kMiB, 8 * kMiB, false);
  Alloc(p, 22, 1, kPool1 + 16 * kMiB, 3 * kMiB, v1::ALLOCATION_KIND_POOLED, 0, 0);
  v1::Event oom = At(23, 1);
  oom.mutable_oom()->set_requested_bytes(100 * kMiB);
  p.events.push_back(oom);
  // Device 0 again: two adjacent 2 MiB mappings (a VMM pool's granules) and one live 3 MiB block
  // spanning both: one segment at the end.
  Reserve(p, 24, 0, kPool0 + 128 * kMiB, 2 * kMiB, false);
  Reserve(p, 24, 0, kPool0 + 130 * kMiB, 2 * kMiB, false);
  Alloc(p, 25, 0, kPool0 + 128 * kMiB, 3 * kMiB, v1::ALLOCATION_KIND_POOLED, 0, 0);
  return p;
}

std::string TempPath(const char* suffix) {
  std::string path = std::string("/tmp/vramscope-export-test.XXXXXX") + suffix;
  const int fd = mkstemps(path.data(), static_cast<int>(std::string(suffix).size()));
  EXPECT_GE(fd, 0);
  close(fd);
  return path;
}

// Runs tests/export/check_snapshot.py (meson sets VRAMSCOPE_CHECK_SNAPSHOT) on `pickle`.
void CheckWithPython(const std::string& pickle, const std::string& expectations) {
  const char* script = getenv("VRAMSCOPE_CHECK_SNAPSHOT");
  ASSERT_NE(script, nullptr) << "VRAMSCOPE_CHECK_SNAPSHOT is not set (meson sets it)";
  const std::string path = TempPath(".pickle");
  std::ofstream(path, std::ios::binary) << pickle;
  const std::string command =
      std::string("python3 ") + script + " " + path + " " + expectations + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buffer[4096];
  for (std::size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
  const int status = pclose(pipe);
  unlink(path.c_str());
  EXPECT_EQ(status, 0) << out;
}

TEST(TorchSnapshotTest, PythonReadsAConsistentSnapshot) {
  TorchSnapshotStats stats;
  const std::string pickle = TorchSnapshot(Crafted(), &stats);
  EXPECT_EQ(stats.allocs, 10u);  // the host allocation and the IPC import are left out
  EXPECT_EQ(stats.frees, 6u);
  EXPECT_EQ(stats.devices, 2u);
  // The 64 MiB pool less its middle 16 MiB (two segments), the two adjacent mappings as one,
  // and device 1's second reservation.
  EXPECT_EQ(stats.segments_at_end, 4u);
  CheckWithPython(pickle,
                  "--allocs 10 --live 4 --devices 2 --frame 'Model::forward()' --frame fwd "
                  "--frame /usr/lib/libfoo.so+0x1234");
}

TEST(TorchSnapshotTest, ReplaysWithTheEventsAllocations) {
  const std::string pickle = TorchSnapshot(Crafted());
  SnapshotLoadInfo info;
  absl::StatusOr<LoadedTrace> trace = LoadSnapshotBytes("crafted", pickle, std::nullopt, &info);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(info.device, 0u);
  EXPECT_EQ(info.devices, 2u);
  EXPECT_EQ(trace->alloc_events, 8u);
  EXPECT_EQ(trace->free_events, 5u);
  EXPECT_EQ(trace->peak_live_bytes, 26 * kMiB);  // six 4 MiB blocks and the 2 MiB one
  EXPECT_EQ(trace->live_at_end_count, 3u);
  absl::StatusOr<LoadedTrace> one = LoadSnapshotBytes("crafted", pickle, 1, nullptr);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->alloc_events, 2u);
  EXPECT_FALSE(LoadSnapshotBytes("crafted", pickle, 2, nullptr).ok());
}

// What a reader of the Perfetto trace sees, gathered in one pass.
struct ParsedTrace {
  std::map<std::uint64_t, pp::TrackDescriptor> tracks;
  std::map<std::uint64_t, std::int64_t> last_counter;  // counter track -> last value
  std::map<std::uint64_t, int> open;                   // track -> slices open now
  int slices = 0, ends = 0, with_callstack = 0, instants = 0;
  std::set<std::string> names;
  std::map<std::uint64_t, std::string> functions;                  // iid -> name
  std::map<std::uint64_t, std::uint64_t> frame_function;           // frame iid -> function iid
  std::map<std::uint64_t, std::vector<std::uint64_t>> callstacks;  // iid -> frame iids
  std::vector<std::uint64_t> used_callstacks;
};

ParsedTrace Parse(const std::string& bytes) {
  pp::Trace trace;
  EXPECT_TRUE(trace.ParseFromString(bytes));
  ParsedTrace out;
  for (const pp::TracePacket& packet : trace.packet()) {
    EXPECT_EQ(packet.trusted_packet_sequence_id(), 1u);
    const pp::InternedData& interned = packet.interned_data();
    for (const auto& f : interned.function_names()) out.functions[f.iid()] = f.str();
    for (const auto& f : interned.frames()) out.frame_function[f.iid()] = f.function_name_id();
    for (const auto& c : interned.callstacks()) {
      out.callstacks[c.iid()].assign(c.frame_ids().begin(), c.frame_ids().end());
    }
    if (packet.has_track_descriptor()) {
      EXPECT_FALSE(out.tracks.contains(packet.track_descriptor().uuid()));
      out.tracks[packet.track_descriptor().uuid()] = packet.track_descriptor();
    }
    if (!packet.has_track_event()) continue;
    const pp::TrackEvent& e = packet.track_event();
    EXPECT_TRUE(out.tracks.contains(e.track_uuid())) << "an event before its track";
    switch (e.type()) {
      case pp::TrackEvent::TYPE_COUNTER:
        out.last_counter[e.track_uuid()] = e.counter_value();
        break;
      case pp::TrackEvent::TYPE_SLICE_BEGIN:
        ++out.slices;
        out.names.insert(e.name());
        if (e.has_callstack_iid()) out.used_callstacks.push_back(e.callstack_iid());
        // Allocation lanes never hold two slices at once.
        if (out.tracks[e.track_uuid()].name().find(" lane ") != std::string::npos) {
          EXPECT_EQ(out.open[e.track_uuid()], 0) << "overlapping slices on a lane";
        }
        ++out.open[e.track_uuid()];
        break;
      case pp::TrackEvent::TYPE_SLICE_END:
        ++out.ends;
        EXPECT_GT(out.open[e.track_uuid()]--, 0) << "an end without a begin";
        break;
      case pp::TrackEvent::TYPE_INSTANT:
        ++out.instants;
        break;
      default:
        ADD_FAILURE() << "event without a type";
    }
  }
  return out;
}

std::int64_t Counter(const ParsedTrace& t, const std::string& name) {
  for (const auto& [uuid, track] : t.tracks) {
    if (track.name() != name) continue;
    EXPECT_EQ(track.counter().unit(), pp::CounterDescriptor::UNIT_SIZE_BYTES);
    return t.last_counter.contains(uuid) ? t.last_counter.at(uuid) : -1;
  }
  ADD_FAILURE() << "no counter track " << name;
  return -1;
}

TEST(PerfettoTraceTest, ParsesBackWithSlicesCountersCallstacksAndRanges) {
  RecordedEvents events;
  ProcessEvents crafted = Crafted();
  for (const v1::Event& e : crafted.events) events.Add(crafted.key, e);
  const ParsedTrace t = Parse(PerfettoTrace(events, {}));
  // 10 device allocations and one NVTX range; every slice ends (live ones at the last event).
  EXPECT_EQ(t.slices, 11);
  EXPECT_EQ(t.ends, 11);
  EXPECT_EQ(t.instants, 1);  // the OOM
  EXPECT_TRUE(t.names.contains("fwd"));
  // Device 0: two 4 MiB blocks and the 3 MiB one live (requested 100 B less each); reserved =
  // the pool less the 16 MiB it gave back, and the two mappings.
  EXPECT_EQ(Counter(t, "cuda:0 allocated"), 11 * kMiB);
  EXPECT_EQ(Counter(t, "cuda:0 requested"), 11 * kMiB - 300);
  EXPECT_EQ(Counter(t, "cuda:0 reserved"), 52 * kMiB);
  EXPECT_EQ(Counter(t, "cuda:1 allocated"), 3 * kMiB);
  EXPECT_EQ(Counter(t, "cuda:1 reserved"), 8 * kMiB);
  // Six blocks from site 1 at once: six lanes on device 0, plus one for the passthrough block.
  int lanes = 0;
  bool process = false;
  for (const auto& [uuid, track] : t.tracks) {
    lanes += track.name().rfind("cuda:0 lane ", 0) == 0;
    process |= track.has_process() && track.process().pid() == 4242 &&
               track.process().process_name() == "train";
  }
  EXPECT_EQ(lanes, 7);
  EXPECT_TRUE(process);
  // Site 1's stack, outermost first, on the six pooled allocations; site 2's on the other.
  ASSERT_EQ(t.used_callstacks.size(), 7u);
  const std::vector<std::uint64_t>& frames = t.callstacks.at(t.used_callstacks[0]);
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(t.functions.at(t.frame_function.at(frames[0])), "main");
  EXPECT_EQ(t.functions.at(t.frame_function.at(frames[1])), "Model::forward()");
  EXPECT_EQ(t.functions.at(t.frame_function.at(frames[2])), "cudaMalloc");
  EXPECT_EQ(t.used_callstacks[5], t.used_callstacks[0]);  // interned once
  EXPECT_NE(t.used_callstacks[6], t.used_callstacks[0]);
}

// Crafted shapes that would make the loader slow are refused at once: an entry dict of many keys
// (shared by every entry through the memo), and device traces sharing one list.
TEST(TorchSnapshotTest, CraftedShapesAreRefusedQuickly) {
  pickle::PickleWriter big;
  big.BeginDict();
  big.String("device_traces");
  big.BeginList();
  big.BeginList();
  big.BeginDict();
  for (int i = 0; i < 100; ++i) {
    big.String(absl::StrCat("k", i));
    big.Int(i);
  }
  big.EndDict();
  big.EndList();
  big.EndList();
  big.EndDict();
  absl::StatusOr<LoadedTrace> a = LoadSnapshotBytes("big", big.Finish(), 0);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("at most 64 keys"), std::string::npos) << a.status();
  // {'device_traces': [L] * 7} with L = [{}, {}] one list (memo index 1, BINGET): 14 looks at 6
  // values.
  const std::string shared =
      "\x80\x02}(X\x0d\x00\x00\x00"
      "device_traces](]q\x01(}}e"
      "h\x01h\x01h\x01h\x01h\x01h\x01"
      "eu."s;
  absl::StatusOr<LoadedTrace> b = LoadSnapshotBytes("shared", shared, std::nullopt);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("share"), std::string::npos) << b.status();
}

TEST(EventLogTest, ReadsBackWhatItWrote) {
  RecordedEvents events;
  ProcessEvents crafted = Crafted();
  for (const v1::Event& e : crafted.events) events.Add(crafted.key, e);
  v1::ProcessKey other;
  other.set_pid(7);
  for (int i = 0; i < 5000; ++i) events.Add(other, At(i, 0));  // empty payload: not kept
  events.Add(other, crafted.events[5]);
  const std::string path = TempPath(".vslog");
  ASSERT_TRUE(WriteEventLog(path, events).ok());
  absl::StatusOr<RecordedEvents> back = ReadEventLog(path);
  unlink(path.c_str());
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->processes().size(), 2u);
  EXPECT_EQ(back->processes()[0].key.pid(), 4242u);
  ASSERT_EQ(back->processes()[0].events.size(), crafted.events.size());
  for (std::size_t i = 0; i < crafted.events.size(); ++i) {
    EXPECT_EQ(back->processes()[0].events[i].SerializeAsString(),
              crafted.events[i].SerializeAsString());
  }
  EXPECT_EQ(back->processes()[1].events.size(), 1u);
}

TEST(EventLogTest, KeepsUpToItsCapAndCountsTheRest) {
  RecordedEvents events(3);
  ProcessEvents crafted = Crafted();
  for (const v1::Event& e : crafted.events) events.Add(crafted.key, e);
  EXPECT_EQ(events.events(), 3u);
  EXPECT_EQ(events.dropped(), crafted.events.size() - 3);
}

}  // namespace
}  // namespace vramscope::cli
