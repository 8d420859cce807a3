// The agent's Outbox without a network: sequence numbers, acknowledgements, resends after a
// rewind, the memory bound, drops reported as DropEvents, renumbering, the spool, and the replay
// of an earlier run's spool (damaged files, gaps, renumbering against the collector).
#include "vramscope/agent/outbox.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tests/collector/test_util.h"
#include "vramscope/log.h"

namespace vramscope::agent {
namespace {

using ::vramscope::testing::Batch;
using ::vramscope::testing::ExitBatch;
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

std::vector<std::string> SpoolFiles(const std::string& dir, const std::string& suffix = ".batch") {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix) {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// (pid, sequence) of everything NextToSend hands out now.
std::vector<std::pair<uint32_t, uint64_t>> SendAll(Outbox& outbox) {
  std::vector<std::pair<uint32_t, uint64_t>> sent;
  while (auto batch = outbox.NextToSend(absl::ZeroDuration())) {
    sent.emplace_back(batch->process().pid(), batch->sequence());
  }
  return sent;
}

TEST_F(OutboxTest, SpoolsEveryBatchBeforeTheCallbackAndReadsBack) {
  TempDir spool;
  OutboxOptions options;
  options.spool_dir = spool.path();
  Outbox outbox(options);
  outbox.SetConnected(true);  // connected or not: with a spool, every batch goes to disk first
  const v1::EventBatch original = Batch(Key(1), 1, 20);
  size_t files_in_callback = 0;
  ASSERT_TRUE(
      outbox.Add(original, 77, [&] { files_in_callback = SpoolFiles(spool.path()).size(); }));
  EXPECT_EQ(files_in_callback, 1u);
  EXPECT_EQ(outbox.counters().batches_spooled, 1u);
  EXPECT_GT(outbox.counters().memory_bytes, 0u);  // and a copy in memory for sending
  auto back = outbox.NextToSend(absl::ZeroDuration());
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->SerializeAsString(), original.SerializeAsString());
  outbox.Ack(Key(1), 1);
  EXPECT_TRUE(std::filesystem::is_empty(spool.path()));
  EXPECT_EQ(outbox.counters().spool_bytes, 0u);
  EXPECT_EQ(outbox.counters().memory_bytes, 0u);
}

TEST_F(OutboxTest, BeyondTheMemoryBoundSpooledBatchesAreReadBackFromDisk) {
  TempDir spool;
  OutboxOptions options;
  options.spool_dir = spool.path();
  options.max_memory_bytes = 0;
  Outbox outbox(options);
  const v1::EventBatch original = Batch(Key(1), 1, 20);
  ASSERT_TRUE(outbox.Add(original));
  EXPECT_EQ(outbox.counters().memory_bytes, 0u);
  auto back = outbox.NextToSend(absl::ZeroDuration());
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->SerializeAsString(), original.SerializeAsString());
}

TEST_F(OutboxTest, AFullSpoolDropsBeforeNumberingAndReportsTheLoss) {
  TempDir spool;
  OutboxOptions options;
  options.spool_dir = spool.path();
  options.max_spool_bytes = Batch(Key(1), 2, 50).ByteSizeLong() + 10;  // room for one batch
  Outbox outbox(options);
  int callbacks = 0;
  ASSERT_TRUE(outbox.Add(Batch(Key(1), 0, 50), 0, [&] { ++callbacks; }));
  // Memory has room, but a batch that is not on disk would be lost with the agent: dropped.
  EXPECT_FALSE(outbox.Add(Batch(Key(1), 0, 50), 0, [&] { ++callbacks; }));
  EXPECT_EQ(callbacks, 2);  // the ring lets go of dropped events too: they are counted
  AgentCounters counters = outbox.counters();
  EXPECT_EQ(counters.batches_dropped, 1u);
  EXPECT_EQ(counters.events_dropped, 50u);
  EXPECT_EQ(SpoolFiles(spool.path()).size(), 1u);
  EXPECT_THAT(SendAll(outbox), ::testing::ElementsAre(::testing::Pair(1, 1)));
  outbox.Ack(Key(1), 1);
  ASSERT_TRUE(outbox.Add(Batch(Key(1), 0, 5)));
  auto next = outbox.NextToSend(absl::ZeroDuration());
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->sequence(), 2u);  // no gap
  ASSERT_TRUE(next->events(0).has_drop());
  EXPECT_EQ(next->events(0).drop().dropped_records(), 50u);
}

