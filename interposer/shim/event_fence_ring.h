// The queue of a pool's stream-aware event fences (one per Slot), as data: the state of
// stream_fence.h's rounds, kept here so that the slot table (slots.h) can hold it without
// reaching up to the stream fences that fill and poll it.
//
// Thread safety: `mu` guards the fences, spares and orphans; the counters are atomics (see
// stream_fence.h for who takes which). Plain data: no function here fails.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>

#include <cuda.h>

namespace vramscope::interposer {

// A pool's queued event fences (one per round), oldest first, and the events it recycles.
struct EventFenceRing {
  static constexpr int kFences = 64;
  static constexpr int kEventsPerFence = 16;
  static constexpr int kSpare = 512;
  static constexpr int kOrphans = 16;
  struct Fence {
    std::uint64_t epoch = 0;
    int count = 0;
    bool sync = false;  // not exact: complete it with a device synchronisation
    // The stream registry's generation when the round was recorded (it changes whenever a
    // stream is destroyed, so one handle names one stream within a generation).
    std::uint64_t generation = 0;
    CUevent events[kEventsPerFence] = {};
    // The stream each event was recorded on (CU_STREAM_LEGACY for the legacy stream); null for
    // an event of a destroyed stream, which nothing later on the same handle may stand for.
    CUstream streams[kEventsPerFence] = {};
  };
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  Fence fences[kFences];
  int head = 0;
  int count = 0;
  CUevent spare[kSpare] = {};  // completed events, created in the pool's context
  int spare_count = 0;
  // Events recorded on streams destroyed while flagged (under g_fence_mu).
  CUevent orphans[kOrphans] = {};
  int orphan_count = 0;
  bool orphan_overflow = false;
  std::atomic<int> in_flight{0};
  // Since the last round: approximate counters (plain load + store), a trigger only.
  std::atomic<std::uint64_t> bytes_since_round{0};
  std::atomic<std::uint64_t> frees_since_round{0};
  std::atomic<std::uint64_t> last_round_ns{0};
};

}  // namespace vramscope::interposer
