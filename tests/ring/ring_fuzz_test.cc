// Deterministic fuzzing of the ring reader and decoder: random regions, and valid rings with
// random bytes changed (header and records). The reader must return an error or events, never
// crash, hang or read out of bounds (run under -Db_sanitize=address,undefined to see the last).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "drain/ring_decoder.h"
#include "drain/ring_reader.h"
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
  testing::TempDir dir;
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

// Opens and drains a region until finished or an error; bounded so a bug cannot hang the test.
void Exercise(std::vector<std::uint64_t>& image) {
  auto reader = RingReader::OpenMemory(image.data(), image.size() * 8, DeadWriter());
  if (!reader.ok()) return;
  google::protobuf::RepeatedPtrField<v1::Event> events;
  for (int i = 0; i < 4; ++i) {
    auto stats = (*reader)->Drain(&events, 16);
    if (!stats.ok() || stats->finished) break;
  }
  (void)(*reader)->Counters();
}

TEST(RingFuzzTest, ValidRingDrainsCompletely) {
  std::vector<std::uint64_t> image = ValidRing();
  auto reader = RingReader::OpenMemory(image.data(), kRingBytes, DeadWriter());
  ASSERT_TRUE(reader.ok()) << reader.status();
  google::protobuf::RepeatedPtrField<v1::Event> events;
  auto stats = (*reader)->Drain(&events);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->finished);
  EXPECT_EQ(stats->invalid, 0u);
  EXPECT_GT(events.size(), 10);
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
    Exercise(image);
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
    Exercise(image);
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
    const std::string text(rng() % 200, 'x');
    v1::Event event;
    (void)DecodeRecord(record, text, &event);
  }
}

}  // namespace
}  // namespace vramscope::agent