TEST_F(OutboxTest, ANewOutboxReplaysTheSpoolOfAnEarlierRun) {
  TempDir spool;
  OutboxOptions options;
  options.spool_dir = spool.path();
  std::vector<std::string> payloads;
  {
    Outbox first(options);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(first.Add(Batch(Key(1), 0, 10), 100 * (i + 1)));
    ASSERT_TRUE(first.Add(Batch(Key(2), 0, 10), 40));
    v1::EventBatch exit = ExitBatch(Key(2), 0, 3);
    ASSERT_TRUE(first.Add(exit, 41));
    while (auto batch = first.NextToSend(absl::ZeroDuration())) {
      payloads.push_back(batch->SerializeAsString());
    }
    first.Ack(Key(1), 1);
    payloads.erase(payloads.begin());
    // Destroyed without the rest acknowledged (SIGKILL leaves the same files behind).
  }
  ASSERT_EQ(SpoolFiles(spool.path()).size(), 4u);
  Outbox second(options);
  EXPECT_EQ(second.counters().batches_replayed, 4u);
  EXPECT_EQ(second.counters().pending_batches, 4u);
  std::vector<std::string> replayed;
  while (auto batch = second.NextToSend(absl::ZeroDuration())) {
    replayed.push_back(batch->SerializeAsString());
  }
  // Same bytes, same processes and sequences (the collector drops any it already holds).
  EXPECT_EQ(replayed, payloads);
  std::optional<Outbox::Replayed> one = second.replayed(Key(1));
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->last_sequence, 3u);
  EXPECT_EQ(one->ring_end, 300u);
  EXPECT_FALSE(one->has_exit);
  ASSERT_TRUE(second.replayed(Key(2)).has_value());
  EXPECT_TRUE(second.replayed(Key(2))->has_exit);
  EXPECT_FALSE(second.replayed(Key(3)).has_value());
  // New batches follow the highest replayed sequence, and the collector's if it holds more.
  second.SetStart(Key(1), 2);
  ASSERT_TRUE(second.Add(Batch(Key(1), 0, 10)));
  second.SetStart(Key(2), 5);
  ASSERT_TRUE(second.Add(Batch(Key(2), 0, 10)));
  EXPECT_THAT(SendAll(second),
              ::testing::ElementsAre(::testing::Pair(1, 4), ::testing::Pair(2, 6)));
  second.Ack(Key(1), 4);
  second.Ack(Key(2), 6);
  EXPECT_TRUE(second.Empty());
  EXPECT_TRUE(SpoolFiles(spool.path()).empty());
}

TEST_F(OutboxTest, ReplayBeyondTheMemoryBoundReadsTheFilesWhenSending) {
  TempDir spool;
  OutboxOptions options;
  options.spool_dir = spool.path();
  std::vector<std::string> payloads;
  {
    Outbox first(options);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(first.Add(Batch(Key(1), 0, 10)));
    while (auto batch = first.NextToSend(absl::ZeroDuration())) {
      payloads.push_back(batch->SerializeAsString());
    }
  }
  options.max_memory_bytes = 0;
  Outbox second(options);
  EXPECT_EQ(second.counters().batches_replayed, 3u);
  EXPECT_EQ(second.counters().memory_bytes, 0u);
  std::vector<std::string> replayed;
  while (auto batch = second.NextToSend(absl::ZeroDuration())) {
    replayed.push_back(batch->SerializeAsString());
  }
  EXPECT_EQ(replayed, payloads);
}

TEST_F(OutboxTest, DamagedSpoolFilesAreSetAsideWarnedCountedAndLeaveNoGap) {
  TempDir spool;
  OutboxOptions options;
  options.spool_dir = spool.path();
  {
    Outbox first(options);
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(first.Add(Batch(Key(1), 0, 10)));
  }
  std::vector<std::string> files = SpoolFiles(spool.path());
  ASSERT_EQ(files.size(), 4u);
  // Sorted by name: sequences 1..4. Truncate 2, overwrite 3 with garbage; add a stray file
  // and an unfinished temporary one.
  std::filesystem::resize_file(files[1], std::filesystem::file_size(files[1]) - 7);
  std::ofstream(files[2], std::ios::trunc) << std::string(300, 'g');  // garbage
  std::ofstream(spool.path() + "/stray.batch") << "from somewhere else";
  const std::string temp = files[3] + ".tmp";
  std::filesystem::copy_file(files[3], temp);

  SetMinLogLevel(LogLevel::kWarning);
  ::testing::internal::CaptureStderr();
  auto second = std::make_unique<Outbox>(options);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, ::testing::HasSubstr(files[1] + " of an earlier run is unusable (truncated"));
  EXPECT_THAT(log, ::testing::HasSubstr(files[2] + " of an earlier run is unusable (not a "
                                                   "vramscope spool file"));
  EXPECT_THAT(log, ::testing::HasSubstr("stray.batch of an earlier run is unusable"));
  AgentCounters counters = second->counters();
  EXPECT_EQ(counters.spool_files_rejected, 3u);
  EXPECT_EQ(counters.batches_replayed, 2u);
  EXPECT_TRUE(std::filesystem::exists(files[1] + ".corrupt"));
  EXPECT_TRUE(std::filesystem::exists(spool.path() + "/stray.batch.corrupt"));
  EXPECT_FALSE(std::filesystem::exists(temp));
  // Sequences 1..4 all go out; 2 and 3 as DropEvents for their 10 events each.
  std::vector<std::shared_ptr<const v1::EventBatch>> sent;
  while (auto batch = second->NextToSend(absl::ZeroDuration())) sent.push_back(batch);
  ASSERT_EQ(sent.size(), 4u);
  for (size_t i = 0; i < sent.size(); ++i) EXPECT_EQ(sent[i]->sequence(), i + 1);
  EXPECT_EQ(sent[0]->events_size(), 10);
  for (size_t i : {1, 2}) {
    ASSERT_EQ(sent[i]->events_size(), 1);
    EXPECT_EQ(sent[i]->events(0).drop().dropped_records(), 10u);
    EXPECT_EQ(sent[i]->process().SerializeAsString(), Key(1).SerializeAsString());
  }
  EXPECT_EQ(sent[3]->events_size(), 10);
  // The stand-ins are spooled too: a second restart still reports the loss, without warnings.
  second.reset();
  ::testing::internal::CaptureStderr();
  Outbox third(options);
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("unusable"), std::string::npos);
  EXPECT_EQ(third.counters().batches_replayed, 4u);
  EXPECT_EQ(third.counters().spool_files_rejected, 0u);
}

