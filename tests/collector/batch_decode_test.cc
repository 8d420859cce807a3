// The Ingest decoder (CheckIngestMessage with an IngestScratch: allocations and frees decoded from
// the wire without a message each) against protobuf's parse of the same bytes: the same verdict,
// and for a batch to store the same figures from the stats engine, for ordinary batches, for every
// oddity of the wire format the decoder leaves to protobuf, and for randomly damaged bytes.
#include <google/protobuf/arena.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "stats/stats_engine.h"
#include "tests/collector/test_util.h"
#include "vramscope/collector/batch_check.h"
#include "vramscope/collector/collector.h"
#include "vramscope/log.h"

namespace vramscope::collector {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::vramscope::testing::Key;
using ::vramscope::testing::TempDir;

void PutVarint(std::string* out, uint64_t value) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}
void PutTag(std::string* out, uint32_t field, uint32_t wire_type) {
  PutVarint(out, (uint64_t{field} << 3) | wire_type);
}
void PutBytes(std::string* out, uint32_t field, const std::string& bytes) {
  PutTag(out, field, 2);
  PutVarint(out, bytes.size());
  *out += bytes;
}
// A batch's key and sequence, then `events` (each an Event's bytes), as wire bytes.
std::string BatchWire(uint64_t sequence, const std::vector<std::string>& events) {
  std::string wire;
  PutBytes(&wire, 1, Key(7).SerializeAsString());
  PutTag(&wire, 2, 0);
  PutVarint(&wire, sequence);
  for (const std::string& event : events) PutBytes(&wire, 3, event);
  return wire;
}

// Both ways of reading `wire`: the verdicts must agree, and a stored batch's figures too.
// Returns how many events the decoder took itself (the others protobuf parsed), -1 when it left
// the whole message to protobuf.
int ExpectSameAsProtobuf(const std::string& wire) {
  google::protobuf::Arena parsed_arena;
  google::protobuf::Arena decoded_arena;
  IngestScratch scratch;
  const IngestMessage parsed = CheckIngestMessage(wire, &parsed_arena);
  const IngestMessage decoded = CheckIngestMessage(wire, &decoded_arena, &scratch);
  EXPECT_EQ(static_cast<int>(decoded.kind), static_cast<int>(parsed.kind));
  EXPECT_EQ(decoded.reason, parsed.reason);
  EXPECT_EQ(decoded.sequence, parsed.sequence);
  EXPECT_EQ(decoded.events, parsed.events);
  EXPECT_TRUE(MessageDifferencer::Equals(decoded.process, parsed.process));
  if (parsed.kind != IngestMessage::Kind::kBatch || decoded.kind != parsed.kind) return -1;
  EXPECT_EQ(parsed.decoded, nullptr);
  ProcessStatsEngine from_parsed;
  ProcessStatsEngine from_decoded;
  from_parsed.AddBatch(*parsed.batch);
  if (decoded.decoded != nullptr) {
    EXPECT_EQ(decoded.decoded->size(), static_cast<size_t>(parsed.batch->events_size()));
    from_decoded.AddBatch(*decoded.batch, *decoded.decoded);
  } else {
    EXPECT_TRUE(MessageDifferencer::Equals(*decoded.batch, *parsed.batch));
    from_decoded.AddBatch(*decoded.batch);
  }
  EXPECT_EQ(from_decoded.events(), from_parsed.events());
  std::string difference;
  MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&difference);
  EXPECT_TRUE(differencer.Compare(from_decoded.Report(), from_parsed.Report())) << difference;
  if (decoded.decoded == nullptr) return -1;
  int taken = 0;
  for (const BatchEvent& event : *decoded.decoded) taken += event.other == nullptr ? 1 : 0;
  return taken;
}

// An Event: time, device, thread, then an allocation (field 10) or free (11) of these fields.
std::string MemoryEventWire(bool alloc, uint64_t time, uint32_t device, uint64_t address,
                            uint64_t bytes, int kind, uint64_t site) {
  std::string payload;
  PutTag(&payload, 1, 0);
  PutVarint(&payload, address);
  PutTag(&payload, 2, 0);
  PutVarint(&payload, bytes - 10);
  PutTag(&payload, 3, 0);
  PutVarint(&payload, bytes);
  PutTag(&payload, 4, 0);
  PutVarint(&payload, static_cast<uint64_t>(static_cast<int64_t>(kind)));
  if (alloc && site != 0) {
    PutTag(&payload, 7, 0);
    PutVarint(&payload, site);
  }
  std::string event;
  PutTag(&event, 1, 0);
  PutVarint(&event, time);
  PutTag(&event, 2, 0);
  PutVarint(&event, device);
  PutTag(&event, 3, 0);
  PutVarint(&event, 99);
  PutBytes(&event, alloc ? 10 : 11, payload);
  return event;
}

