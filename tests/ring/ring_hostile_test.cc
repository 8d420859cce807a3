// A ring file's owner attacking its reader: the file truncated (to 0, to half) while it is mapped
// and being drained must cost that ring only (an error, the reader damaged, no SIGBUS), while other
// rings keep draining and a fault outside any ring still kills; and a header that claims another
// process, user or host is not believed.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>

#include "drain/event_encoder.h"
#include "drain/ring_fault.h"
#include "ring_test_util.h"
#include "vramscope/ring/ring_writer.h"

namespace vramscope {
namespace {

using agent::RingReader;
using ::testing::HasSubstr;
using Events = google::protobuf::RepeatedPtrField<v1::Event>;

constexpr std::uint32_t kCapacity = 1024;
constexpr off_t kRingBytes = VRAMSCOPE_RING_HEADER_SIZE + off_t{kCapacity} * 64;
// Half the file, at a page boundary: the rest of the page holding a non-aligned end reads as
// zeros (no fault), where a reader of a live writer just waits for the slot to be published.
constexpr off_t kHalf = kRingBytes / 2 / 4096 * 4096;

// A ring file in its own directory, with `records` allocations written.
struct TestRing {
  testing::TempDir dir;
  interposer::RingWriter writer;

  explicit TestRing(std::uint64_t records) {
    EXPECT_EQ(writer.Open({.dir = dir.path().c_str(), .capacity = kCapacity}),
              interposer::RingError::kOk);
    for (std::uint64_t i = 0; i < records; ++i) {
      EXPECT_TRUE(writer.RecordAlloc(0, 0x1000 + i * 512, 500, 512, VRAMSCOPE_RING_ALLOC_POOLED));
    }
  }
  vramscope_ring_header* header() { return const_cast<vramscope_ring_header*>(writer.header()); }
  void Truncate(off_t size) {
    // After this the writer must not touch its mapping either: only the reader is protected.
    ASSERT_EQ(::truncate(writer.path(), size), 0);
  }
};

std::size_t Allocations(const Events& events) {
  std::size_t n = 0;
  for (const v1::Event& e : events) n += e.has_alloc() ? 1 : 0;
  return n;
}

void ExpectDamaged(RingReader& reader, const absl::Status& status) {
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("truncated"));
  EXPECT_THAT(status.message(), HasSubstr(reader.path()));
  EXPECT_TRUE(reader.damaged());
  // Every later call answers without touching the file.
  Events more;
  EXPECT_EQ(reader.Drain(&more).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(more.empty());
  EXPECT_TRUE(reader.Counters().empty());
  EXPECT_EQ(reader.head(), reader.cursor());
  EXPECT_FALSE(reader.WriterExited());
  reader.CommitTail();
}

class RingTruncateTest : public ::testing::TestWithParam<off_t> {};

TEST_P(RingTruncateTest, TruncatedBetweenDrainsIsAnErrorAndOtherRingsKeepDraining) {
  // 900 records: half the file holds slots 0..447 only, so at half size the reader faults inside
  // its record loop; at size 0, on its first look at the header.
  TestRing victim(900);
  TestRing other(900);
  auto a = RingReader::OpenFile(victim.writer.path());
  auto b = RingReader::OpenFile(other.writer.path());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  const unsigned long faults_before = agent::RingFaultsHandled();

  Events events;
  ASSERT_TRUE((*a)->Drain(&events, 100).ok());
  ASSERT_TRUE((*b)->Drain(&events, 100).ok());
  EXPECT_EQ(Allocations(events), 200u);

  victim.Truncate(GetParam());
  Events from_victim;
  const absl::StatusOr<agent::DrainStats> stats = (*a)->Drain(&from_victim);
  ASSERT_FALSE(stats.ok());
  EXPECT_TRUE(from_victim.empty()) << "events read from zero pages must not come out";
  ExpectDamaged(**a, stats.status());
  EXPECT_GT(agent::RingFaultsHandled(), faults_before);

  Events from_other;
  const absl::StatusOr<agent::DrainStats> rest = (*b)->Drain(&from_other);
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(Allocations(from_other), 800u);
  EXPECT_FALSE((*b)->damaged());
  EXPECT_FALSE((*b)->Counters().empty());
  a->reset();  // unmaps the replacement pages, drops the flock
}

TEST_P(RingTruncateTest, TruncatedInTheMiddleOfADrainIsAnError) {
  TestRing victim(900);
  int calls = 0;
  RingReader::Options options;
  // Asked once the published records are read (is the writer gone?): the file shrinks right
  // then, between two of the reader's accesses to the header.
  options.writer_alive = [&](const agent::RingInfo&) {
    if (calls++ == 0) {
      EXPECT_EQ(::truncate(victim.writer.path(), GetParam()), 0);
    }
    return false;
  };
  auto reader = RingReader::OpenFile(victim.writer.path(), options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  Events events;
  const absl::StatusOr<agent::DrainStats> stats = (*reader)->Drain(&events);
  EXPECT_EQ(calls, 1);
  if (GetParam() == 0) {
    ASSERT_FALSE(stats.ok());
    EXPECT_TRUE(events.empty());
    ExpectDamaged(**reader, stats.status());
  } else {
    // Half the file is left: the header page is still there, so this drain completes...
    ASSERT_TRUE(stats.ok()) << stats.status();
  }
  // ...and the next reader of it fails cleanly at open (header gone) or on the missing slots.
  reader->reset();
  auto again = RingReader::OpenFile(victim.writer.path());
  EXPECT_FALSE(again.ok());
}

TEST_P(RingTruncateTest, AFaultWhileDrainingIntoWireBytesAddsNoBytes) {
  // What the agent drains into (drain/event_encoder.h): at half size the reader takes slots
  // 100..447 before it faults, and those must not stay in the bytes.
  TestRing victim(900);
  auto reader = RingReader::OpenFile(victim.writer.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  agent::EncodedEvents encoded;
  ASSERT_TRUE((*reader)->Drain(&encoded, 100).ok());
  const std::string before = encoded.bytes();
  const int events_before = encoded.size();
  EXPECT_EQ(events_before, 101);  // ProcessStart and 100 allocations

  victim.Truncate(GetParam());
  const absl::StatusOr<agent::DrainStats> stats = (*reader)->Drain(&encoded);
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(encoded.size(), events_before);
  EXPECT_TRUE(encoded.bytes() == before) << "bytes read from zero pages must not come out";
  ExpectDamaged(**reader, stats.status());
  reader->reset();
}

INSTANTIATE_TEST_SUITE_P(ToZeroAndToHalf, RingTruncateTest, ::testing::Values(off_t{0}, kHalf));

TEST(RingFaultDeathTest, ABusErrorOutsideTheRingBeingReadStillKills) {
  // The handler handles only faults inside the mapping this thread marked: any other SIGBUS
  // (a real bug) must still end the process with SIGBUS.
  testing::TempDir dir;
  const std::string path = dir.path() + "/other";
  EXPECT_EXIT(
      {
        agent::InstallRingFaultHandler();
        const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);
        if (fd < 0 || ::ftruncate(fd, 8192) != 0) ::_exit(3);
        auto* page = static_cast<volatile char*>(mmap(nullptr, 8192, PROT_READ, MAP_SHARED, fd, 0));
        char marked[64];
        agent::RingFaultScope scope(marked, sizeof(marked));  // another range
        if (::ftruncate(fd, 0) != 0) ::_exit(4);
        (void)page[100];
        ::_exit(0);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

// --- Identity ---------------------------------------------------------------------------------

const v1::ProcessStartEvent& FirstStart(RingReader& reader, Events* events) {
  EXPECT_TRUE(reader.Drain(events).ok());
  for (const v1::Event& e : *events) {
    if (e.has_process_start()) return e.process_start();
  }
  ADD_FAILURE() << "no ProcessStart";
  static const v1::ProcessStartEvent kNone;
  return kNone;
}

std::uint32_t FileOwner(const char* path) {
  struct stat st {};
  EXPECT_EQ(::stat(path, &st), 0);
  return st.st_uid;
}

TEST(RingIdentityTest, OwnRingIsVerifiedAndReportedUnderTheFileOwnerAndThisHost) {
  TestRing ring(3);
  auto reader = RingReader::OpenFile(ring.writer.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->info().identity, v1::PROCESS_IDENTITY_VERIFIED);
  EXPECT_EQ((*reader)->info().uid, ::geteuid());
  EXPECT_EQ((*reader)->info().host, agent::LocalHostName());
  Events events;
  const v1::ProcessStartEvent& start = FirstStart(**reader, &events);
  EXPECT_EQ(start.identity(), v1::PROCESS_IDENTITY_VERIFIED);
  EXPECT_EQ(start.uid(), ::geteuid());
  EXPECT_EQ(start.pid(), static_cast<std::uint32_t>(::getpid()));
}

TEST(RingIdentityTest, HeaderClaimingAnotherUsersProcessIsAMismatch) {
  // The header claims pid 1 (init, run by root) and uid 0. As root, the ring file is given to
  // another user first, so that the file's owner is not pid 1's either way.
  TestRing ring(3);
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(ring.writer.path(), 65534, 65534), 0);
  }
  const std::uint32_t owner = FileOwner(ring.writer.path());
  ASSERT_NE(owner, 0u);
  ring.header()->pid = 1;
  ring.header()->uid = 0;
  ring.header()->proc_start_ticks = 0;
  strncpy(ring.header()->host, "someone-else", sizeof(ring.header()->host));
  auto reader = RingReader::OpenFile(ring.writer.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  const agent::RingInfo& info = (*reader)->info();
  EXPECT_EQ(info.identity, v1::PROCESS_IDENTITY_MISMATCH);
  EXPECT_EQ(info.uid, owner);
  EXPECT_EQ(info.header_uid, 0u);
  EXPECT_EQ(info.host, agent::LocalHostName());
  EXPECT_EQ(info.header_host, "someone-else");
  EXPECT_EQ((*reader)->process_key().host(), agent::LocalHostName());
  Events events;
  const v1::ProcessStartEvent& start = FirstStart(**reader, &events);
  EXPECT_EQ(start.identity(), v1::PROCESS_IDENTITY_MISMATCH);
  EXPECT_EQ(start.uid(), owner);
  EXPECT_EQ(start.host(), agent::LocalHostName());
}

TEST(RingIdentityTest, PidZeroIsAMismatchAndADeadPidIsUnverifiable) {
  TestRing zero(1);
  zero.header()->pid = 0;
  auto reader = RingReader::OpenFile(zero.writer.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->info().identity, v1::PROCESS_IDENTITY_MISMATCH);

  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);  // reaped: no such process any more
  TestRing dead(1);
  dead.header()->pid = static_cast<std::uint32_t>(child);
  auto late = RingReader::OpenFile(dead.writer.path());
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ((*late)->info().identity, v1::PROCESS_IDENTITY_UNVERIFIABLE);
}

TEST(RingIdentityTest, TheCheckUsesEveryUidAndTheStartTime) {
  agent::RingInfo info;
  info.pid = 4242;
  info.proc_start_ticks = 777;
  std::optional<agent::ProcessOwner> process;
  auto lookup = [&](std::uint32_t pid) {
    EXPECT_EQ(pid, 4242u);
    return process;
  };
  process = std::nullopt;
  EXPECT_EQ(agent::CheckProcessIdentity(info, 1000, lookup), v1::PROCESS_IDENTITY_UNVERIFIABLE);
  process = agent::ProcessOwner{777, {1000, 1000, 1000, 1000}};
  EXPECT_EQ(agent::CheckProcessIdentity(info, 1000, lookup), v1::PROCESS_IDENTITY_VERIFIED);
  // A set-uid program: real uid 1000, effective (the file's owner) 0.
  process = agent::ProcessOwner{777, {1000, 0, 0, 0}};
  EXPECT_EQ(agent::CheckProcessIdentity(info, 0, lookup), v1::PROCESS_IDENTITY_VERIFIED);
  process = agent::ProcessOwner{777, {2000, 2000, 2000, 2000}};
  EXPECT_EQ(agent::CheckProcessIdentity(info, 1000, lookup), v1::PROCESS_IDENTITY_MISMATCH);
  // Another start time: another process has the pid now.
  process = agent::ProcessOwner{778, {2000, 2000, 2000, 2000}};
  EXPECT_EQ(agent::CheckProcessIdentity(info, 1000, lookup), v1::PROCESS_IDENTITY_UNVERIFIABLE);
  // The header gives no start time: the live process is taken as the writer.
  info.proc_start_ticks = 0;
  EXPECT_EQ(agent::CheckProcessIdentity(info, 1000, lookup), v1::PROCESS_IDENTITY_MISMATCH);
  info.pid = 0;
  EXPECT_EQ(agent::CheckProcessIdentity(info, 1000, lookup), v1::PROCESS_IDENTITY_MISMATCH);

  // The /proc reader on ourselves and on pid 1 (always there, in any pid namespace).
  const std::optional<agent::ProcessOwner> self =
      agent::LookupProcessOwner(static_cast<std::uint32_t>(::getpid()));
  ASSERT_TRUE(self.has_value());
  EXPECT_EQ(self->uids.size(), 4u);
  EXPECT_NE(self->start_ticks, 0u);
  EXPECT_EQ(self->uids[1], ::geteuid());
  EXPECT_TRUE(agent::LookupProcessOwner(1).has_value());
  EXPECT_FALSE(agent::LookupProcessOwner(0).has_value());
}

TEST(RingIdentityTest, InjectedLookupReplacesProc) {
  TestRing ring(1);
  RingReader::Options options;
  options.lookup_process = [](std::uint32_t) {
    return std::optional<agent::ProcessOwner>(agent::ProcessOwner{0, {54321, 54321, 54321, 54321}});
  };
  options.host = "node7";
  auto reader = RingReader::OpenFile(ring.writer.path(), options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->info().identity, v1::PROCESS_IDENTITY_MISMATCH);
  EXPECT_EQ((*reader)->process_key().host(), "node7");
}

}  // namespace
}  // namespace vramscope
