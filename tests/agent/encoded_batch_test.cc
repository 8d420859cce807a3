// The agent's batches as wire bytes (drain/event_encoder.h, Outbox::Add(EncodedBatch)) against
// the message path they replace: a ring holding every record kind is drained by Agent::Poll into
// the Outbox, and a copy of the same ring file by RingReader::Drain into v1::Event messages cut
// into batches the way the agent used to; every batch the Outbox hands out must parse to the
// message-built batch (MessageDifferencer), and where no map is involved be its exact bytes.
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "drain/event_encoder.h"
#include "drain/ring_reader.h"
#include "tests/collector/test_util.h"
#include "vramscope/agent/agent.h"
#include "vramscope/agent/outbox.h"
#include "vramscope/log.h"
#include "vramscope/ring/ring_writer.h"

namespace vramscope {
namespace {

using google::protobuf::util::MessageDifferencer;

constexpr int kBatchEvents = 7;  // small: the records span several batches

vramscope_ring_record Raw(std::uint8_t kind, std::uint64_t time_ns) {
  vramscope_ring_record r;
  memset(&r, 0, sizeof(r));
  r.kind = kind;
  r.time_ns = time_ns;
  r.tid = 77;
  r.device = 1;
  return r;
}

// Every record kind the drain knows, some in more than one form, plus records it refuses.
void WriteEveryKind(interposer::RingWriter& writer) {
  const std::uint8_t uuid[16] = {0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  writer.SetDeviceInfo(0, "NVIDIA H200", uuid, std::uint64_t{141} << 30);
  const std::string labels = "job=train,team=ml";
  ASSERT_TRUE(writer.RecordLabels(labels.data(), labels.size()));
  ASSERT_TRUE(writer.RecordAlloc(0, 0x7f0000000000, 1000, 1024, VRAMSCOPE_RING_ALLOC_POOLED));
  ASSERT_TRUE(writer.RecordAlloc(1, 0x7f0000100000, 5, 512, VRAMSCOPE_RING_ALLOC_STREAM_ORDERED,
                                 0x5000, 3, 0xfeedface));
  ASSERT_TRUE(writer.RecordAlloc(0, 0, 0, 0, 0));  // every field zero
  ASSERT_TRUE(writer.RecordFree(0, 0x7f0000000000, 1000, 1024, VRAMSCOPE_RING_ALLOC_POOLED));
  ASSERT_TRUE(
      writer.RecordFree(1, 0x7f0000100000, 5, 512, VRAMSCOPE_RING_ALLOC_STREAM_ORDERED, 0x5000));
  ASSERT_TRUE(writer.RecordPoolReserve(0, 0x7e0000000000, std::uint64_t{2} << 30));
  ASSERT_TRUE(writer.RecordPoolRelease(0, 0x7e0000000000, std::uint64_t{2} << 30));
  const std::string name = "forward";
  ASSERT_TRUE(writer.RecordNvtxPush(0, 1, 0, 0, name.data(), name.size(), nullptr, 0));
  // Long enough for TEXT records, a domain, and bytes that are not UTF-8 (escaped).
  std::string long_name(150, 'n');
  long_name += "\xE9t\xC3\xA9";
  const std::string domain = "torch\xFF";
  ASSERT_TRUE(writer.RecordNvtxPush(0, 2, 1, 9, long_name.data(), long_name.size(), domain.data(),
                                    domain.size()));
  ASSERT_TRUE(writer.RecordNvtxPop(0, 2));
  ASSERT_TRUE(writer.RecordNvtxPop(0, 1));
  ASSERT_TRUE(writer.RecordOom(0, std::uint64_t{80} << 30, std::uint64_t{1} << 30, 4096,
                               2 /* OOM_VERDICT_CAPACITY */));
  vramscope_ring_pool_state_payload state{};
  state.largest_free_block_bytes = 1 << 20;
  state.free_bytes = 3 << 20;
  state.pending_bytes = 4096;
  state.unreleasable_free_bytes = 512;
  state.reserved_bytes = 64 << 20;
  ASSERT_TRUE(writer.RecordPoolState(0, state));
  vramscope_ring_cupti_payload cupti{};
  cupti.address = 0x7d0000000000;
  cupti.bytes = 1 << 16;
  cupti.pool_address = 0x7c0000000000;
  cupti.stream = 7;
  cupti.memory_kind = 3;
  cupti.pool_type = 1;
  ASSERT_TRUE(writer.RecordCuptiMemory(0, 1, 123456, cupti));
  vramscope_ring_cupti_payload dropped{};
  dropped.bytes = 17;  // OPERATION_RECORDS_DROPPED: the count
  ASSERT_TRUE(writer.RecordCuptiMemory(0, 6, 123457, dropped));
  // A module and a site of 5 frames in two chunks: one SiteDefinition.
  vramscope_ring_record module = Raw(VRAMSCOPE_RING_KIND_MODULE, 0);
  module.aux = 1;
  module.flags = 1;
  module.payload.module.load_bias = 0x400000;
  module.payload.module.start = 0x400000;
  module.payload.module.end = 0x500000;
  memcpy(module.payload.module.path, "/bin/train", 10);
  ASSERT_TRUE(writer.Write(module));
  for (std::uint32_t chunk = 0; chunk < 2; ++chunk) {
    vramscope_ring_record site = Raw(VRAMSCOPE_RING_KIND_SITE, 2000 + chunk);
    site.aux = 5;
    site.sub = static_cast<std::uint8_t>(chunk);
    site.flags = 2;
    site.payload.site.site = 0xabc;
    for (std::uint32_t j = 0; j < 4 && chunk * 4 + j < 5; ++j) {
      site.payload.site.frames[j] = 0x400100 + chunk * 4 + j;
    }
    ASSERT_TRUE(writer.Write(site));
  }
  // Refused records (counted as drops): an unknown kind, an allocation kind out of range, an
  // OOM verdict out of range, a TEXT record on its own.
  ASSERT_TRUE(writer.Write(Raw(200, 3000)));
  vramscope_ring_record bad_alloc = Raw(VRAMSCOPE_RING_KIND_ALLOC, 3001);
  bad_alloc.sub = VRAMSCOPE_RING_ALLOC_LIMIT;
  ASSERT_TRUE(writer.Write(bad_alloc));
  vramscope_ring_record bad_oom = Raw(VRAMSCOPE_RING_KIND_OOM, 3002);
  bad_oom.sub = 9;
  ASSERT_TRUE(writer.Write(bad_oom));
  ASSERT_TRUE(writer.Write(Raw(VRAMSCOPE_RING_KIND_TEXT, 3003)));
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(writer.RecordAlloc(0, 0x7f0000200000 + i * 4096, 100, 4096,
                                   VRAMSCOPE_RING_ALLOC_POOLED, 0, 0, i));
  }
  // An exit record with a negative code (sign-extended on the wire), killed.
  vramscope_ring_record exit = Raw(VRAMSCOPE_RING_KIND_PROCESS_EXIT, 4000);
  exit.aux = static_cast<std::uint32_t>(-3);
  exit.flags = 1;
  ASSERT_TRUE(writer.Write(exit));
}

// The batches the agent cut before it wrote bytes: RingReader::Drain into messages, batches of
// kBatchEvents records with the process key and the header's counters, numbered from 1.
std::vector<v1::EventBatch> MessageBatches(const std::string& ring) {
  agent::RingReader::Options options;
  options.commit_in_drain = false;
  auto reader = agent::RingReader::OpenFile(ring, options);
  EXPECT_TRUE(reader.ok()) << reader.status();
  std::vector<v1::EventBatch> batches;
  if (!reader.ok()) return batches;
  while (true) {
    v1::EventBatch batch;
    auto stats = (*reader)->Drain(batch.mutable_events(), kBatchEvents);
    EXPECT_TRUE(stats.ok()) << stats.status();
    if (!stats.ok()) break;
    if (batch.events_size() > 0) {
      *batch.mutable_process() = (*reader)->process_key();
      for (v1::DeviceCounters& counters : (*reader)->Counters()) {
        *batch.add_counters() = std::move(counters);
      }
      batch.set_sequence(batches.size() + 1);
      batches.push_back(std::move(batch));
    }
    if (stats->records < kBatchEvents) break;
  }
  return batches;
}

bool HasLabels(const v1::EventBatch& batch) {
  for (const v1::Event& event : batch.events()) {
    if (event.has_process_start() && !event.process_start().labels().empty()) return true;
  }
  return false;
}

TEST(EncodedBatchTest, TheAgentsBatchesParseToTheMessagePathsBatches) {
  SetMinLogLevel(LogLevel::kError);
  testing::TempDir rings;
  testing::TempDir copy;
  interposer::RingWriter writer;
  interposer::RingOpenOptions ring_options;
  ring_options.dir = rings.path().c_str();
  ASSERT_EQ(writer.Open(ring_options), interposer::RingError::kOk);
  WriteEveryKind(writer);
  // The same bytes twice: one ring for the agent, one for the message path.
  const std::string ring = std::filesystem::directory_iterator(rings.path())->path().string();
  const std::string copied = copy.path() + "/ring";
  std::filesystem::copy_file(ring, copied);
  const std::vector<v1::EventBatch> expected = MessageBatches(copied);
  ASSERT_GT(expected.size(), 3u);

  agent::AgentOptions options;
  options.ring_dir = rings.path();
  options.batch_events = kBatchEvents;
  options.uplink.collector = "127.0.0.1:1";  // nothing listens: the batches stay in the outbox
  agent::Agent agent(options);
  ASSERT_TRUE(agent.Poll().ok());
  std::vector<v1::EventBatch> sent;
  while (auto bytes = agent.outbox().NextToSendBytes(absl::ZeroDuration())) {
    v1::EventBatch batch;
    ASSERT_TRUE(batch.ParseFromString(*bytes));
    if (!HasLabels(batch)) {
      // No map: protobuf's serialization is deterministic, and the agent's bytes are it.
      const auto it = std::find_if(expected.begin(), expected.end(),
                                   [&](const auto& e) { return e.sequence() == batch.sequence(); });
      ASSERT_NE(it, expected.end());
      EXPECT_EQ(*bytes, it->SerializeAsString()) << "batch " << batch.sequence();
    }
    sent.push_back(std::move(batch));
  }
  ASSERT_EQ(sent.size(), expected.size());
  std::set<v1::Event::PayloadCase> kinds;
  for (std::size_t i = 0; i < sent.size(); ++i) {
    std::string diff;
    MessageDifferencer differencer;
    differencer.ReportDifferencesToString(&diff);
    EXPECT_TRUE(differencer.Compare(expected[i], sent[i])) << "batch " << i + 1 << ": " << diff;
    for (const v1::Event& event : sent[i].events()) kinds.insert(event.payload_case());
  }
  // Every kind of event made it through (ProcessExit from the exit record).
  for (auto kind :
       {v1::Event::kAlloc, v1::Event::kFree, v1::Event::kPoolReserve, v1::Event::kPoolRelease,
        v1::Event::kNvtxPush, v1::Event::kNvtxPop, v1::Event::kOom, v1::Event::kPoolState,
        v1::Event::kCuptiMemory, v1::Event::kProcessStart, v1::Event::kProcessExit,
        v1::Event::kDrop, v1::Event::kSiteDefinition}) {
    EXPECT_TRUE(kinds.count(kind)) << "no event of payload case " << kind;
  }
  EXPECT_EQ(agent.counters().batches_cut, expected.size());
}

// A batch dropped for want of room is reported at the head of the process's next batch: the
// encoded path puts the same DropEvent there, timed at the batch's first event.
TEST(EncodedBatchTest, ADroppedBatchIsReportedAtTheHeadOfTheNextEncodedBatch) {
  agent::OutboxOptions options;
  options.max_memory_bytes = 600;
  agent::Outbox outbox(options);
  auto make = [](std::uint64_t first_time, int events) {
    agent::EncodedBatch batch;
    batch.process = testing::Key(5);
    agent::EncodedEvents encoded;
    for (int i = 0; i < events; ++i) {
      vramscope_ring_record record = Raw(VRAMSCOPE_RING_KIND_ALLOC, first_time + i);
      record.payload.alloc.address = 0x1000 * (i + 1);
      record.payload.alloc.requested_bytes = 100;
      EXPECT_TRUE(encoded.AddRecord(record, "").ok());
    }
    batch.event_count = encoded.size();
    batch.first_time_ns = encoded.first_time_ns();
    batch.events = encoded.TakeBytes();
    v1::DeviceCounters counters;
    counters.set_device(0);
    counters.set_peak_reserved_bytes(1 << 20);
    agent::AppendCountersField(counters, &batch.counters);
    return batch;
  };
  ASSERT_TRUE(outbox.Add(make(1000, 3)));
  EXPECT_FALSE(outbox.Add(make(2000, 40)));  // no room: dropped, counted
  auto first = outbox.NextToSend(absl::ZeroDuration());
  ASSERT_NE(first, nullptr);
  outbox.Ack(testing::Key(5), 1);
  ASSERT_TRUE(outbox.Add(make(3000, 2)));
  auto bytes = outbox.NextToSendBytes(absl::ZeroDuration());
  ASSERT_NE(bytes, nullptr);

  v1::EventBatch expected;
  *expected.mutable_process() = testing::Key(5);
  expected.set_sequence(2);
  v1::Event* drop = expected.add_events();
  drop->set_time_ns(3000);
  drop->mutable_drop()->set_dropped_records(40);
  for (int i = 0; i < 2; ++i) {
    v1::Event* event = expected.add_events();
    event->set_time_ns(3000 + i);
    event->set_device(1);
    event->set_thread_id(77);
    event->mutable_alloc()->set_address(0x1000 * (i + 1));
    event->mutable_alloc()->set_requested_bytes(100);
  }
  v1::DeviceCounters* counters = expected.add_counters();
  counters->set_device(0);
  counters->set_peak_reserved_bytes(1 << 20);
  EXPECT_EQ(*bytes, expected.SerializeAsString());
  EXPECT_EQ(outbox.counters().events_dropped, 40u);
}

// Spool files keep their format (a 40-byte header and the serialized EventBatch): a file written
// the way earlier agents wrote it, header built here by hand from the documented layout, is
// replayed and sent as exactly its batch's bytes; a file this Outbox writes parses as its batch.
TEST(EncodedBatchTest, SpoolFilesOfEarlierAgentsReplayAndNewOnesParse) {
  testing::TempDir spool;
  const v1::ProcessKey key = testing::Key(9);
  v1::EventBatch batch;
  *batch.mutable_process() = key;
  batch.set_sequence(1);
  v1::Event* alloc = batch.add_events();
  alloc->set_time_ns(5);
  alloc->mutable_alloc()->set_address(0x1000);
  alloc->mutable_alloc()->set_requested_bytes(10);
  v1::Event* push = batch.add_events();
  push->set_time_ns(6);
  push->mutable_nvtx_push()->set_name("step");
  batch.add_counters()->set_peak_reserved_bytes(1 << 20);
  const std::string payload = batch.SerializeAsString();
  struct {
    char magic[8];
    std::uint64_t sequence, ring_end, payload_bytes;
    std::uint32_t crc32, reserved;
  } header{};
  static_assert(sizeof(header) == 40);
  memcpy(header.magic, "VSSPOOL1", 8);
  header.sequence = 1;
  header.ring_end = 55;
  header.payload_bytes = payload.size();
  header.crc32 = static_cast<std::uint32_t>(crc32_z(
      crc32_z(0, nullptr, 0), reinterpret_cast<const Bytef*>(payload.data()), payload.size()));
  {
    std::ofstream file(spool.path() + "/" + agent::SpoolFileName(key, 1, 2), std::ios::binary);
    file.write(reinterpret_cast<const char*>(&header), sizeof(header));
    file << payload;
  }
  agent::OutboxOptions options;
  options.spool_dir = spool.path();
  agent::Outbox outbox(options);
  EXPECT_EQ(outbox.counters().batches_replayed, 1u);
  ASSERT_TRUE(outbox.replayed(key).has_value());
  EXPECT_EQ(outbox.replayed(key)->ring_end, 55u);
  auto replayed = outbox.NextToSendBytes(absl::ZeroDuration());
  ASSERT_NE(replayed, nullptr);
  EXPECT_TRUE(*replayed == payload);

  // A batch this Outbox spools: its file is what ParseSpoolFile (the replay) accepts, holding
  // the batch.
  batch.clear_sequence();
  ASSERT_TRUE(outbox.Add(batch, 77));
  const std::string name = agent::SpoolFileName(key, 2, 2);
  std::ifstream in(spool.path() + "/" + name, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  absl::StatusOr<agent::SpoolFile> parsed = agent::ParseSpoolFile(name, bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  batch.set_sequence(2);
  EXPECT_TRUE(MessageDifferencer::Equals(parsed->batch, batch));
  EXPECT_EQ(parsed->ring_end, 77u);
}

}  // namespace
}  // namespace vramscope