class BatchDecodeTest : public ::testing::Test {
 protected:
  void SetUp() override { SetMinLogLevel(LogLevel::kError); }
};

TEST_F(BatchDecodeTest, OrdinaryBatchesAreDecodedWithTheSameFigures) {
  // Allocations and frees between the events that are parsed: a start, NVTX ranges, a site,
  // pool reservations and state, an OOM, a drop, the exit; counters at the end.
  v1::EventBatch batch;
  *batch.mutable_process() = Key(7);
  batch.set_sequence(3);
  uint64_t t = 1000;
  batch.add_events()->mutable_process_start()->add_command_line("train.py");
  v1::Event* site = batch.add_events();
  site->mutable_site_definition()->set_site(5);
  site->mutable_site_definition()->add_frames("/usr/lib/libtorch_cuda.so+0x10");
  for (int i = 0; i < 400; ++i) {
    v1::Event* event = batch.add_events();
    event->set_time_ns(t += 100);
    event->set_device(static_cast<uint32_t>(i % 3));
    event->set_thread_id(static_cast<uint32_t>(10 + i % 2));
    const uint64_t address = 0x1000 * static_cast<uint64_t>(1 + i % 37);
    if (i % 50 == 7)
      event->mutable_nvtx_push()->set_range_id(static_cast<uint32_t>(i));
    else if (i % 50 == 30)
      event->mutable_nvtx_pop()->set_range_id(static_cast<uint32_t>(i - 23));
    else if (i % 97 == 3)
      event->mutable_pool_reserve()->set_bytes(1 << 20);
    else if (i % 97 == 60)
      event->mutable_pool_state()->set_free_bytes(4096);
    else if (i % 131 == 5)
      event->mutable_oom()->set_requested_bytes(1 << 30);
    else if (i % 3 != 2) {
      v1::AllocEvent* alloc = event->mutable_alloc();
      alloc->set_address(address);
      alloc->set_requested_bytes(static_cast<uint64_t>(100 + i));
      alloc->set_allocated_bytes(static_cast<uint64_t>(512 + i));
      alloc->set_kind(static_cast<v1::AllocationKind>(i % 12));
      alloc->set_site(i % 4 == 0 ? 5 : (i % 4 == 1 ? 6 : 0));
      alloc->set_nvtx_range(i % 5 == 0 ? static_cast<uint32_t>(i / 50 * 50 + 7) : 0);
      alloc->set_stream(3);
    } else {
      v1::FreeEvent* free = event->mutable_free();
      free->set_address(address);
      free->set_kind(v1::ALLOCATION_KIND_POOLED);
    }
  }
  batch.add_events()->mutable_drop()->set_dropped_records(3);
  batch.add_events()->mutable_process_exit()->set_exit_code(1);
  batch.add_counters()->set_peak_reserved_bytes(1 << 30);
  EXPECT_GT(ExpectSameAsProtobuf(batch.SerializeAsString()), 300);
  // Probes too.
  v1::EventBatch probe;
  *probe.mutable_process() = Key(7);
  EXPECT_EQ(ExpectSameAsProtobuf(probe.SerializeAsString()), 0);
}

