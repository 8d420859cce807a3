#include "fence_worker.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <atomic>

#include "device_pools.h"
#include "log.h"
#include "shim.h"

namespace vramscope::interposer {
namespace {

constexpr int kQueue = 64;

struct Worker {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
  pthread_cond_t idle = PTHREAD_COND_INITIALIZER;
  bool started = false;
  bool failed = false;
  bool busy = false;
  Slot* queue[kQueue] = {};
  int head = 0;
  int count = 0;
};

constinit Worker g_worker{};

void* WorkerMain(void*) {
  Worker& w = g_worker;
  pthread_mutex_lock(&w.mu);
  for (;;) {
    while (w.count == 0) pthread_cond_wait(&w.wake, &w.mu);
    Slot* slot = w.queue[w.head];
    w.head = (w.head + 1) % kQueue;
    --w.count;
    w.busy = true;
    pthread_mutex_unlock(&w.mu);
    // Sync skips a dead pool, a live capture and exit on its own.
    (void)slot->fences.Sync();
    slot->sync_requested.store(false, std::memory_order_release);
    pthread_mutex_lock(&w.mu);
    w.busy = false;
    pthread_cond_broadcast(&w.idle);
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
  w.started = true;
  return true;
}

}  // namespace

bool RequestBackgroundSync(Slot* slot) {
  if (slot->sync_requested.exchange(true, std::memory_order_acq_rel)) return true;
  Worker& w = g_worker;
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
  w.head = 0;
  w.count = 0;
}

}  // namespace vramscope::interposer
