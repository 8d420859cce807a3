// The collector's gRPC service, served in process on port 0: acknowledgements and duplicates over
// a real stream, errors the client sees (gap, full disk, oversized and malformed messages) with
// the server staying up and nothing stored lost, Watch, GetReport and ListProcesses.
#include "vramscope/collector/service.h"

#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "tests/collector/test_util.h"
#include "vramscope/collector/collector.h"
#include "vramscope/log.h"
#include "vramscope/v1/collector.grpc.pb.h"

namespace vramscope::collector {
namespace {

using ::testing::HasSubstr;
using ::vramscope::testing::Batch;
using ::vramscope::testing::Key;
using ::vramscope::testing::TempDir;

class ServiceTest : public ::testing::Test {
 protected:
  void Start(CollectorOptions options = {}, int max_message_bytes = 1 << 20) {
    SetMinLogLevel(LogLevel::kError);
    options.data_dir = dir_.path();
    options.fsync = false;
    collector_ = *Collector::Open(options);
    ServerOptions server_options;
    server_options.listen = "127.0.0.1:0";
    server_options.max_message_bytes = max_message_bytes;
    absl::StatusOr<std::unique_ptr<CollectorServer>> server =
        CollectorServer::Start(collector_.get(), server_options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 << 20);
    channel_ = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                         grpc::InsecureChannelCredentials(), args);
    stub_ = v1::Collector::NewStub(channel_);
  }

  // Sends `batches` on one Ingest stream, each after the answer to the one before; returns the
  // answers and the final status.
  grpc::Status SendAcks(const std::vector<v1::EventBatch>& batches,
                        std::vector<v1::IngestAck>* acks) {
    grpc::ClientContext context;
    auto stream = stub_->Ingest(&context);
    for (const v1::EventBatch& batch : batches) {
      if (!stream->Write(batch)) break;
      v1::IngestAck ack;
      if (!stream->Read(&ack)) break;
      acks->push_back(ack);
    }
    stream->WritesDone();
    v1::IngestAck ignored;
    while (stream->Read(&ignored)) {
    }
    return stream->Finish();
  }

  // The same, keeping only the acknowledged sequences.
  grpc::Status Send(const std::vector<v1::EventBatch>& batches, std::vector<uint64_t>* acks) {
    std::vector<v1::IngestAck> answers;
    grpc::Status status = SendAcks(batches, &answers);
    for (const v1::IngestAck& ack : answers) acks->push_back(ack.acked_sequence());
    return status;
  }

  uint64_t Events(uint32_t pid) {
    grpc::ClientContext context;
    v1::GetReportRequest request;
    *request.mutable_process() = Key(pid);
    v1::Report report;
    grpc::Status status = stub_->GetReport(&context, request, &report);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return report.events();
  }

  TempDir dir_;
  std::unique_ptr<Collector> collector_;
  std::unique_ptr<CollectorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Collector::Stub> stub_;
};

TEST(WatchIntervalTest, ClampedTo50msAnd60s) {
  EXPECT_EQ(ClampWatchInterval(0), absl::Seconds(1));
  EXPECT_EQ(ClampWatchInterval(1), absl::Milliseconds(50));
  EXPECT_EQ(ClampWatchInterval(250), absl::Milliseconds(250));
  EXPECT_EQ(ClampWatchInterval(3600000), absl::Seconds(60));
}

TEST_F(ServiceTest, AcksEachBatchAndDropsResends) {
  Start();
  std::vector<uint64_t> acks;
  grpc::Status status =
      Send({Batch(Key(1), 1, 10), Batch(Key(1), 2, 10), Batch(Key(1), 1, 10), Batch(Key(1), 3, 10)},
           &acks);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(acks, ::testing::ElementsAre(1, 2, 2, 3));
  EXPECT_EQ(Events(1), 30u);
}

TEST_F(ServiceTest, GapEndsTheStreamWithFailedPrecondition) {
  Start();
  std::vector<uint64_t> acks;
  grpc::Status status = Send({Batch(Key(2), 1, 5), Batch(Key(2), 3, 5)}, &acks);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("resend from sequence 2"));
  EXPECT_THAT(acks, ::testing::ElementsAre(1));
  acks.clear();
  EXPECT_TRUE(Send({Batch(Key(2), 2, 5)}, &acks).ok());
  EXPECT_EQ(Events(2), 10u);
}

TEST_F(ServiceTest, FullDiskIsResourceExhaustedAndNotAcked) {
  CollectorOptions options;
  options.max_disk_bytes = 4096;
  Start(options);
  std::vector<uint64_t> acks;
  grpc::Status status = Send({Batch(Key(3), 1, 20), Batch(Key(3), 2, 200)}, &acks);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("--max-disk-bytes=4096"));
  EXPECT_THAT(acks, ::testing::ElementsAre(1));
  EXPECT_EQ(Events(3), 20u);
}

