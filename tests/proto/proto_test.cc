// The wire protocol: messages round-trip, and the Report's JSON form uses the proto field names.
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <string>

#include "vramscope/v1/collector.grpc.pb.h"
#include "vramscope/v1/events.pb.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope {
namespace {

TEST(ProtoTest, EventBatchRoundTrips) {
  v1::EventBatch batch;
  batch.mutable_process()->set_host("node7");
  batch.mutable_process()->set_pid(4242);
  batch.set_sequence(17);
  v1::Event* event = batch.add_events();
  event->set_time_ns(123456789);
  event->set_device(1);
  event->mutable_alloc()->set_address(0x7f0000000000);
  event->mutable_alloc()->set_requested_bytes(1000);
  event->mutable_alloc()->set_allocated_bytes(1024);
  event->mutable_alloc()->set_kind(v1::ALLOCATION_KIND_POOLED);
  v1::Event* oom = batch.add_events();
  oom->mutable_oom()->set_requested_bytes(uint64_t{1} << 40);
  oom->mutable_oom()->set_verdict(v1::OOM_VERDICT_FRAGMENTATION);

  std::string wire;
  ASSERT_TRUE(batch.SerializeToString(&wire));
  v1::EventBatch parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  ASSERT_EQ(parsed.events_size(), 2);
  EXPECT_EQ(parsed.sequence(), 17u);
  EXPECT_EQ(parsed.events(0).payload_case(), v1::Event::kAlloc);
  EXPECT_EQ(parsed.events(0).alloc().allocated_bytes(), 1024u);
  EXPECT_EQ(parsed.events(1).oom().verdict(), v1::OOM_VERDICT_FRAGMENTATION);
}

TEST(ProtoTest, MalformedBytesAreRejectedNotCrashed) {
  const std::string garbage = "\xff\xff\xff\xff\x0f\x12\x80";
  v1::EventBatch parsed;
  EXPECT_FALSE(parsed.ParseFromString(garbage));
}

TEST(ProtoTest, ReportJsonUsesSnakeCaseFieldNames) {
  v1::Report report;
  report.mutable_process()->set_pid(7);
  v1::DeviceReport* device = report.add_devices();
  device->set_peak_reserved_bytes(2048);
  device->set_reserved_over_allocated(1.25);
  device->mutable_fragmentation()->set_largest_free_block_bytes(512);

  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(report, &json, options).ok());
  EXPECT_NE(json.find("\"peak_reserved_bytes\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"reserved_over_allocated\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"largest_free_block_bytes\""), std::string::npos) << json;
  EXPECT_EQ(json.find("peakReservedBytes"), std::string::npos) << json;

  v1::Report back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &back).ok());
  EXPECT_EQ(back.devices(0).peak_reserved_bytes(), 2048u);
}

TEST(ProtoTest, CollectorServiceHasItsFourMethods) {
  const auto* service = v1::IngestAck::descriptor()->file()->FindServiceByName("Collector");
  ASSERT_NE(service, nullptr);
  EXPECT_NE(service->FindMethodByName("Ingest"), nullptr);
  EXPECT_TRUE(service->FindMethodByName("Ingest")->client_streaming());
  EXPECT_NE(service->FindMethodByName("Watch"), nullptr);
  EXPECT_TRUE(service->FindMethodByName("Watch")->server_streaming());
  EXPECT_NE(service->FindMethodByName("GetReport"), nullptr);
  EXPECT_NE(service->FindMethodByName("ListProcesses"), nullptr);
}

}  // namespace
}  // namespace vramscope