TEST_F(OutboxTest, ReplayedBatchesAreRenumberedWhenTheCollectorHoldsLess) {
  TempDir spool;
  OutboxOptions options;
  options.spool_dir = spool.path();
  {
    Outbox first(options);
    first.SetStart(Key(1), 9);  // the collector held 1..9 then
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(first.Add(Batch(Key(1), 0, 10)));
  }
  {
    Outbox second(options);
    second.SetStart(Key(1), 0);  // a collector that holds nothing of it (its data was lost)
    EXPECT_THAT(SendAll(second),
                ::testing::ElementsAre(::testing::Pair(1, 1), ::testing::Pair(1, 2)));
    EXPECT_EQ(second.counters().batches_renumbered, 2u);
    ASSERT_TRUE(second.Add(Batch(Key(1), 0, 10)));
    EXPECT_THAT(SendAll(second), ::testing::ElementsAre(::testing::Pair(1, 3)));
  }
  // The files carry the new numbers.
  Outbox third(options);
  EXPECT_EQ(third.counters().spool_files_rejected, 0u);
  EXPECT_THAT(SendAll(third), ::testing::ElementsAre(::testing::Pair(1, 1), ::testing::Pair(1, 2),
                                                     ::testing::Pair(1, 3)));
}

TEST_F(OutboxTest, ARejectedBatchIsQuarantinedInTheSpoolAndTheRestFlows) {
  TempDir spool;
  OutboxOptions options;
  options.spool_dir = spool.path();
  {
    Outbox outbox(options);
    ASSERT_TRUE(outbox.Add(Batch(Key(1), 0, 3)));  // 1/1
    ASSERT_TRUE(outbox.Add(Batch(Key(1), 0, 4)));  // 1/2: the collector will refuse it
    ASSERT_TRUE(outbox.Add(Batch(Key(2), 0, 5)));  // 2/1
    ASSERT_TRUE(outbox.Add(Batch(Key(1), 0, 6)));  // 1/3
    ASSERT_NE(outbox.NextToSend(absl::ZeroDuration()), nullptr);
    ASSERT_NE(outbox.NextToSend(absl::ZeroDuration()), nullptr);
    // As the uplink does it: the rejection first, then the acknowledgement covering it.
    outbox.Reject(Key(1), 2, "string field x is not valid UTF-8");
    outbox.Ack(Key(1), 2);
    outbox.Reject(Key(1), 2, "again");  // no longer pending: nothing happens
    AgentCounters counters = outbox.counters();
    EXPECT_EQ(counters.batches_rejected, 1u);
    EXPECT_EQ(counters.events_rejected, 4u);
    EXPECT_EQ(counters.processes_rejected, 1u);
    EXPECT_EQ(counters.batches_acked, 1u);
    EXPECT_EQ(counters.pending_batches, 2u);
    EXPECT_EQ(outbox.first_reject_reason(), "string field x is not valid UTF-8");
    // The sender goes on with what it had not written yet, the refused batch is never resent.
    std::vector<std::pair<uint32_t, uint64_t>> sent;
    while (auto batch = outbox.NextToSend(absl::ZeroDuration())) {
      sent.emplace_back(batch->process().pid(), batch->sequence());
    }
    EXPECT_THAT(sent, ::testing::ElementsAre(::testing::Pair(2, 1), ::testing::Pair(1, 3)));
    outbox.Rewind();
    sent.clear();
    while (auto batch = outbox.NextToSend(absl::ZeroDuration())) {
      sent.emplace_back(batch->process().pid(), batch->sequence());
    }
    EXPECT_THAT(sent, ::testing::ElementsAre(::testing::Pair(2, 1), ::testing::Pair(1, 3)));
    outbox.Ack(Key(2), 1);
    outbox.Ack(Key(1), 3);
    EXPECT_TRUE(outbox.Empty());
  }
  std::vector<std::string> kept;
  for (const auto& entry : std::filesystem::directory_iterator(spool.path() + "/rejected")) {
    kept.push_back(entry.path().filename().string());
  }
  std::sort(kept.begin(), kept.end());
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_THAT(kept[0], ::testing::MatchesRegex("1_[0-9]+_2_4_[0-9a-f]+\\.batch"));
  EXPECT_EQ(kept[1], kept[0] + ".reason");
  EXPECT_EQ(testing::ReadFile(spool.path() + "/rejected/" + kept[1]),
            "string field x is not valid UTF-8\n");
  // A later run does not replay it.
  Outbox later(options);
  EXPECT_TRUE(later.Empty());
  EXPECT_EQ(later.counters().spool_files_rejected, 0u);
}