TEST_F(BatchDecodeTest, WireOdditiesAreLeftToProtobuf) {
  const std::string plain = MemoryEventWire(true, 5, 0, 0x1000, 4096, 1, 0);
  // Taken by the decoder: a plain event, a kind protobuf does not know, a negative one, a device
  // past 32 bits (cut as protobuf cuts it), a ten-byte varint, a field given twice (the later
  // wins).
  EXPECT_EQ(ExpectSameAsProtobuf(BatchWire(1, {plain})), 1);
  EXPECT_EQ(
      3, ExpectSameAsProtobuf(BatchWire(1, {MemoryEventWire(true, 5, 0, 0x1000, 4096, 77, 0),
                                            MemoryEventWire(true, 6, 0, 0x2000, 4096, -3, 0),
                                            MemoryEventWire(false, 7, 0, 0x2000, 4096, -3, 0)})));
  EXPECT_EQ(2, ExpectSameAsProtobuf(BatchWire(
                   1, {MemoryEventWire(true, 5, (1u << 31) + 1, 0x1000, 4096, 1, 9),
                       MemoryEventWire(true, ~uint64_t{0}, 2, 0x3000, ~uint64_t{0} - 1, 1, 9)})));
  std::string twice = plain;
  PutTag(&twice, 1, 0);
  PutVarint(&twice, 12345);  // time_ns again
  EXPECT_EQ(ExpectSameAsProtobuf(BatchWire(1, {twice, plain})), 2);

  // Left to protobuf (that event alone, and so the same): a second payload (merged or switched
  // oneof), an unknown field, a free with an allocation's fields, a field of another wire type, no
  // payload.
  std::string two_payloads = plain;
  std::string free_payload;
  PutTag(&free_payload, 1, 0);
  PutVarint(&free_payload, 0x1000);
  PutBytes(&two_payloads, 11, free_payload);
  std::string merged = plain;
  std::string more;
  PutTag(&more, 2, 0);
  PutVarint(&more, 1);
  PutBytes(&merged, 10, more);
  std::string unknown = plain;
  PutTag(&unknown, 99, 0);
  PutVarint(&unknown, 1);
  std::string free_with_site;
  PutTag(&free_with_site, 7, 0);
  PutVarint(&free_with_site, 5);
  std::string free_event;
  PutBytes(&free_event, 11, free_with_site);
  std::string fixed_time;
  PutTag(&fixed_time, 1, 1);
  fixed_time += std::string(8, '\x01');
  PutBytes(&fixed_time, 10, "");
  for (const std::string& odd :
       {two_payloads, merged, unknown, free_event, fixed_time, std::string()}) {
    EXPECT_EQ(ExpectSameAsProtobuf(BatchWire(2, {plain, odd, plain})), 2);
  }
  // Batches that are not stored (all left to protobuf): sequence 0 with events, an unusable key,
  // bad UTF-8 after decoded events, bytes cut short.
  EXPECT_EQ(-1, ExpectSameAsProtobuf(BatchWire(0, {plain})));
  std::string bad_push;
  std::string push;
  PutBytes(&push, 2, "\xFF");
  PutBytes(&bad_push, 14, push);
  EXPECT_EQ(ExpectSameAsProtobuf(BatchWire(1, {plain, bad_push})), -1);
  const std::string whole = BatchWire(1, {plain, plain});
  EXPECT_EQ(ExpectSameAsProtobuf(whole.substr(0, whole.size() - 3)), -1);
  v1::ProcessKey pid0;
  pid0.set_host("h");
  std::string pid0_wire;
  PutBytes(&pid0_wire, 1, pid0.SerializeAsString());
  PutTag(&pid0_wire, 2, 0);
  PutVarint(&pid0_wire, 1);
  PutBytes(&pid0_wire, 3, plain);
  EXPECT_EQ(ExpectSameAsProtobuf(pid0_wire), -1);
}

TEST_F(BatchDecodeTest, DamagedBytesGetTheSameVerdict) {
  std::mt19937_64 random(22);
  std::vector<std::string> events;
  for (int i = 0; i < 64; ++i) {
    events.push_back(MemoryEventWire(i % 2 == 0, 100 + static_cast<uint64_t>(i), 0,
                                     0x1000 * static_cast<uint64_t>(i / 2), 4096, 1, i % 3));
  }
  const std::string wire = BatchWire(1, events);
  for (int round = 0; round < 10000; ++round) {
    std::string damaged = wire;
    const int flips = 1 + static_cast<int>(random() % 3);
    for (int f = 0; f < flips; ++f) {
      damaged[random() % damaged.size()] = static_cast<char>(random());
    }
    ExpectSameAsProtobuf(damaged);
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "round " << round;
      return;
    }
  }
}

TEST_F(BatchDecodeTest, TheCollectorStoresDecodedBatchesAsReceived) {
  // Through Collector::Ingest(IngestMessage): the log holds the wire bytes, so a restart reads
  // back the same report the live engine gave.
  TempDir dir;
  CollectorOptions options;
  options.data_dir = dir.path();
  v1::Report live;
  {
    auto collector = *Collector::Open(options);
    google::protobuf::Arena arena;
    IngestScratch scratch;
    for (uint64_t sequence = 1; sequence <= 3; ++sequence) {
      std::vector<std::string> events;
      for (int i = 0; i < 10; ++i) {
        events.push_back(MemoryEventWire(i % 2 == 0, sequence * 100 + static_cast<uint64_t>(i), 0,
                                         0x1000 * static_cast<uint64_t>(i / 2), 4096, 1, 0));
      }
      const std::string wire = BatchWire(sequence, events);
      arena.Reset();
      IngestMessage message = CheckIngestMessage(wire, &arena, &scratch);
      ASSERT_NE(message.decoded, nullptr);
      ASSERT_EQ(*collector->Ingest(message, wire, false, ""), sequence);
    }
    live = *collector->GetReport(Key(7), {});
    EXPECT_EQ(live.devices(0).alloc_count(), 15u);
  }
  auto reopened = *Collector::Open(options);
  v1::Report recovered = *reopened->GetReport(Key(7), {});
  EXPECT_TRUE(MessageDifferencer::Equals(recovered, live));
}

}  // namespace
}  // namespace vramscope::collector
