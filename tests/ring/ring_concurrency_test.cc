// Many writers, one reader: no record lost while the reader keeps up, drops counted exactly when
// it does not, peaks exact whatever is dropped, and a writer killed with SIGKILL mid-stream.
//
// Interleavings provoked:
//   writers W1..Wn claim by CAS on head while R copies and stores tail:
//     W1: claim p ... publish p        R: sees seq(p) != p+1 -> stops, retries later
//     W2:   claim p+1, publish p+1     R: never reads p+1 before p
//   ring full: Wk loads tail, head + 1 - tail > capacity -> drop (counted), never waits on R.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "drain/ring_reader.h"
#include "ring_test_util.h"
#include "vramscope/ring/ring_writer.h"

namespace vramscope::interposer {
namespace {

using testing::TempDir;

constexpr int kThreads = 4;

// Allocation records encode (thread, index) in address: thread << 32 | index.
std::uint64_t Address(int thread, std::uint64_t index) {
  return (static_cast<std::uint64_t>(thread) << 32) | index;
}

// Checks every (thread, index) appears exactly once and in per-thread order.
void ExpectEveryRecordOnceInOrder(const google::protobuf::RepeatedPtrField<v1::Event>& events,
                                  std::uint64_t per_thread) {
  std::vector<std::uint64_t> next(kThreads, 0);
  for (const v1::Event& e : events) {
    if (!e.has_alloc()) continue;
    const int thread = static_cast<int>(e.alloc().address() >> 32);
    ASSERT_LT(thread, kThreads);
    ASSERT_EQ(e.alloc().address() & 0xffffffffu, next[thread]) << "thread " << thread;
    ++next[thread];
  }
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(next[t], per_thread) << "thread " << t;
}

TEST(RingConcurrencyTest, NoRecordLostWhileTheReaderKeepsUp) {
  TempDir dir;
  RingWriter writer;
  // Room for everything: the reader drains concurrently, but no writer ever finds it full.
  constexpr std::uint64_t kPerThread = 50000;
  ASSERT_EQ(writer.Open({.dir = dir.path().c_str(), .capacity = 1u << 18}), RingError::kOk);
  auto reader = agent::RingReader::OpenFile(writer.path());
  ASSERT_TRUE(reader.ok()) << reader.status();

  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (std::uint64_t i = 0; i < kPerThread; ++i) {
        writer.RecordAlloc(0, Address(t, i), 1, 1, VRAMSCOPE_RING_ALLOC_POOLED);
      }
      done.fetch_add(1);
    });
  }
  google::protobuf::RepeatedPtrField<v1::Event> events;
  while (done.load() < kThreads) ASSERT_TRUE((*reader)->Drain(&events).ok());
  for (std::thread& t : threads) t.join();
  testing::DrainAll(**reader, &events);

  EXPECT_EQ(writer.header()->records_dropped, 0u);
  for (const v1::Event& e : events) EXPECT_FALSE(e.has_drop());
  ExpectEveryRecordOnceInOrder(events, kPerThread);
}

TEST(RingConcurrencyTest, SmallRingWrapsManyTimesWithoutLoss) {
  TempDir dir;
  RingWriter writer;
  constexpr std::uint64_t kPerThread = 5000;
  ASSERT_EQ(writer.Open({.dir = dir.path().c_str(), .capacity = 64}), RingError::kOk);
  auto reader = agent::RingReader::OpenFile(writer.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      vramscope_ring_record r{};
      r.kind = VRAMSCOPE_RING_KIND_ALLOC;
      r.sub = VRAMSCOPE_RING_ALLOC_POOLED;
      for (std::uint64_t i = 0; i < kPerThread; ++i) {
        r.payload.alloc.address = Address(t, i);
        // A full ring drops; this test's writers retry to prove wrap-around loses nothing.
        while (!writer.Write(r)) std::this_thread::yield();
      }
      done.fetch_add(1);
    });
  }
  google::protobuf::RepeatedPtrField<v1::Event> events;
  std::uint64_t dropped_events = 0;
  while (done.load() < kThreads) {
    ASSERT_TRUE((*reader)->Drain(&events).ok());
  }
  for (std::thread& t : threads) t.join();
  testing::DrainAll(**reader, &events);
  for (const v1::Event& e : events) dropped_events += e.has_drop() ? e.drop().dropped_records() : 0;
  // The retried attempts were counted as drops, and reported exactly.
  EXPECT_EQ(dropped_events, writer.header()->records_dropped);
  ExpectEveryRecordOnceInOrder(events, kPerThread);
  EXPECT_EQ(writer.header()->head, kThreads * kPerThread);
}

