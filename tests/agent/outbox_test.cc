// The agent's Outbox without a network: sequence numbers, acknowledgements, resends after a
// rewind, the memory bound, drops reported as DropEvents, renumbering, and the spool.
#include "vramscope/agent/outbox.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/collector/test_util.h"
#include "vramscope/agent/log.h"

namespace vramscope::agent {
namespace {

using ::vramscope::testing::Batch;
using ::vramscope::testing::Key;
using ::vramscope::testing::TempDir;

class OutboxTest : public ::testing::Test {
 protected:
  void SetUp() override { SetMinLogLevel(LogLevel::kError); }
};

TEST_F(OutboxTest, NumbersEachProcessFromOneAndSendsInOrder) {
  Outbox outbox(OutboxOptions{});
  outbox.SetConnected(true);
  ASSERT_TRUE(outbox.Add(Batch(Key(1), 0, 3)));
  ASSERT_TRUE(outbox.Add(Batch(Key(2), 0, 3)));
  ASSERT_TRUE(outbox.Add(Batch(Key(1), 0, 3)));
  std::vector<std::pair<uint32_t, uint64_t>> sent;
  while (auto batch = outbox.NextToSend(absl::ZeroDuration())) {
    sent.emplace_back(batch->process().pid(), batch->sequence());
  }
  EXPECT_THAT(sent, ::testing::ElementsAre(::testing::Pair(1, 1), ::testing::Pair(2, 1),
                                           ::testing::Pair(1, 2)));
  EXPECT_EQ(outbox.counters().batches_sent, 3u);
}

TEST_F(OutboxTest, AcksForgetAndARewindResendsTheRest) {
  Outbox outbox(OutboxOptions{});
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(outbox.Add(Batch(Key(1), 0, 2)));
  while (outbox.NextToSend(absl::ZeroDuration()) != nullptr) {
  }
  outbox.Ack(Key(1), 2);
  EXPECT_EQ(outbox.counters().batches_acked, 2u);
  EXPECT_EQ(outbox.counters().pending_batches, 2u);
  outbox.Rewind();  // a new stream
  auto third = outbox.NextToSend(absl::ZeroDuration());
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(third->sequence(), 3u);
  EXPECT_EQ(outbox.counters().batches_resent, 1u);
  outbox.Ack(Key(1), 4);
  EXPECT_TRUE(outbox.Empty());
  EXPECT_TRUE(outbox.WaitAllAcked(absl::ZeroDuration()));
  outbox.Ack(Key(1), 3);  // a late, stale acknowledgement changes nothing
  EXPECT_EQ(outbox.counters().batches_acked, 4u);
}

TEST_F(OutboxTest, InterruptWakesTheSenderUntilTheNextRewind) {
  Outbox outbox(OutboxOptions{});
  outbox.Interrupt();
  ASSERT_TRUE(outbox.Add(Batch(Key(1), 0, 1)));
  EXPECT_EQ(outbox.NextToSend(absl::Seconds(10)), nullptr);  // returns at once
  outbox.Rewind();
  EXPECT_NE(outbox.NextToSend(absl::ZeroDuration()), nullptr);
}

TEST_F(OutboxTest, OverTheMemoryBoundWithoutASpoolBatchesAreDroppedAndReported) {
  OutboxOptions options;
  options.max_memory_bytes = Batch(Key(1), 2, 50).ByteSizeLong() * 2;
  Outbox outbox(options);
  outbox.SetConnected(true);
  ASSERT_TRUE(outbox.Add(Batch(Key(1), 0, 50)));
  ASSERT_TRUE(outbox.Add(Batch(Key(1), 0, 50)));
  EXPECT_FALSE(outbox.Add(Batch(Key(1), 0, 50)));
  EXPECT_FALSE(outbox.Add(Batch(Key(1), 0, 50)));
  AgentCounters counters = outbox.counters();
  EXPECT_EQ(counters.batches_dropped, 2u);
  EXPECT_EQ(counters.events_dropped, 100u);
  while (outbox.NextToSend(absl::ZeroDuration()) != nullptr) {
  }
  outbox.Ack(Key(1), 2);
  ASSERT_TRUE(outbox.Add(Batch(Key(1), 0, 5)));
  auto next = outbox.NextToSend(absl::ZeroDuration());
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->sequence(), 3u);  // the dropped batches used no sequence numbers
  ASSERT_EQ(next->events_size(), 6);
  ASSERT_TRUE(next->events(0).has_drop());
  EXPECT_EQ(next->events(0).drop().dropped_records(), 100u);
}

TEST_F(OutboxTest, AnAckBeyondWhatWasSentRenumbersAfterIt) {
  Outbox outbox(OutboxOptions{});
  ASSERT_TRUE(outbox.Add(Batch(Key(1), 0, 1)));
  ASSERT_TRUE(outbox.Add(Batch(Key(1), 0, 1)));
  ASSERT_TRUE(outbox.Add(Batch(Key(2), 0, 1)));
  while (outbox.NextToSend(absl::ZeroDuration()) != nullptr) {
  }
  outbox.Ack(Key(1), 40);  // the collector holds 1..40 of process 1 from an earlier agent
  std::vector<std::pair<uint32_t, uint64_t>> resent;
  while (auto batch = outbox.NextToSend(absl::ZeroDuration())) {
    resent.emplace_back(batch->process().pid(), batch->sequence());
  }
  EXPECT_THAT(resent, ::testing::ElementsAre(::testing::Pair(1, 41), ::testing::Pair(1, 42),
                                             ::testing::Pair(2, 1)));
  EXPECT_EQ(outbox.counters().batches_renumbered, 2u);
  ASSERT_TRUE(outbox.Add(Batch(Key(1), 0, 1)));
  auto next = outbox.NextToSend(absl::ZeroDuration());
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->sequence(), 43u);
}

TEST_F(OutboxTest, SetStartContinuesAfterTheCollectorsSequence) {
  Outbox outbox(OutboxOptions{});
  outbox.SetStart(Key(1), 7);
  ASSERT_TRUE(outbox.Add(Batch(Key(1), 0, 1)));
  outbox.SetStart(Key(1), 100);  // too late: batches were numbered already
  auto next = outbox.NextToSend(absl::ZeroDuration());
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->sequence(), 8u);
  outbox.Ack(Key(1), 8);
  EXPECT_TRUE(outbox.Empty());
}

TEST_F(OutboxTest, SpoolsWhileDisconnectedAndReadsBack) {
  TempDir spool;
  std::ofstream(spool.path() + "/stale_1.batch") << "from an earlier run";
  OutboxOptions options;
  options.spool_dir = spool.path();
  Outbox outbox(options);
  EXPECT_FALSE(std::filesystem::exists(spool.path() + "/stale_1.batch"));
  const v1::EventBatch original = Batch(Key(1), 1, 20);
  ASSERT_TRUE(outbox.Add(original));
  EXPECT_EQ(outbox.counters().batches_spooled, 1u);
  EXPECT_EQ(outbox.counters().memory_bytes, 0u);
  auto back = outbox.NextToSend(absl::ZeroDuration());
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->SerializeAsString(), original.SerializeAsString());
  outbox.Ack(Key(1), 1);
  EXPECT_TRUE(std::filesystem::is_empty(spool.path()));
}

}  // namespace
}  // namespace vramscope::agent
