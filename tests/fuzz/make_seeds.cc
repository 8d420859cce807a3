// make_seeds: writes the seed corpus of the fuzz targets (tests/fuzz/corpus/TARGET/) with the
// project's own writers, so the seeds are real inputs: rings from the ring writer, spool files
// from an Outbox, batches as the agent cuts them, logs from a Collector, reports as
// `vramscope run --json` prints them. Identity fields (pid, times, host) are fixed afterwards so
// the output is the same on every run. Traces come from tests/fuzz/make_seeds.sh.
//
//   make_seeds CORPUS_DIR        (CORPUS_DIR/ring, spool, batch, record_log, report_json)
#include <google/protobuf/repeated_ptr_field.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/report_text.h"
#include "drain/ring_reader.h"
#include "vramscope/agent/outbox.h"
#include "vramscope/collector/collector.h"
#include "vramscope/log.h"
#include "vramscope/ring.h"
#include "vramscope/ring/ring_writer.h"

namespace vramscope {
namespace {

namespace fs = std::filesystem;
using Events = google::protobuf::RepeatedPtrField<v1::Event>;

constexpr std::uint32_t kCapacity = 64;
constexpr std::size_t kRingBytes =
    VRAMSCOPE_RING_HEADER_SIZE + std::size_t{kCapacity} * VRAMSCOPE_RING_RECORD_SIZE;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "make_seeds: %s\n", what.c_str());
  std::exit(1);
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) Fail("cannot write " + path.string());
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/vramscope-seeds.XXXXXX";
    if (mkdtemp(pattern) == nullptr) Fail("mkdtemp");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// The ring's image with what differs between runs (identity, times, thread ids) fixed.
std::string FixedImage(const interposer::RingWriter& writer) {
  std::string image(reinterpret_cast<const char*>(writer.header()), kRingBytes);
  auto* h = reinterpret_cast<vramscope_ring_header*>(image.data());
  h->pid = 4242;
  h->parent_pid = 1;
  h->uid = 1000;
  h->start_time_ns = 1700000000000000000;
  h->start_monotonic_ns = 1000000;
  h->proc_start_ticks = 0;
  std::memset(h->host, 0, sizeof(h->host));
  std::strcpy(h->host, "seed-host");
  const char command_line[] = "train.py\0--epochs\0003";
  std::memset(h->command_line, 0, sizeof(h->command_line));
  std::memcpy(h->command_line, command_line, sizeof(command_line));
  h->command_line_len = sizeof(command_line);
  auto* records =
      reinterpret_cast<vramscope_ring_record*>(image.data() + VRAMSCOPE_RING_HEADER_SIZE);
  for (std::uint32_t i = 0; i < kCapacity; ++i) {
    if (records[i].seq == 0) continue;
    records[i].tid = 4242;
    if (records[i].kind != VRAMSCOPE_RING_KIND_CUPTI_MEMORY) {
      records[i].time_ns = 1000000 + std::uint64_t{records[i].seq} * 1000;
    }
  }
  return image;
}

// SITE and MODULE records as the shim's stack capture writes them (vramscope/ring.h).
void WriteSite(interposer::RingWriter& writer) {
  vramscope_ring_record module{};
  module.kind = VRAMSCOPE_RING_KIND_MODULE;
  module.aux = 1;    // module id
  module.sub = 0;    // chunk
  module.flags = 2;  // chunks
  module.payload.module.load_bias = 0x400000;
  module.payload.module.start = 0x400000;
  module.payload.module.end = 0x500000;
  std::memcpy(module.payload.module.path, "/opt/app/lib", 12);
  (void)writer.Write(module);
  vramscope_ring_record path{};
  path.kind = VRAMSCOPE_RING_KIND_MODULE;
  path.aux = 1;
  path.sub = 1;
  path.flags = 2;
  std::memcpy(path.payload.text, "train.so", 8);
  (void)writer.Write(path);
  for (std::uint8_t chunk = 0; chunk < 2; ++chunk) {
    vramscope_ring_record site{};
    site.kind = VRAMSCOPE_RING_KIND_SITE;
    site.aux = 6;  // frames
    site.sub = chunk;
    site.flags = 2;
    site.payload.site.site = 0xabcdef;
    for (int f = 0; f < 4 && chunk * 4 + f < 6; ++f) {
      site.payload.site.frames[f] = 0x401000 + 0x10 * (chunk * 4 + f);
    }
    (void)writer.Write(site);
  }
}

