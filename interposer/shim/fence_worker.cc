#include "fence_worker.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <atomic>
#include <cstdint>

#include "config.h"
#include "log.h"
#include "slots.h"
#include "state.h"
#include "stream_fence.h"
#include "vramscope/ring/ring_writer.h"

namespace vramscope::interposer {
namespace {

constexpr int kQueue = 64;

struct Worker {
  // Requests reach the helper two ways. Sleeping: queued under `mu` with a signal on `wake`.
  // Watching (`watching` true, for Config::fence_spin_us after each synchronisation): the
  // requester only sets `hint`, and the helper finds the slot by its sync_requested flag. Both
  // sides store their flag, then load the other's (sequentially consistent), so a request made
  // as the helper stops watching is seen by one of the two.
  std::atomic<bool> watching{false};
  std::atomic<bool> hint{false};
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
  pthread_cond_t idle = PTHREAD_COND_INITIALIZER;
  bool started = false;
  bool failed = false;
  pthread_t thread{};
  bool busy = false;
  Slot* queue[kQueue] = {};
  int head = 0;
  int count = 0;
};

constinit Worker g_worker{};

// With w.mu held: marks the helper busy, serves `slot` without the lock, takes it back: an event
// round when event fences are on (it covers every pool), else (or if it cannot be issued) a
// device synchronisation.
void SyncLocked(Worker& w, Slot* slot) {
  w.busy = true;
  pthread_mutex_unlock(&w.mu);
  // Sync skips a dead pool, a live capture and exit on its own.
  if (Cfg().mode != Mode::kPool || !IssueEventRound()) (void)slot->fences.Sync();
  slot->sync_requested.store(false, std::memory_order_release);
  pthread_mutex_lock(&w.mu);
  w.busy = false;
  pthread_cond_broadcast(&w.idle);
}

// Requests made by hint: every live slot whose flag is set and that no queued entry covers
// (a queued slot is synchronised from the queue). With w.mu held.
void ServeHintsLocked(Worker& w) {
  Slot* slots[kMaxSlots];
  const int count = LiveSlots(slots, kMaxSlots);
  for (int i = 0; i < count; ++i) {
    Slot* slot = slots[i];
    if (!slot->sync_requested.load(std::memory_order_acquire)) continue;
    bool queued = false;
    for (int k = 0; k < w.count && !queued; ++k) queued = w.queue[(w.head + k) % kQueue] == slot;
    if (!queued) SyncLocked(w, slot);
  }
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Watches for a hint for up to `spin_ns`; true if one came (the helper is still watching).
bool WatchForHint(Worker& w, std::uint64_t spin_ns) {
  if (spin_ns == 0) return false;
  const std::uint64_t until = RingNowNs() + spin_ns;
  for (unsigned i = 0;; ++i) {
    if (w.hint.load(std::memory_order_relaxed)) return true;
    if ((i & 63) == 63 && RingNowNs() >= until) return false;
    CpuRelax();
  }
}

void* WorkerMain(void*) {
  Worker& w = g_worker;
  const std::uint64_t spin_ns = Cfg().fence_spin_us * 1000;
  pthread_mutex_lock(&w.mu);
  for (;;) {
    while (w.count == 0) {
      if (w.hint.exchange(false, std::memory_order_seq_cst)) {
        ServeHintsLocked(w);
        continue;
      }
      if (!Exiting() && AnyEventFenceQueued()) {
        // Event fences queued: poll them (and issue rounds as frees come) without the lock,
        // watching for requests, until none is queued.
        w.busy = true;
        w.watching.store(true, std::memory_order_seq_cst);
        pthread_mutex_unlock(&w.mu);
        const bool queued = PollEventFences(/*issue_due=*/true, Cfg().fence_round_us * 1000);
        if (queued && !w.hint.load(std::memory_order_relaxed)) {
          const std::uint64_t poll_ns = Cfg().fence_poll_us * 1000;
          timespec pause{static_cast<time_t>(poll_ns / 1000000000),
                         static_cast<long>(poll_ns % 1000000000)};
          nanosleep(&pause, nullptr);
        }
        pthread_mutex_lock(&w.mu);
        w.watching.store(false, std::memory_order_seq_cst);
        w.busy = false;
        pthread_cond_broadcast(&w.idle);
        continue;
      }
      // Watch a while without the lock (requesters then only set the hint), then sleep.
      w.watching.store(true, std::memory_order_seq_cst);
      pthread_mutex_unlock(&w.mu);
      const bool hinted = !Exiting() && WatchForHint(w, spin_ns);
      pthread_mutex_lock(&w.mu);
      w.watching.store(false, std::memory_order_seq_cst);
      if (hinted || w.hint.load(std::memory_order_seq_cst) || w.count != 0) continue;
      pthread_cond_wait(&w.wake, &w.mu);
    }
    Slot* slot = w.queue[w.head];
    w.head = (w.head + 1) % kQueue;
    --w.count;
    SyncLocked(w, slot);
  }
  return nullptr;
}

// With w.mu held.
bool StartLocked(Worker& w) {
  if (w.started) return true;
  if (w.failed) return false;
  sigset_t all;
  sigset_t saved;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &saved);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  pthread_t thread;
  const int error = pthread_create(&thread, &attr, WorkerMain, nullptr);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (error != 0) {
    w.failed = true;
    VRAMSCOPE_LOG(kWarn, "cannot start the fence thread (error %d); frees synchronise inline",
                  error);
    return false;
  }
  w.thread = thread;
  w.started = true;
  return true;
}

}  // namespace

bool RequestBackgroundSync(Slot* slot) {
  if (slot->sync_requested.exchange(true, std::memory_order_acq_rel)) return true;
  Worker& w = g_worker;
  // The helper is watching: the hint is enough (it then finds the slot by its flag).
  w.hint.store(true, std::memory_order_seq_cst);
  if (w.watching.load(std::memory_order_seq_cst)) return true;
  pthread_mutex_lock(&w.mu);
  const bool ok = StartLocked(w) && w.count < kQueue;
  if (ok) {
    w.queue[(w.head + w.count) % kQueue] = slot;
    ++w.count;
    pthread_cond_signal(&w.wake);
  }
  pthread_mutex_unlock(&w.mu);
  if (!ok) slot->sync_requested.store(false, std::memory_order_release);
  return ok;
}

void WakeFenceWorker() {
  Worker& w = g_worker;
  w.hint.store(true, std::memory_order_seq_cst);
  if (w.watching.load(std::memory_order_seq_cst)) return;  // it sees the hint
  pthread_mutex_lock(&w.mu);
  if (StartLocked(w)) pthread_cond_signal(&w.wake);
  pthread_mutex_unlock(&w.mu);
}

void QuiesceFenceWorker(int timeout_ms) {
  Worker& w = g_worker;
  timespec deadline{};
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += timeout_ms / 1000;
  deadline.tv_nsec += static_cast<long>(timeout_ms % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec += 1;
    deadline.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&w.mu);
  // Exit has begun (Exiting() is true): queued requests will be skipped, only one in flight
  // may still be inside the driver.
  while (w.busy) {
    if (pthread_cond_timedwait(&w.idle, &w.mu, &deadline) != 0) break;
  }
  pthread_mutex_unlock(&w.mu);
}

std::uint64_t FenceWorkerCpuNs() {
  Worker& w = g_worker;
  pthread_mutex_lock(&w.mu);
  const bool started = w.started;
  const pthread_t thread = w.thread;
  pthread_mutex_unlock(&w.mu);
  clockid_t clock{};
  timespec ts{};
  // The helper is detached but never exits while the process lives.
  if (!started || pthread_getcpuclockid(thread, &clock) != 0 || clock_gettime(clock, &ts) != 0) {
    return 0;
  }
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

void LockFenceWorkerForFork() { pthread_mutex_lock(&g_worker.mu); }
void UnlockFenceWorkerAfterFork() { pthread_mutex_unlock(&g_worker.mu); }

void ResetFenceWorkerInChild() {
  // The helper thread does not exist in the child; its slots are forgotten.
  Worker& w = g_worker;
  pthread_mutex_init(&w.mu, nullptr);
  pthread_cond_init(&w.wake, nullptr);
  pthread_cond_init(&w.idle, nullptr);
  w.started = false;
  w.failed = false;
  w.busy = false;
  w.watching.store(false, std::memory_order_relaxed);
  w.hint.store(false, std::memory_order_relaxed);
  w.head = 0;
  w.count = 0;
}

}  // namespace vramscope::interposer
