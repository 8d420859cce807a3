// interposer/shim/fast_unwind.h: the fast walk returns exactly the frames libgcc's
// _Unwind_Backtrace returns, through frames addressed from rsp and from rbp (alloca), through libc
// (qsort's comparator), on another thread, and past the frame limit; a second walk through the same
// code reads no unwind table again; nothing here makes it give up. The per-thread caches: walks
// that alternate between call paths of the same depth (so the previous walk's address at a depth
// is another's) still return libgcc's frames, and once each path was walked they are served from
// the thread's caches without a shared table lookup; threads give their caches back at exit.
#include <alloca.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unwind.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "fast_unwind.h"

namespace vramscope::interposer {
namespace {

constexpr int kMax = 128;

struct Walks {
  std::vector<std::uintptr_t> fast;
  std::vector<std::uintptr_t> libgcc;
  int fast_count = 0;
};

_Unwind_Reason_Code Collect(_Unwind_Context* context, void* arg) {
  auto* out = static_cast<std::vector<std::uintptr_t>*>(arg);
  const std::uintptr_t ip = _Unwind_GetIP(context);
  if (ip == 0) return _URC_END_OF_STACK;
  out->push_back(ip);
  return out->size() < kMax + 8 ? _URC_NO_REASON : _URC_END_OF_STACK;
}

__attribute__((noinline)) void WalkBoth(Walks* walks) {
  walks->fast.assign(kMax, 0);
  walks->fast_count = FastBacktrace(walks->fast.data(), kMax);
  walks->fast.resize(walks->fast_count < 0 ? 0 : walks->fast_count);
  _Unwind_Backtrace(Collect, &walks->libgcc);
  asm volatile("" ::: "memory");  // not a tail call
}

// The two walks start in WalkBoth at different call sites; from its caller on they must agree
// frame for frame (libgcc's may be longer when the fast one hit kMax).
void ExpectSameFrames(const Walks& walks) {
  ASSERT_GE(walks.fast_count, 2) << "the fast walk gave up or found no caller";
  std::size_t j = 0;
  while (j < walks.libgcc.size() && walks.libgcc[j] != walks.fast[1]) ++j;
  ASSERT_LT(j, walks.libgcc.size()) << "libgcc's walk lacks WalkBoth's caller";
  ASSERT_LE(j, 3u);
  const std::size_t n = walks.fast.size() - 1;
  ASSERT_LE(j + n, walks.libgcc.size());
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(walks.fast[1 + i], walks.libgcc[j + i]) << "frame " << i;
  }
  if (walks.fast_count < kMax) {
    EXPECT_EQ(j + n, walks.libgcc.size()) << "the fast walk stopped early";
  }
}

__attribute__((noinline)) int Recurse(int depth, Walks* walks) {
  if (depth == 0) {
    WalkBoth(walks);
    return 0;
  }
  const int r = Recurse(depth - 1, walks);
  asm volatile("" ::: "memory");
  return r + 1;
}

// A frame whose CFA is rbp-based (alloca of a run-time size).
__attribute__((noinline)) int WithAlloca(std::size_t bytes, Walks* walks) {
  volatile char* buffer = static_cast<char*>(alloca(bytes));
  buffer[0] = 1;
  const int r = Recurse(3, walks);
  return r + buffer[0];
}

Walks* g_qsort_walks = nullptr;
int Compare(const void* a, const void* b) {
  if (g_qsort_walks != nullptr && g_qsort_walks->fast_count == 0) Recurse(2, g_qsort_walks);
  return *static_cast<const int*>(a) - *static_cast<const int*>(b);
}

TEST(UnwindTest, SameFramesAsLibgccThroughPlainCalls) {
  Walks walks;
  Recurse(10, &walks);
  ExpectSameFrames(walks);
}

TEST(UnwindTest, SameFramesThroughAnRbpBasedFrame) {
  Walks walks;
  WithAlloca(static_cast<std::size_t>(getpid() % 100 + 64), &walks);
  ExpectSameFrames(walks);
}

TEST(UnwindTest, SameFramesThroughLibc) {
  Walks walks;
  int values[64];
  for (int i = 0; i < 64; ++i) values[i] = (i * 37) % 64;
  g_qsort_walks = &walks;
  qsort(values, 64, sizeof(int), Compare);
  g_qsort_walks = nullptr;
  ExpectSameFrames(walks);
  EXPECT_GT(walks.fast.size(), 6u);
}

TEST(UnwindTest, SameFramesOnAnotherThreadToItsEnd) {
  Walks walks;
  std::thread([&walks] { Recurse(5, &walks); }).join();
  ExpectSameFrames(walks);
  EXPECT_LT(walks.fast_count, kMax);
}

TEST(UnwindTest, StopsAtTheLimit) {
  Walks walks;
  Recurse(kMax + 20, &walks);
  EXPECT_EQ(walks.fast_count, kMax);
  ExpectSameFrames(walks);
}

TEST(UnwindTest, ASecondWalkReadsNoTableAndNothingGaveUp) {
  UnwindCounters counters[2];
  Walks walks[2];
  volatile int n = 2;  // a loop the compiler cannot unroll: one call site, the same frames
  for (int i = 0; i < n; ++i) {
    Recurse(7, &walks[i]);
    counters[i] = GetUnwindCounters();
  }
  EXPECT_GT(counters[0].rules_computed, 0u);
  EXPECT_EQ(counters[1].rules_computed, counters[0].rules_computed);
  EXPECT_EQ(counters[1].walks_given_up, 0u);
  ExpectSameFrames(walks[1]);
}

// Two call paths whose frames differ at the same depths: one through Recurse, one through
// WithAlloca (an rbp-based frame) below a Recurse of the same total depth.
__attribute__((noinline)) int PathA(Walks* walks) {
  const int r = Recurse(4, walks);
  asm volatile("" ::: "memory");
  return r;
}
__attribute__((noinline)) int PathB(Walks* walks) {
  const int r = WithAlloca(static_cast<std::size_t>(getpid() % 50 + 32), walks);
  asm volatile("" ::: "memory");
  return r;
}

TEST(UnwindTest, AlternatingPathsGiveLibgccsFramesFromTheThreadsCaches) {
  constexpr int kWalks = 12;
  UnwindCounters before{};
  volatile int n = kWalks + 2;
  for (int i = 0; i < n; ++i) {
    if (i == 2) before = GetUnwindCounters();  // both paths walked once from these call sites
    Walks walks;
    if (i % 2 == 0) {
      PathA(&walks);
    } else {
      PathB(&walks);
    }
    ExpectSameFrames(walks);
  }
  const UnwindCounters after = GetUnwindCounters();
  // Without the caches every frame (over 10 a walk) probes the shared table. With them, an
  // address that differs from the previous walk's at its depth is found in the thread's recent
  // table, unless two of the few alternating addresses share its slot there (a slot is chosen by
  // a hash of the address, which moves with the load address): a probe a walk per such pair.
  EXPECT_LE(after.shared_lookups - before.shared_lookups, 3u * kWalks)
      << "walks along known paths went to the shared table";
  EXPECT_EQ(after.rules_computed, before.rules_computed);
  EXPECT_EQ(after.walks_given_up, 0u);
}

// Another thread has its own caches: its first walk looks its addresses up in the shared table
// (whose rules all threads share), and gets the same frames.
TEST(UnwindTest, AnotherThreadStartsWithEmptyCachesAndSharesTheRules) {
  Walks main_walk;
  PathA(&main_walk);
  ExpectSameFrames(main_walk);
  UnwindCounters before{}, after{};
  Walks thread_walk;
  std::thread([&] {
    before = GetUnwindCounters();
    PathA(&thread_walk);
    after = GetUnwindCounters();
  }).join();
  ExpectSameFrames(thread_walk);
  EXPECT_GT(after.shared_lookups, before.shared_lookups);
}

// Shared table lookups of the second of two walks along one path (one call site: no branch on
// the iteration around the call).
__attribute__((noinline)) std::uint64_t LookupsOfARepeatedWalk(Walks* last) {
  volatile int n = 2;
  std::uint64_t before = 0;
  for (int i = 0; i < n; ++i) {
    *last = Walks();
    before = GetUnwindCounters().shared_lookups;
    PathA(last);
  }
  return GetUnwindCounters().shared_lookups - before;
}

// A thread's cache goes back to the pool when the thread exits: after many more threads than the
// pool holds have come and gone, one at a time, a new thread still walks from its own cache (a
// second walk along the same path needs no shared table lookup).
TEST(UnwindTest, ThreadCachesComeBackAtThreadExit) {
  for (int i = 0; i < 600; ++i) {
    std::thread([] {
      Walks walks;
      PathA(&walks);
    }).join();
  }
  std::uint64_t lookups = 1;
  Walks second;
  std::thread([&] { lookups = LookupsOfARepeatedWalk(&second); }).join();
  ExpectSameFrames(second);
  EXPECT_EQ(lookups, 0u) << "the thread had no cache: the pool ran dry";
}

}  // namespace
}  // namespace vramscope::interposer