TEST(RingConcurrencyTest, DropsAreCountedExactlyWithoutAReader) {
  TempDir dir;
  RingWriter writer;
  constexpr std::uint64_t kPerThread = 10000;
  constexpr std::uint32_t kCapacity = 256;
  ASSERT_EQ(writer.Open({.dir = dir.path().c_str(), .capacity = kCapacity}), RingError::kOk);
  std::vector<std::thread> threads;
  std::atomic<std::uint64_t> accepted{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::uint64_t mine = 0;
      for (std::uint64_t i = 0; i < kPerThread; ++i) {
        mine += writer.RecordAlloc(0, Address(t, i), 3, 4, VRAMSCOPE_RING_ALLOC_POOLED) ? 1 : 0;
      }
      accepted.fetch_add(mine);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(accepted.load(), kCapacity);
  EXPECT_EQ(writer.header()->records_dropped, kThreads * kPerThread - kCapacity);
  // Counters are exact regardless.
  EXPECT_EQ(writer.header()->devices[0].alloc_count, kThreads * kPerThread);
  EXPECT_EQ(writer.header()->devices[0].peak_requested_bytes, 3 * kThreads * kPerThread);
  EXPECT_EQ(writer.header()->devices[0].peak_allocated_bytes, 4 * kThreads * kPerThread);

  agent::RingReader::Options dead;
  dead.writer_alive = [](const agent::RingInfo&) { return false; };
  auto reader = agent::RingReader::OpenFile(writer.path(), dead);
  ASSERT_TRUE(reader.ok());
  google::protobuf::RepeatedPtrField<v1::Event> events;
  testing::DrainAll(**reader, &events);
  std::uint64_t allocs = 0, dropped = 0;
  for (const v1::Event& e : events) {
    allocs += e.has_alloc();
    if (e.has_drop()) dropped += e.drop().dropped_records();
  }
  EXPECT_EQ(allocs, kCapacity);
  EXPECT_EQ(dropped, kThreads * kPerThread - kCapacity);
  const auto counters = (*reader)->Counters();
  ASSERT_EQ(counters.size(), 1u);
  EXPECT_EQ(counters[0].records_dropped(), kThreads * kPerThread - kCapacity);
  EXPECT_EQ(counters[0].records_written(), kCapacity);
}

TEST(RingConcurrencyTest, PeaksStayExactWithDrops) {
  // Each thread allocates 1000 blocks of (t+1) KiB then frees them; the ring holds 64 records.
  // Whatever the interleaving, current returns to 0; the peak is at most the sum of all blocks
  // and at least the largest single thread's total.
  TempDir dir;
  RingWriter writer;
  ASSERT_EQ(writer.Open({.dir = dir.path().c_str(), .capacity = 64}), RingError::kOk);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::uint64_t size = (t + 1) * 1024;
      for (std::uint64_t i = 0; i < 1000; ++i) {
        writer.RecordAlloc(0, Address(t, i), size, size, VRAMSCOPE_RING_ALLOC_POOLED);
      }
      for (std::uint64_t i = 0; i < 1000; ++i) {
        writer.RecordFree(0, Address(t, i), size, size, VRAMSCOPE_RING_ALLOC_POOLED);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const vramscope_ring_device_counters& c = writer.header()->devices[0];
  EXPECT_EQ(c.current_allocated_bytes, 0u);
  EXPECT_LE(c.peak_allocated_bytes, 1000u * 1024 * (1 + 2 + 3 + 4));
  EXPECT_GE(c.peak_allocated_bytes, 1000u * 1024 * 4);
  EXPECT_GT(writer.header()->records_dropped, 0u);

  // Single thread: the exact value.
  TempDir dir2;
  RingWriter one;
  ASSERT_EQ(one.Open({.dir = dir2.path().c_str(), .capacity = 64}), RingError::kOk);
  std::uint64_t sum = 0;
  for (std::uint64_t i = 1; i <= 500; ++i) {
    one.RecordAlloc(2, i, i, i + 1, VRAMSCOPE_RING_ALLOC_POOLED);
    sum += i;
  }
  for (std::uint64_t i = 1; i <= 500; ++i)
    one.RecordFree(2, i, i, i + 1, VRAMSCOPE_RING_ALLOC_POOLED);
  EXPECT_EQ(one.header()->devices[2].peak_requested_bytes, sum);
  EXPECT_EQ(one.header()->devices[2].peak_allocated_bytes, sum + 500);
  EXPECT_EQ(one.header()->devices[2].current_requested_bytes, 0u);
  EXPECT_EQ(one.header()->records_dropped, 1000u - 64u);
}

TEST(RingConcurrencyTest, RecordsOfAWriterKilledWithSigkillAreStillRead) {
  TempDir dir;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  constexpr std::uint64_t kBeforeSignal = 1000;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ready[0]);
    RingWriter writer;
    if (writer.Open({.dir = dir.path().c_str(), .capacity = 1u << 12}) != RingError::kOk) _exit(2);
    std::uint64_t i = 0;
    for (; i < kBeforeSignal; ++i) writer.RecordAlloc(0, i, 8, 8, VRAMSCOPE_RING_ALLOC_POOLED);
    const char byte = 1;
    if (write(ready[1], &byte, 1) != 1) _exit(3);
    for (;;) writer.RecordAlloc(0, i++, 8, 8, VRAMSCOPE_RING_ALLOC_POOLED);  // until killed
  }
  close(ready[1]);
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  close(ready[0]);
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));

  // Real liveness check: the pid is gone now.
  auto reader = agent::RingReader::OpenFile(testing::OnlyRing(dir.path()));
  ASSERT_TRUE(reader.ok()) << reader.status();
  google::protobuf::RepeatedPtrField<v1::Event> events;
  testing::DrainAll(**reader, &events);
  ASSERT_TRUE((*reader)->finished());
  std::uint64_t allocs = 0, dropped = 0;
  for (const v1::Event& e : events) {
    if (e.has_alloc()) {
      EXPECT_EQ(e.alloc().address(), allocs);  // in order, no gap
      ++allocs;
    }
    if (e.has_drop()) dropped += e.drop().dropped_records();
  }
  EXPECT_GE(allocs, kBeforeSignal);
  const auto counters = (*reader)->Counters();
  ASSERT_EQ(counters.size(), 1u);
  // Every allocation the child counted was read or reported dropped (a slot claimed but not
  // published when the signal hit is reported as a drop too).
  EXPECT_GE(allocs + dropped, counters[0].records_written());
  ASSERT_TRUE(events[events.size() - 1].has_process_exit());
  EXPECT_TRUE(events[events.size() - 1].process_exit().killed());
  EXPECT_FALSE((*reader)->WriterExited());
}

}  // namespace
}  // namespace vramscope::interposer
