// CUPTI's driver view outside the application: the ring decoder's CUPTI_MEMORY records, the
// stats engine's CuptiStats (kept apart from the shim's figures), and the Chrome trace's CUPTI
// counter track, from hand-made records and events.
#include <gtest/gtest.h>

#include <string>

#include "drain/ring_decoder.h"
#include "run/chrome_trace.h"
#include "stats/stats_engine.h"
#include "vramscope/ring.h"

namespace vramscope {
namespace {

constexpr std::uint32_t kDevice = 3;  // CUPTI_ACTIVITY_MEMORY_KIND_DEVICE
constexpr std::uint32_t kPinned = 2;  // CUPTI_ACTIVITY_MEMORY_KIND_PINNED

v1::Event Cupti(std::uint64_t time_ns, v1::CuptiMemoryEvent::Operation operation,
                std::uint64_t address, std::uint64_t bytes, std::uint32_t kind = kDevice,
                std::uint32_t device = 0) {
  v1::Event event;
  event.set_time_ns(time_ns);
  event.set_device(device);
  v1::CuptiMemoryEvent* cupti = event.mutable_cupti_memory();
  cupti->set_operation(operation);
  cupti->set_address(address);
  cupti->set_bytes(bytes);
  cupti->set_memory_kind(kind);
  return event;
}

v1::Event Dropped(std::uint64_t records) {
  v1::Event event;
  event.set_time_ns(100);
  event.mutable_cupti_memory()->set_operation(v1::CuptiMemoryEvent::OPERATION_RECORDS_DROPPED);
  event.mutable_cupti_memory()->set_records_dropped(records);
  return event;
}

TEST(CuptiDecoderTest, MemoryAndDroppedRecords) {
  vramscope_ring_record record{};
  record.kind = VRAMSCOPE_RING_KIND_CUPTI_MEMORY;
  record.time_ns = 42;
  record.sub = VRAMSCOPE_RING_CUPTI_RELEASE;
  record.payload.cupti = {0x1000, 4096, 0x7000, 9, kDevice, 1};
  v1::Event event;
  ASSERT_TRUE(agent::DecodeRecord(record, {}, &event).ok());
  EXPECT_EQ(event.cupti_memory().operation(), v1::CuptiMemoryEvent::OPERATION_RELEASE);
  EXPECT_EQ(event.cupti_memory().address(), 0x1000u);
  EXPECT_EQ(event.cupti_memory().bytes(), 4096u);
  EXPECT_EQ(event.cupti_memory().pool_address(), 0x7000u);
  EXPECT_EQ(event.cupti_memory().stream(), 9u);
  EXPECT_EQ(event.cupti_memory().pool_type(), 1u);

  record.sub = VRAMSCOPE_RING_CUPTI_RECORDS_DROPPED;
  record.payload.cupti = {0, 17, 0, 0, 0, 0};
  ASSERT_TRUE(agent::DecodeRecord(record, {}, &event).ok());
  EXPECT_EQ(event.cupti_memory().operation(), v1::CuptiMemoryEvent::OPERATION_RECORDS_DROPPED);
  EXPECT_EQ(event.cupti_memory().records_dropped(), 17u);

  record.sub = VRAMSCOPE_RING_CUPTI_LIMIT;
  EXPECT_FALSE(agent::DecodeRecord(record, {}, &event).ok());
}

TEST(CuptiStatsTest, DriverViewIsSeparateFromTheShimsFigures) {
  collector::ProcessStatsEngine engine;
  engine.Add(Cupti(10, v1::CuptiMemoryEvent::OPERATION_ALLOCATION, 0x1000, 2 << 20));
  engine.Add(Cupti(20, v1::CuptiMemoryEvent::OPERATION_ALLOCATION, 0x9000, 1 << 20));
  engine.Add(Cupti(25, v1::CuptiMemoryEvent::OPERATION_ALLOCATION, 0x5000, 4096, kPinned));
  // A release without bytes takes them from its allocation.
  engine.Add(Cupti(30, v1::CuptiMemoryEvent::OPERATION_RELEASE, 0x1000, 0));
  // Released memory CUPTI never saw allocated (before it started): counted, not subtracted.
  engine.Add(Cupti(35, v1::CuptiMemoryEvent::OPERATION_RELEASE, 0xdead, 1 << 20));
  engine.Add(Dropped(5));
  const v1::Report report = engine.Report();
  ASSERT_EQ(report.devices_size(), 1);
  const v1::DeviceReport& d = report.devices(0);
  ASSERT_TRUE(d.has_cupti());
  EXPECT_EQ(d.cupti().peak_bytes(), 3u << 20);  // pinned host memory is not device memory
  EXPECT_EQ(d.cupti().current_bytes(), 1u << 20);
  EXPECT_EQ(d.cupti().alloc_count(), 3u);
  EXPECT_EQ(d.cupti().free_count(), 2u);
  EXPECT_EQ(d.cupti().dropped_records(), 5u);
  EXPECT_EQ(d.cupti().peak_bytes_by_memory_kind().at("device"), 3u << 20);
  EXPECT_EQ(d.cupti().peak_bytes_by_memory_kind().at("pinned"), 4096u);
  EXPECT_EQ(d.cupti().current_bytes_by_memory_kind().at("device"), 1u << 20);
  EXPECT_EQ(d.cupti().last_time_ns(), 100u);
  // None of it is the shim's.
  EXPECT_EQ(d.peak_reserved_bytes(), 0u);
  EXPECT_EQ(d.alloc_count(), 0u);
  EXPECT_EQ(d.dropped_records(), 0u);
}

TEST(CuptiStatsTest, AReusedAddressRetiresTheLostRelease) {
  collector::ProcessStatsEngine engine;
  engine.Add(Cupti(10, v1::CuptiMemoryEvent::OPERATION_ALLOCATION, 0x1000, 100));
  engine.Add(Cupti(20, v1::CuptiMemoryEvent::OPERATION_ALLOCATION, 0x1000, 300));
  const v1::DeviceReport d = engine.Report().devices(0);
  EXPECT_EQ(d.cupti().current_bytes(), 300u);
  EXPECT_EQ(d.cupti().peak_bytes(), 300u);
}

TEST(CuptiStatsTest, NoCuptiRecordsNoCuptiView) {
  collector::ProcessStatsEngine engine;
  v1::Event alloc;
  alloc.set_time_ns(1);
  alloc.mutable_alloc()->set_address(0x10);
  alloc.mutable_alloc()->set_requested_bytes(64);
  alloc.mutable_alloc()->set_allocated_bytes(64);
  alloc.mutable_alloc()->set_kind(v1::ALLOCATION_KIND_DRIVER);
  engine.Add(alloc);
  EXPECT_FALSE(engine.Report().devices(0).has_cupti());
}

TEST(CuptiTraceTest, CounterTrackFollowsDeviceBytes) {
  cli::ChromeTrace trace;
  trace.Add(7, Cupti(1000, v1::CuptiMemoryEvent::OPERATION_ALLOCATION, 0x1000, 2048));
  trace.Add(7, Cupti(2000, v1::CuptiMemoryEvent::OPERATION_ALLOCATION, 0x5000, 64, kPinned));
  trace.Add(7, Cupti(3000, v1::CuptiMemoryEvent::OPERATION_RELEASE, 0x1000, 2048));
  trace.Add(7, Dropped(4));
  const std::string json = trace.Json({});
  EXPECT_NE(
      json.find(R"("name":"cuda:0 CUPTI device bytes","pid":7,"ts":1.000,"args":{"bytes":2048})"),
      std::string::npos)
      << json;
  EXPECT_NE(
      json.find(R"("name":"cuda:0 CUPTI device bytes","pid":7,"ts":3.000,"args":{"bytes":0})"),
      std::string::npos)
      << json;
  EXPECT_EQ(json.find("\"ts\":2.000"), std::string::npos) << "pinned memory is not on the track";
  EXPECT_NE(json.find(R"("cat":"cupti","name":"CUPTI records dropped")"), std::string::npos)
      << json;
}

}  // namespace
}  // namespace vramscope