TEST_F(OutboxTest, WithoutASpoolARejectedBatchIsCountedAndDropped) {
  Outbox outbox(OutboxOptions{});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(outbox.Add(Batch(Key(0), 0, 2)));
  while (outbox.NextToSend(absl::ZeroDuration()) != nullptr) {
  }
  // A key the collector cannot file: every batch refused, nothing acknowledged.
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    outbox.Reject(Key(0), seq, "pid 0");
    outbox.Ack(Key(0), 0);
  }
  EXPECT_TRUE(outbox.Empty());
  EXPECT_TRUE(outbox.WaitAllAcked(absl::ZeroDuration()));
  const AgentCounters counters = outbox.counters();
  EXPECT_EQ(counters.batches_rejected, 3u);
  EXPECT_EQ(counters.events_rejected, 6u);
  EXPECT_EQ(counters.processes_rejected, 1u);
  EXPECT_EQ(counters.memory_bytes, 0u);
}

TEST_F(OutboxTest, AnUnusableSpoolDirectoryIsReported) {
  TempDir base;
  std::ofstream(base.path() + "/file") << "x";
  OutboxOptions options;
  options.spool_dir = base.path() + "/file/spool";
  Outbox outbox(options);
  EXPECT_THAT(outbox.spool_error(), ::testing::HasSubstr("cannot create the spool directory"));
  EXPECT_FALSE(outbox.Add(Batch(Key(1), 0, 1)));
  EXPECT_EQ(outbox.counters().batches_dropped, 1u);
}

TEST_F(OutboxTest, ASpoolDirectoryServesOneOutboxAtATime) {
  TempDir spool;
  OutboxOptions options;
  options.spool_dir = spool.path();
  {
    Outbox first(options);
    EXPECT_EQ(first.spool_error(), "");
    ASSERT_TRUE(first.Add(Batch(Key(1), 0, 1)));
    Outbox second(options);  // would take the first one's batches for its own
    EXPECT_THAT(second.spool_error(), ::testing::HasSubstr("in use by another vramscope-agent"));
    EXPECT_EQ(second.counters().batches_replayed, 0u);
  }
  Outbox third(options);
  EXPECT_EQ(third.spool_error(), "");
  EXPECT_EQ(third.counters().batches_replayed, 1u);
}

TEST_F(OutboxTest, AForgedSpoolSequenceFarAheadIsSetAsideNotFilledIn) {
  // Two valid files of one process, batches 1 and 2^40: filling the gap would queue 2^40 lost
  // batches. The far one is set aside (*.corrupt) and counted; batch 1 is replayed.
  TempDir spool;
  for (uint64_t sequence : {uint64_t{1}, uint64_t{1} << 40}) {
    const v1::EventBatch batch = Batch(Key(7), sequence, 3);
    absl::StatusOr<std::string> file = EncodeSpoolFile(batch, 0);
    ASSERT_TRUE(file.ok()) << file.status();
    std::ofstream(spool.path() + "/" + SpoolFileName(batch.process(), sequence, 3)) << *file;
  }
  OutboxOptions options;
  options.spool_dir = spool.path();
  Outbox outbox(options);
  EXPECT_EQ(outbox.counters().spool_files_rejected, 1u);
  EXPECT_EQ(outbox.counters().pending_batches, 1u);
  EXPECT_TRUE(std::filesystem::exists(spool.path() + "/" +
                                      SpoolFileName(Key(7), uint64_t{1} << 40, 3) + ".corrupt"));
}

}  // namespace
}  // namespace vramscope::agent
