// What the collector accepts on Ingest (vramscope/collector/batch_check.h) and how it records a
// refused batch (Collector::Refuse): one bad batch is told apart from bytes that are no batch, is
// refused with a reason naming the field, and leaves no gap in its process's sequence, also
// across a restart.
#include "vramscope/collector/batch_check.h"

#include <gmock/gmock.h>
#include <google/protobuf/arena.h>
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "tests/collector/test_util.h"
#include "vramscope/collector/collector.h"
#include "vramscope/log.h"
#include "vramscope/utf8.h"

namespace vramscope::collector {
namespace {

using ::testing::HasSubstr;
using ::vramscope::testing::Batch;
using ::vramscope::testing::Key;
using ::vramscope::testing::TempDir;

// Batch 1 of `key` whose command line holds a file name that is not UTF-8, as a program run on
// `out\xE9.txt` (Latin-1) has.
v1::EventBatch HostileStart(const v1::ProcessKey& key, int events) {
  v1::EventBatch batch = Batch(key, 1, events);
  batch.mutable_events(0)->mutable_process_start()->add_command_line("out\xE9.txt");
  return batch;
}

// Batch `sequence` of `key` with an NVTX range whose domain is not UTF-8, as its last event.
v1::EventBatch HostileNvtx(const v1::ProcessKey& key, uint64_t sequence, int events) {
  v1::EventBatch batch = Batch(key, sequence, events - 1);
  v1::Event* push = batch.add_events();
  push->mutable_nvtx_push()->set_range_id(1);
  push->mutable_nvtx_push()->set_name("step");
  push->mutable_nvtx_push()->set_domain("\xFF\xFE");
  return batch;
}

// Serialises a batch the way an older agent did: protobuf writes invalid strings as they are
// (it only logs), and its parser then refuses them.
std::string Wire(const v1::EventBatch& batch) { return batch.SerializeAsString(); }

class BatchCheckTest : public ::testing::Test {
 protected:
  void SetUp() override { SetMinLogLevel(LogLevel::kError); }
  google::protobuf::Arena arena_;
};

TEST_F(BatchCheckTest, AValidBatchIsParsed) {
  const v1::EventBatch batch = Batch(Key(10), 1, 5);
  IngestMessage message = CheckIngestMessage(Wire(batch), &arena_);
  ASSERT_EQ(message.kind, IngestMessage::Kind::kBatch) << message.reason;
  EXPECT_EQ(message.batch->SerializeAsString(), Wire(batch));
  EXPECT_TRUE(ValidateBatch(batch).ok());
}

TEST_F(BatchCheckTest, ACommandLineThatIsNotUtf8IsRefusedNamingTheField) {
  IngestMessage message = CheckIngestMessage(Wire(HostileStart(Key(11), 6)), &arena_);
  ASSERT_EQ(message.kind, IngestMessage::Kind::kRejected) << message.reason;
  EXPECT_TRUE(message.key_usable);
  EXPECT_EQ(message.process.SerializeAsString(), Key(11).SerializeAsString());
  EXPECT_EQ(message.sequence, 1u);
  EXPECT_EQ(message.events, 6u);
  EXPECT_THAT(message.reason, HasSubstr("vramscope.v1.ProcessStartEvent.command_line"));
  EXPECT_THAT(message.reason, HasSubstr("events[0].process_start.command_line[2]"));
  EXPECT_THAT(message.reason, HasSubstr("\"out\\xE9.txt\""));
  EXPECT_TRUE(IsValidUtf8(message.reason));

  message = CheckIngestMessage(Wire(HostileNvtx(Key(11), 4, 3)), &arena_);
  ASSERT_EQ(message.kind, IngestMessage::Kind::kRejected) << message.reason;
  EXPECT_EQ(message.sequence, 4u);
  EXPECT_EQ(message.events, 3u);
  EXPECT_THAT(message.reason, HasSubstr("vramscope.v1.NvtxPushEvent.domain (events[2]"));
}

TEST_F(BatchCheckTest, AKeyThatCannotBeFiledIsRefusedAndSaidSo) {
  IngestMessage message = CheckIngestMessage(Wire(Batch(Key(12, "node\xE9"), 2, 3)), &arena_);
  ASSERT_EQ(message.kind, IngestMessage::Kind::kRejected) << message.reason;
  EXPECT_FALSE(message.key_usable);
  EXPECT_EQ(message.process.host(), "node\\xE9");  // escaped: the acknowledgement carries it
  EXPECT_EQ(message.process.pid(), 12u);
  EXPECT_THAT(message.reason, HasSubstr("vramscope.v1.ProcessKey.host"));

  message = CheckIngestMessage(Wire(Batch(Key(0), 1, 3)), &arena_);
  ASSERT_EQ(message.kind, IngestMessage::Kind::kRejected) << message.reason;
  EXPECT_FALSE(message.key_usable);
  EXPECT_THAT(message.reason, HasSubstr("pid 0"));

  message = CheckIngestMessage(Wire(Batch(Key(13, std::string(300, 'h')), 1, 3)), &arena_);
  ASSERT_EQ(message.kind, IngestMessage::Kind::kRejected) << message.reason;
  EXPECT_FALSE(message.key_usable);
  EXPECT_THAT(message.reason, HasSubstr("longer than 255 bytes"));

  v1::EventBatch sequence0 = Batch(Key(14), 1, 3);
  sequence0.set_sequence(0);
  message = CheckIngestMessage(Wire(sequence0), &arena_);
  ASSERT_EQ(message.kind, IngestMessage::Kind::kRejected) << message.reason;
  EXPECT_TRUE(message.key_usable);
  EXPECT_THAT(message.reason, HasSubstr("sequence 0"));
}

TEST_F(BatchCheckTest, BytesThatAreNoBatchAreMalformed) {
  for (const std::string& bytes :
       {std::string("\x0a\x64\xff\xff\xff\x00\x01", 7), std::string("\xff\xff\xff\xff"),
        Wire(Batch(Key(15), 1, 5)).substr(0, 40)}) {
    IngestMessage message = CheckIngestMessage(bytes, &arena_);
    EXPECT_EQ(message.kind, IngestMessage::Kind::kMalformed);
    EXPECT_THAT(message.reason, HasSubstr("not a vramscope.v1.EventBatch"));
  }
}

TEST_F(BatchCheckTest, ValidateBatchChecksStringsOfBatchesBuiltInMemory) {
  absl::Status status = ValidateBatch(HostileNvtx(Key(16), 2, 4));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("vramscope.v1.NvtxPushEvent.domain (events[3]"));
}

// Random damage to valid and hostile batches: whatever the verdict, it holds together (a fuzzer
// in the small; a parsed batch passes every check, a refusal's text and key are UTF-8).
TEST_F(BatchCheckTest, VerdictsHoldForDamagedBytes) {
  std::mt19937 random(19);
  const std::string seeds[] = {Wire(Batch(Key(17), 1, 20)), Wire(HostileStart(Key(17), 20)),
                               Wire(HostileNvtx(Key(17), 3, 20))};
  int kinds[3] = {0, 0, 0};
  for (int i = 0; i < 3000; ++i) {
    std::string bytes = seeds[static_cast<size_t>(i) % 3];
    std::uniform_int_distribution<size_t> at(0, bytes.size() - 1);
    for (int flips = 1 + i % 3; flips > 0; --flips) {
      bytes[at(random)] = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(random));
    }
    arena_.Reset();
    IngestMessage message = CheckIngestMessage(bytes, &arena_);
    ++kinds[static_cast<int>(message.kind)];
    switch (message.kind) {
      case IngestMessage::Kind::kBatch:
        ASSERT_TRUE(ValidateBatch(*message.batch).ok());
        break;
      case IngestMessage::Kind::kRejected:
        ASSERT_TRUE(IsValidUtf8(message.reason));
        ASSERT_TRUE(IsValidUtf8(message.process.host()));
        // (An unusable key may pass once its host is escaped; a usable one always passes.)
        if (message.key_usable) {
          ASSERT_TRUE(ValidateProcessKey(message.process).ok());
        }
        break;
      case IngestMessage::Kind::kMalformed:
        ASSERT_TRUE(IsValidUtf8(message.reason));
        break;
    }
  }
  EXPECT_GT(kinds[0], 0);
  EXPECT_GT(kinds[1], 0);
  EXPECT_GT(kinds[2], 0);
}

