// Deterministic fuzzing of the ring reader and decoder: random regions, and valid rings with
// random bytes changed (header and records). Every input must keep the contracts of
// ring_fuzz_check.h (a region that opens drains completely, the same in pieces, no more events
// than records, events that survive the wire...); reads out of bounds are the sanitizer build's
// to catch (scripts/test.sh runs this suite under ASan and UBSan). The coverage-driven version is
// tests/fuzz/ring_fuzzer.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "drain/ring_decoder.h"
#include "drain/ring_reader.h"
#include "ring_fuzz_check.h"
#include "ring_test_util.h"
#include "vramscope/ring/ring_writer.h"

namespace vramscope::agent {
namespace {

constexpr std::uint32_t kCapacity = 64;
constexpr std::size_t kRingBytes =
    VRAMSCOPE_RING_HEADER_SIZE + std::size_t{kCapacity} * VRAMSCOPE_RING_RECORD_SIZE;

RingReader::Options DeadWriter() {
  RingReader::Options options;
  options.writer_alive = [](const RingInfo&) { return false; };
  return options;
}

// A valid ring image with a mix of every record kind.
std::vector<std::uint64_t> ValidRing() {
  vramscope::testing::TempDir dir;
  interposer::RingWriter writer;
  EXPECT_EQ(writer.Open({.dir = dir.path().c_str(), .capacity = kCapacity}),
            interposer::RingError::kOk);
  const std::string name(70, 'r');
  for (int i = 0; writer.header()->head < kCapacity - 8; ++i) {
    writer.RecordAlloc(0, 0x1000 + i, 100, 128, VRAMSCOPE_RING_ALLOC_POOLED);
    writer.RecordNvtxPush(0, i, 0, 0, name.data(), name.size(), "d", 1);
    writer.RecordNvtxPop(0, i);
    writer.RecordPoolReserve(1, 0x2000, 4096);
    vramscope_ring_pool_state_payload state = {1, 2, 3, 4, 5};
    writer.RecordPoolState(0, state);
    writer.RecordOom(0, 10, 5, 2, 1);
    writer.RecordFree(0, 0x1000 + i, 100, 128, VRAMSCOPE_RING_ALLOC_POOLED);
  }
  writer.MarkExited(0);
  std::vector<std::uint64_t> image(kRingBytes / 8);
  std::memcpy(image.data(), writer.header(), kRingBytes);
  return image;
}

// The contracts of ring_fuzz_check.h on `image`; what is wrong, or "".
std::string Exercise(const std::vector<std::uint64_t>& image) {
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(image.data());
  std::string problem = testing::CheckRing(bytes, image.size() * 8);
  if (problem.empty()) problem = testing::CheckDecoder(bytes, image.size() * 8);
  return problem;
}

TEST(RingFuzzTest, ValidRingDrainsCompletely) {
  std::vector<std::uint64_t> image = ValidRing();
  const std::uint64_t head = reinterpret_cast<vramscope_ring_header*>(image.data())->head;
  EXPECT_EQ(Exercise(image), "");
  auto reader = RingReader::OpenMemory(image.data(), kRingBytes, DeadWriter());
  ASSERT_TRUE(reader.ok()) << reader.status();
  google::protobuf::RepeatedPtrField<v1::Event> events;
  auto stats = (*reader)->Drain(&events);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->finished);
  EXPECT_EQ(stats->invalid, 0u);
  EXPECT_EQ(stats->dropped, 0u);
  EXPECT_EQ(stats->records, head);
  // Every record is an event but the NVTX pushes' two TEXT records each; ProcessStart first, the
  // writer's ProcessExit last.
  const std::uint64_t pushes = (head - 1) / 9;
  EXPECT_EQ(static_cast<std::uint64_t>(events.size()), 1 + head - 2 * pushes);
  EXPECT_TRUE(events[0].has_process_start());
  EXPECT_TRUE(events[events.size() - 1].has_process_exit());
}

// The checks can fail: a reader that read one record less, or an event the collector could not
// parse, is reported.
TEST(RingFuzzTest, ChecksSeeBrokenContracts) {
  std::vector<std::uint64_t> image = ValidRing();
  auto reader = RingReader::OpenMemory(image.data(), kRingBytes, DeadWriter());
  ASSERT_TRUE(reader.ok());
  google::protobuf::RepeatedPtrField<v1::Event> events;
  auto stats = (*reader)->Drain(&events);
  ASSERT_TRUE(stats.ok());
  DrainStats wrong = *stats;
  ++wrong.events;
  EXPECT_NE(testing::CheckDrainStats(wrong, 0, **reader, events.size(), SIZE_MAX), "");
  EXPECT_NE(testing::CheckEventsFromRecords(events, 1), "");
  events[1].mutable_nvtx_push()->set_name("\xff\xfe");
  EXPECT_NE(testing::CheckWire(events), "");
}

// Text from the ring goes into proto3 strings: bytes that are not UTF-8 (a Latin-1 argument, a
// truncated NVTX name, a scribbled header) must not make the batch unparseable at the collector.
TEST(RingFuzzTest, TextThatIsNotUtf8SurvivesTheWire) {
  vramscope::testing::TempDir dir;
  interposer::RingWriter writer;
  ASSERT_EQ(writer.Open({.dir = dir.path().c_str(), .capacity = kCapacity}),
            interposer::RingError::kOk);
  const std::string name = "caf\xe9 \xc3\xa9t\xc3";  // Latin-1, then UTF-8, then a cut sequence
  const std::string domain =
      "\xed\xa0\x80"
      "d";  // a surrogate
  ASSERT_TRUE(
      writer.RecordNvtxPush(0, 1, 0, 0, name.data(), name.size(), domain.data(), domain.size()));
  writer.MarkExited(0);
  std::vector<std::uint64_t> image(kRingBytes / 8);
  std::memcpy(image.data(), writer.header(), kRingBytes);
  auto* header = reinterpret_cast<vramscope_ring_header*>(image.data());
  std::strcpy(header->host, "h\xffst");
  const char argv[] = "app\0\xe0\x80\x80";  // an overlong NUL
  std::memcpy(header->command_line, argv, sizeof(argv));
  header->command_line_len = sizeof(argv);

  auto reader = RingReader::OpenMemory(image.data(), kRingBytes, DeadWriter());
  ASSERT_TRUE(reader.ok()) << reader.status();
  google::protobuf::RepeatedPtrField<v1::Event> events;
  ASSERT_TRUE((*reader)->Drain(&events).ok());
  EXPECT_EQ(testing::CheckWire(events), "");
  ASSERT_GE(events.size(), 2);
  // Escaped as vramscope/utf8.h does: every byte that is not part of a UTF-8 character as \xHH.
  EXPECT_EQ(events[0].process_start().host(), "h\\xFFst");
  EXPECT_THAT(events[0].process_start().command_line(),
              ::testing::ElementsAre("app", "\\xE0\\x80\\x80"));
  EXPECT_EQ(events[1].nvtx_push().name(), "caf\\xE9 \xc3\xa9t\\xC3");
  EXPECT_EQ(events[1].nvtx_push().domain(), "\\xED\\xA0\\x80d");
}

TEST(RingFuzzTest, HeaderErrorsAreStatusesNotCrashes) {
  std::vector<std::uint64_t> image = ValidRing();
  auto header = [&] { return reinterpret_cast<vramscope_ring_header*>(image.data()); };
  struct Case {
    const char* name;
    void (*mutate)(vramscope_ring_header*);
    absl::StatusCode code;
  };
  const Case cases[] = {
      {"magic", [](vramscope_ring_header* h) { h->magic ^= 1; },
       absl::StatusCode::kInvalidArgument},
      {"zero magic", [](vramscope_ring_header* h) { h->magic = 0; },
       absl::StatusCode::kUnavailable},
      {"version", [](vramscope_ring_header* h) { h->version = 2; },
       absl::StatusCode::kInvalidArgument},
      {"record size", [](vramscope_ring_header* h) { h->record_size = 32; },
       absl::StatusCode::kInvalidArgument},
      {"capacity", [](vramscope_ring_header* h) { h->capacity = 96; },
       absl::StatusCode::kInvalidArgument},
      {"capacity vs size", [](vramscope_ring_header* h) { h->capacity = 128; },
       absl::StatusCode::kInvalidArgument},
      {"tail > head", [](vramscope_ring_header* h) { h->tail = h->head + 1; },
       absl::StatusCode::kDataLoss},
      {"head too far", [](vramscope_ring_header* h) { h->head = h->tail + 2 * kCapacity; },
       absl::StatusCode::kDataLoss},
  };
  const std::vector<std::uint64_t> pristine = image;
  for (const Case& c : cases) {
    image = pristine;
    c.mutate(header());
    auto reader = RingReader::OpenMemory(image.data(), kRingBytes, DeadWriter());
    EXPECT_EQ(reader.status().code(), c.code) << c.name << ": " << reader.status();
  }
  image = pristine;
  EXPECT_FALSE(RingReader::OpenMemory(image.data(), 100, DeadWriter()).ok());
  EXPECT_FALSE(RingReader::OpenMemory(image.data(), kRingBytes - 64, DeadWriter()).ok());
  EXPECT_FALSE(
      RingReader::OpenMemory(reinterpret_cast<char*>(image.data()) + 1, 4096, DeadWriter()).ok());

  // Head corrupted after open: an error from Drain.
  image = pristine;
  auto reader = RingReader::OpenMemory(image.data(), kRingBytes, DeadWriter());
  ASSERT_TRUE(reader.ok());
  header()->head += 10 * kCapacity;
  google::protobuf::RepeatedPtrField<v1::Event> events;
  EXPECT_EQ((*reader)->Drain(&events).status().code(), absl::StatusCode::kDataLoss);
}

TEST(RingFuzzTest, RandomRegions) {
  std::mt19937_64 rng(20261129);
  std::vector<std::uint64_t> image(kRingBytes / 8);
  for (int iteration = 0; iteration < 2000; ++iteration) {
    for (std::uint64_t& word : image) word = rng();
    if (iteration % 2 == 0) {
      // Give half of them a plausible header so the record paths run too.
      auto* h = reinterpret_cast<vramscope_ring_header*>(image.data());
      h->magic = VRAMSCOPE_RING_MAGIC;
      h->version = VRAMSCOPE_RING_VERSION;
      h->header_size = VRAMSCOPE_RING_HEADER_SIZE;
      h->record_size = VRAMSCOPE_RING_RECORD_SIZE;
      h->max_devices = VRAMSCOPE_RING_MAX_DEVICES;
      h->capacity = kCapacity;
      h->tail = rng() % 1000;
      h->head = h->tail + rng() % (kCapacity + 1);
    }
    ASSERT_EQ(Exercise(image), "") << "iteration " << iteration;
  }
}

TEST(RingFuzzTest, MutatedValidRings) {
  std::mt19937_64 rng(42);
  const std::vector<std::uint64_t> pristine = ValidRing();
  std::vector<std::uint64_t> image;
  for (int iteration = 0; iteration < 5000; ++iteration) {
    image = pristine;
    auto* bytes = reinterpret_cast<std::uint8_t*>(image.data());
    const int flips = 1 + static_cast<int>(rng() % 8);
    for (int f = 0; f < flips; ++f) {
      // Mostly the records, sometimes the header.
      const std::size_t at = rng() % 4 == 0 ? rng() % VRAMSCOPE_RING_HEADER_SIZE
                                            : VRAMSCOPE_RING_HEADER_SIZE +
                                                  rng() % (kRingBytes - VRAMSCOPE_RING_HEADER_SIZE);
      bytes[at] = static_cast<std::uint8_t>(rng());
    }
    ASSERT_EQ(Exercise(image), "") << "iteration " << iteration;
  }
}

TEST(RingFuzzTest, DecoderOnRandomRecords) {
  std::mt19937_64 rng(7);
  vramscope_ring_record record;
  for (int iteration = 0; iteration < 100000; ++iteration) {
    std::uint64_t words[8];
    for (std::uint64_t& w : words) w = rng();
    std::memcpy(&record, words, sizeof(record));
    record.kind = static_cast<std::uint8_t>(rng() % (VRAMSCOPE_RING_KIND_LIMIT + 2));
    if (rng() % 2 == 0) {
      // A plausible NVTX text length, so pushes decode too.
      record.payload.nvtx_push.name_len = static_cast<std::uint16_t>(rng() % 100);
      record.payload.nvtx_push.domain_len = static_cast<std::uint16_t>(rng() % 50);
    }
    std::string bytes(reinterpret_cast<const char*>(&record), sizeof(record));
    for (std::size_t n = rng() % 200; n > 0; --n) bytes += static_cast<char>(' ' + rng() % 95);
    ASSERT_EQ(
        testing::CheckDecoder(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()),
        "")
        << "iteration " << iteration;
  }
}

}  // namespace
}  // namespace vramscope::agent