TEST_F(ServiceTest, OversizedMessageIsRefusedAndTheServerStaysUp) {
  Start({}, /*max_message_bytes=*/64 << 10);
  std::vector<uint64_t> acks;
  ASSERT_TRUE(Send({Batch(Key(4), 1, 100)}, &acks).ok());
  acks.clear();
  grpc::Status status = Send({Batch(Key(4), 2, 20000)}, &acks);  // about 600 KB
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("larger than max"));
  EXPECT_TRUE(acks.empty());
  acks.clear();
  EXPECT_TRUE(Send({Batch(Key(4), 2, 100)}, &acks).ok());
  EXPECT_EQ(Events(4), 200u);
}

TEST_F(ServiceTest, MalformedBytesOnTheWireAreAnErrorAndTheServerStaysUp) {
  Start();
  std::vector<uint64_t> acks;
  ASSERT_TRUE(Send({Batch(Key(5), 1, 10)}, &acks).ok());

  grpc::GenericStub generic(channel_);
  grpc::ClientContext context;
  grpc::CompletionQueue cq;
  // Field 1 (process) as a length-delimited field claiming 100 bytes that are not there.
  const std::string garbage = "\x0a\x64\xff\xff\xff\x00\x01";
  auto call = generic.PrepareCall(&context, "/vramscope.v1.Collector/Ingest", &cq);
  void* tag = nullptr;
  bool ok = false;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::Slice slice(garbage);
  grpc::ByteBuffer buffer(&slice, 1);
  call->Write(buffer, reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  while (cq.Next(&tag, &ok) && tag != reinterpret_cast<void*>(4)) {
  }
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("not a vramscope.v1.EventBatch"));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }

  acks.clear();
  EXPECT_TRUE(Send({Batch(Key(5), 2, 10)}, &acks).ok());
  EXPECT_EQ(Events(5), 20u);
}

TEST_F(ServiceTest, AnInvalidBatchIsRefusedAloneAndTheStreamGoesOn) {
  Start();
  // Batch 2 of process 40 carries an NVTX domain that is not UTF-8 (as an agent that did not
  // escape it sent), a batch claims pid 0, process 42's first batch a command line that is not
  // UTF-8: each is answered on its own, everything else on the stream is stored.
  v1::EventBatch bad_nvtx = Batch(Key(40), 2, 4);
  v1::Event* push = bad_nvtx.add_events();
  push->mutable_nvtx_push()->set_range_id(1);
  push->mutable_nvtx_push()->set_domain("\xFF");
  v1::EventBatch bad_start = Batch(Key(42), 1, 3);
  bad_start.mutable_events(0)->mutable_process_start()->add_command_line("out\xE9.txt");
  std::vector<v1::IngestAck> acks;
  grpc::Status status =
      SendAcks({Batch(Key(40), 1, 10), bad_nvtx, Batch(Key(40), 3, 10), Batch(Key(0), 1, 5),
                Batch(Key(41), 1, 4), bad_start, Batch(Key(42), 2, 6)},
               &acks);
  EXPECT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(acks.size(), 7u);
  EXPECT_FALSE(acks[0].rejected());
  EXPECT_TRUE(acks[1].rejected());
  EXPECT_EQ(acks[1].rejected_sequence(), 2u);
  EXPECT_EQ(acks[1].acked_sequence(), 2u);  // consumed: batch 3 follows without a gap
  EXPECT_THAT(acks[1].reject_reason(), HasSubstr("vramscope.v1.NvtxPushEvent.domain"));
  EXPECT_EQ(acks[2].acked_sequence(), 3u);
  EXPECT_TRUE(acks[3].rejected());
  EXPECT_EQ(acks[3].acked_sequence(), 0u);
  EXPECT_THAT(acks[3].reject_reason(), HasSubstr("pid 0"));
  EXPECT_EQ(acks[4].acked_sequence(), 1u);
  EXPECT_TRUE(acks[5].rejected());
  EXPECT_THAT(acks[5].reject_reason(), HasSubstr("\"out\\xE9.txt\""));
  EXPECT_EQ(acks[6].acked_sequence(), 2u);
  EXPECT_FALSE(acks[6].rejected());

  EXPECT_EQ(Events(41), 4u);
  grpc::ClientContext context;
  v1::GetReportRequest request;
  *request.mutable_process() = Key(40);
  v1::Report report;
  ASSERT_TRUE(stub_->GetReport(&context, request, &report).ok());
  ASSERT_EQ(report.devices_size(), 1);
  EXPECT_EQ(report.devices(0).alloc_count(), 19u);     // batches 1 and 3
  EXPECT_EQ(report.devices(0).dropped_records(), 5u);  // batch 2, counted as lost
  EXPECT_EQ(collector_->batches_refused(), 3u);

  // Resent after a reconnect (its rejection lost): judged again, refused again, stored once.
  acks.clear();
  ASSERT_TRUE(SendAcks({bad_nvtx}, &acks).ok());
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_TRUE(acks[0].rejected());
  EXPECT_EQ(acks[0].acked_sequence(), 3u);
  grpc::ClientContext again_context;
  ASSERT_TRUE(stub_->GetReport(&again_context, request, &report).ok());
  EXPECT_EQ(report.devices(0).dropped_records(), 5u);
}