class RefuseTest : public ::testing::Test {
 protected:
  void SetUp() override { SetMinLogLevel(LogLevel::kError); }
  std::unique_ptr<Collector> Open() {
    CollectorOptions options;
    options.data_dir = dir_.path();
    absl::StatusOr<std::unique_ptr<Collector>> collector = Collector::Open(options);
    EXPECT_TRUE(collector.ok()) << collector.status();
    return collector.ok() ? std::move(*collector) : nullptr;
  }
  // What CheckIngestMessage answers for a refused batch of `key` (a key sent as it is).
  static IngestMessage Refused(const v1::ProcessKey& key, uint64_t sequence, uint64_t events) {
    IngestMessage message;
    message.kind = IngestMessage::Kind::kRejected;
    message.process = key;
    message.key_usable = ValidateProcessKey(key).ok();
    message.sequence = sequence;
    message.events = events;
    message.reason = "refused in a test";
    return message;
  }
  TempDir dir_;
};

TEST_F(RefuseTest, ARefusedSequenceIsConsumedAndCountedAsDropped) {
  const v1::ProcessKey key = Key(20);
  {
    auto collector = Open();
    ASSERT_EQ(*collector->Ingest(Batch(key, 1, 10)), 1u);
    EXPECT_EQ(*collector->Refuse(Refused(key, 2, 7)), 2u);
    // The next batch follows without a gap.
    EXPECT_EQ(*collector->Ingest(Batch(key, 3, 10)), 3u);
    // A resend of the refused sequence is a duplicate; a gap is still a gap.
    EXPECT_EQ(*collector->Refuse(Refused(key, 2, 7)), 3u);
    EXPECT_EQ(collector->Refuse(Refused(key, 9, 7)).status().code(),
              absl::StatusCode::kFailedPrecondition);
    absl::StatusOr<v1::Report> report = collector->GetReport(key);
    ASSERT_TRUE(report.ok());
    ASSERT_EQ(report->devices_size(), 1);
    EXPECT_EQ(report->devices(0).dropped_records(), 7u);
    EXPECT_EQ(collector->batches_refused(), 3u);
  }
  // After a restart the log reads back whole and the numbering goes on.
  auto collector = Open();
  EXPECT_EQ(collector->StoredSequence(key), 3u);
  EXPECT_EQ(*collector->Ingest(Batch(key, 4, 10)), 4u);
  EXPECT_EQ(collector->GetReport(key)->devices(0).dropped_records(), 7u);
}