// Rings: every record kind; a ring that wrapped around with device info; a ring with a slot a
// dead writer claimed but never published.
std::vector<std::string> Rings(const fs::path& dir) {
  std::vector<std::string> rings;
  {
    interposer::RingWriter writer;
    if (writer.Open({.dir = dir.c_str(), .capacity = kCapacity}) != interposer::RingError::kOk) {
      Fail("cannot open a ring");
    }
    WriteSite(writer);
    (void)writer.RecordNvtxPush(0, 1, 0, 7, "forward", 7, "torch", 5);
    const std::string long_name(90, 'n');
    (void)writer.RecordNvtxPush(0, 2, 1, 0, long_name.data(), long_name.size(), "d", 1);
    (void)writer.RecordAlloc(0, 0x7f0000001000, 1000, 1024, VRAMSCOPE_RING_ALLOC_POOLED, 0, 2,
                             0xabcdef);
    (void)writer.RecordAlloc(1, 0x7f0000100000, 1 << 20, 1 << 20, VRAMSCOPE_RING_ALLOC_DRIVER);
    (void)writer.RecordPoolReserve(0, 0x7f0000000000, 2 << 20);
    vramscope_ring_pool_state_payload state = {1 << 20, 1 << 20, 0, 0, 2 << 20};
    (void)writer.RecordPoolState(0, state);
    (void)writer.RecordOom(0, 4 << 20, 1 << 20, 1 << 20, 2);
    vramscope_ring_cupti_payload cupti = {0x7f0000200000, 4096, 0, 0, 1, 0};
    (void)writer.RecordCuptiMemory(0, 1, 2000000, cupti);
    (void)writer.RecordFree(0, 0x7f0000001000, 1000, 1024, VRAMSCOPE_RING_ALLOC_POOLED);
    (void)writer.RecordNvtxPop(0, 2);
    (void)writer.RecordNvtxPop(0, 1);
    (void)writer.RecordPoolRelease(0, 0x7f0000000000, 2 << 20);
    writer.MarkExited(0);
    rings.push_back(FixedImage(writer));
  }
  {
    interposer::RingWriter writer;
    if (writer.Open({.dir = dir.c_str(), .capacity = kCapacity}) != interposer::RingError::kOk) {
      Fail("cannot open a ring");
    }
    const std::uint8_t uuid[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    writer.SetDeviceInfo(0, "NVIDIA H200", uuid, std::uint64_t{141} << 30);
    // A reader drains the first records, so the next ones wrap around the ring's end.
    for (int i = 0; i < 40; ++i) (void)writer.RecordAlloc(0, 0x1000 * (i + 1), 256, 512, 1);
    {
      agent::RingReader::Options options;
      options.writer_alive = [](const agent::RingInfo&) { return true; };
      auto reader = agent::RingReader::OpenFile(writer.path(), options);
      if (!reader.ok()) Fail(reader.status().ToString());
      Events events;
      if (!(*reader)->Drain(&events).ok()) Fail("drain");
    }
    for (int i = 0; i < 40; ++i) (void)writer.RecordFree(0, 0x1000 * (i + 1), 256, 512, 1);
    for (int i = 0; i < 30; ++i) (void)writer.RecordAlloc(0, 0x1000 * (i + 1), 256, 512, 1);
    writer.MarkExited(3);  // the ring is full: counted as a drop
    rings.push_back(FixedImage(writer));
  }
  {
    interposer::RingWriter writer;
    if (writer.Open({.dir = dir.c_str(), .capacity = kCapacity}) != interposer::RingError::kOk) {
      Fail("cannot open a ring");
    }
    (void)writer.RecordAlloc(0, 0x1000, 64, 64, VRAMSCOPE_RING_ALLOC_MANAGED);
    (void)writer.RecordAlloc(0, 0x2000, 64, 64, VRAMSCOPE_RING_ALLOC_VMM);
    (void)writer.RecordFree(0, 0x1000, 64, 64, VRAMSCOPE_RING_ALLOC_MANAGED);
    std::string image = FixedImage(writer);
    // The writer was killed between claiming the third slot and publishing it.
    auto* h = reinterpret_cast<vramscope_ring_header*>(image.data());
    auto* records =
        reinterpret_cast<vramscope_ring_record*>(image.data() + VRAMSCOPE_RING_HEADER_SIZE);
    records[h->head - 1].seq = 0;
    rings.push_back(image);
  }
  return rings;
}

collector::CollectorOptions CollectorIn(const std::string& dir) {
  collector::CollectorOptions options;
  options.data_dir = dir;
  return options;
}

// The events of a ring image, as the agent reads them.
Events Drain(const std::string& image) {
  std::vector<std::uint64_t> copy(image.size() / 8);
  std::memcpy(copy.data(), image.data(), image.size());
  agent::RingReader::Options options;
  options.writer_alive = [](const agent::RingInfo&) { return false; };
  auto reader = agent::RingReader::OpenMemory(copy.data(), image.size(), options);
  if (!reader.ok()) Fail(reader.status().ToString());
  Events events;
  if (!(*reader)->Drain(&events).ok()) Fail("drain");
  return events;
}

v1::EventBatch Batch(const Events& events, std::uint64_t sequence) {
  v1::EventBatch batch;
  batch.mutable_process()->set_host("seed-host");
  batch.mutable_process()->set_pid(4242);
  batch.mutable_process()->set_start_time_ns(1700000000000000000);
  batch.set_sequence(sequence);
  *batch.mutable_events() = events;
  return batch;
}

int Main(const fs::path& corpus) {
  vramscope::SetMinLogLevel(vramscope::LogLevel::kError);
  for (const char* target : {"ring", "spool", "batch", "record_log", "report_json"}) {
    fs::create_directories(corpus / target);
  }
  TempDir temp;
  const std::vector<std::string> rings = Rings(temp.path());
  std::vector<Events> events;
  for (std::size_t i = 0; i < rings.size(); ++i) {
    WriteFile(corpus / "ring" / ("ring" + std::to_string(i)), rings[i]);
    events.push_back(Drain(rings[i]));
  }

  // Batches as the agent cuts them: the first ring's events in two, the counters, a probe.
  Events first(events[0].begin(), events[0].begin() + events[0].size() / 2);
  Events second(events[0].begin() + events[0].size() / 2, events[0].end());
  std::vector<v1::EventBatch> batches = {Batch(first, 1), Batch(second, 2), Batch(events[1], 3)};
  v1::DeviceCounters* counters = batches[1].add_counters();
  counters->set_device(0);
  counters->set_peak_requested_bytes(1 << 20);
  counters->set_records_written(17);
  WriteFile(corpus / "batch" / "batch1", batches[0].SerializeAsString());
  WriteFile(corpus / "batch" / "batch_ring1", Batch(events[1], 1).SerializeAsString());
  WriteFile(corpus / "batch" / "batch_ring2", Batch(events[2], 1).SerializeAsString());
  WriteFile(corpus / "batch" / "probe", Batch({}, 0).SerializeAsString());

  // Spool files an Outbox wrote.
  const fs::path spool = temp.path() / "spool";
  {
    agent::OutboxOptions options;
    options.spool_dir = spool.string();
    agent::Outbox outbox(options);
    for (std::size_t i = 0; i < 2; ++i) {
      if (!outbox.Add(batches[i], /*ring_end=*/10 * (i + 1))) Fail("outbox refused a batch");
    }
  }
  std::vector<fs::path> spooled(fs::directory_iterator(spool), {});
  std::sort(spooled.begin(), spooled.end());
  for (std::size_t i = 0; i < spooled.size(); ++i) {
    WriteFile(corpus / "spool" / ("spool" + std::to_string(i + 1)),
              spooled[i].filename().string() + "\n" + ReadFile(spooled[i]));
  }

  // A log a Collector wrote, whole and with a torn last record; its reports.
  const fs::path data = temp.path() / "data";
  std::vector<v1::Report> reports;
  {
    auto collector = collector::Collector::Open(CollectorIn(data.string()));
    if (!collector.ok()) Fail(collector.status().ToString());
    for (const v1::EventBatch& batch : batches) {
      if (!(*collector)->Ingest(batch).ok()) Fail("the collector refused a batch");
    }
    v1::EventBatch other = Batch(events[2], 1);
    other.mutable_process()->set_pid(4343);
    if (!(*collector)->Ingest(other).ok()) Fail("the collector refused a batch");
    const v1::ListProcessesResponse listed = (*collector)->ListProcesses(true);
    for (const v1::ProcessSummary& summary : listed.processes()) {
      reports.push_back(*(*collector)->GetReport(summary.process()));
    }
  }
  for (const auto& entry : fs::directory_iterator(data)) {
    const std::string log = ReadFile(entry.path());
    if (entry.path().filename().string().find("4242") == std::string::npos) continue;
    WriteFile(corpus / "record_log" / "log", log);
    WriteFile(corpus / "record_log" / "log_torn", log.substr(0, log.size() - 5));
  }
  WriteFile(corpus / "report_json" / "one.json", cli::FormatReportsJson({reports[0]}));
  WriteFile(corpus / "report_json" / "list.json", cli::FormatReportsJson(reports));
  return 0;
}

}  // namespace
}  // namespace vramscope

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR\n");
    return 2;
  }
  return vramscope::Main(argv[1]);
}