TEST_F(ServiceTest, WatchStreamsUpdatesAtTheInterval) {
  Start();
  std::vector<uint64_t> acks;
  ASSERT_TRUE(Send({Batch(Key(6), 1, 10)}, &acks).ok());
  grpc::ClientContext context;
  v1::WatchRequest request;
  request.set_interval_ms(50);
  auto reader = stub_->Watch(&context, request);
  v1::StatsUpdate first;
  v1::StatsUpdate second;
  ASSERT_TRUE(reader->Read(&first));
  ASSERT_TRUE(Send({Batch(Key(6), 2, 10)}, &acks).ok());
  // Updates keep coming; one of the next ones shows the second batch.
  bool seen = false;
  for (int i = 0; i < 100 && !seen; ++i) {
    ASSERT_TRUE(reader->Read(&second));
    ASSERT_EQ(second.processes_size(), 1);
    seen = second.processes(0).devices_size() == 1 &&
           second.processes(0).devices(0).peak_reserved_bytes() == (2u << 20);
  }
  EXPECT_TRUE(seen);
  EXPECT_GE(second.time_ns(), first.time_ns());
  EXPECT_THAT(first.processes(0).command_line(), ::testing::ElementsAre("./app", "--steps=3"));
  context.TryCancel();
  while (reader->Read(&second)) {
  }
  reader->Finish();
}

// Threads of this process (server and client share it).
size_t Threads() {
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    static_cast<void>(entry);
    ++n;
  }
  return n;
}

TEST_F(ServiceTest, TwoHundredFiftyWatchersDoNotTakeAThreadEach) {
  Start();
  std::vector<uint64_t> acks;
  ASSERT_TRUE(Send({Batch(Key(6), 1, 10)}, &acks).ok());
  const size_t before = Threads();
  constexpr int kWatchers = 250;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::StatsUpdate>>> readers;
  for (int i = 0; i < kWatchers; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    v1::WatchRequest request;
    request.set_interval_ms(50);
    readers.push_back(stub_->Watch(contexts.back().get(), request));
  }
  // Every watcher gets its first update and then more at its interval, all open at once.
  for (int round = 0; round < 3; ++round) {
    for (auto& reader : readers) {
      v1::StatsUpdate update;
      ASSERT_TRUE(reader->Read(&update));
      ASSERT_EQ(update.processes_size(), 1);
    }
  }
  EXPECT_EQ(server_->service().watchers(), static_cast<size_t>(kWatchers));
  const size_t during = Threads();
  // A thread per stream would add 250; gRPC's callback pool and the fan-out thread are a few.
  EXPECT_LT(during, before + 50) << "threads before " << before << ", with " << kWatchers
                                 << " watchers " << during;
  for (auto& context : contexts) context->TryCancel();
  for (auto& reader : readers) {
    v1::StatsUpdate update;
    while (reader->Read(&update)) {
    }
    reader->Finish();
  }
}

TEST_F(ServiceTest, ListProcessesAndGetReport) {
  Start();
  std::vector<uint64_t> acks;
  ASSERT_TRUE(Send({Batch(Key(7), 1, 3), Batch(Key(8), 1, 4)}, &acks).ok());
  grpc::ClientContext context;
  v1::ListProcessesResponse list;
  ASSERT_TRUE(stub_->ListProcesses(&context, v1::ListProcessesRequest(), &list).ok());
  ASSERT_EQ(list.processes_size(), 2);
  EXPECT_EQ(list.processes(0).events(), 3u);
  EXPECT_EQ(list.processes(1).events(), 4u);

  grpc::ClientContext missing_context;
  v1::GetReportRequest missing;
  *missing.mutable_process() = Key(99);
  v1::Report report;
  grpc::Status status = stub_->GetReport(&missing_context, missing, &report);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("node1/99/"));
}

}  // namespace
}  // namespace vramscope::collector