TEST_F(RefuseTest, AKeyThatCannotBeFiledStoresNothing) {
  auto collector = Open();
  EXPECT_EQ(*collector->Refuse(Refused(Key(0), 1, 5)), 0u);
  EXPECT_EQ(*collector->Refuse(Refused(Key(21, "bad\xE9"), 1, 5)), 0u);
  // A host that is not UTF-8 reaches Refuse escaped (valid, but not the key that was sent): as
  // CheckIngestMessage answers it, nothing is filed under the escaped name either.
  v1::EventBatch latin1 = Batch(Key(24, "bad\xE9"), 1, 5);
  google::protobuf::Arena arena;
  const IngestMessage escaped = CheckIngestMessage(latin1.SerializeAsString(), &arena);
  ASSERT_EQ(escaped.kind, IngestMessage::Kind::kRejected);
  EXPECT_FALSE(escaped.key_usable);
  EXPECT_TRUE(ValidateProcessKey(escaped.process).ok()) << escaped.process.host();
  EXPECT_EQ(*collector->Refuse(escaped), 0u);
  // Sequence 0 (a batch with events that claimed to be a probe) stores nothing either.
  EXPECT_EQ(*collector->Refuse(Refused(Key(22), 0, 5)), 0u);
  EXPECT_EQ(collector->ListProcesses(true).processes_size(), 0);
  EXPECT_EQ(collector->Ingest(HostileStart(Key(23), 3)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(collector->ListProcesses(true).processes_size(), 0);
}

}  // namespace
}  // namespace vramscope::collector
