// RingFaultScope and the SIGBUS handler: see ring_fault.h for the design and why it was chosen.
#include "drain/ring_fault.h"

#include <errno.h>
#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <mutex>

namespace vramscope::agent {
namespace {

// The range the current thread is reading. Plain thread-local data: the handler runs on the
// thread that faulted, so it reads this thread's copy; the scope touches it first, outside any
// handler, so no lazy TLS allocation happens inside one.
struct Marker {
  char* begin = nullptr;
  char* end = nullptr;
  volatile sig_atomic_t faulted = 0;
  std::size_t offset = 0;
};
thread_local Marker t_marker;

struct sigaction g_previous;  // written once, before our handler can run
std::atomic<unsigned long> g_handled{0};
static_assert(std::atomic<unsigned long>::is_always_lock_free, "used in a signal handler");

void Chain(int sig, siginfo_t* info, void* context) {
  if ((g_previous.sa_flags & SA_SIGINFO) != 0) {
    if (g_previous.sa_sigaction != nullptr) {
      g_previous.sa_sigaction(sig, info, context);
      return;
    }
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN &&
             g_previous.sa_handler != nullptr) {
    g_previous.sa_handler(sig);
    return;
  }
  // Nobody else handles it: die of SIGBUS as without us. A fault raised by the kernel happens
  // again when the instruction re-runs (and dumps core there); a SIGBUS sent with kill() is sent
  // again, to be delivered once this handler returns and unblocks it.
  struct sigaction fallback = {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  sigaction(SIGBUS, &fallback, nullptr);
  if (info == nullptr || info->si_code <= 0) raise(SIGBUS);
}

void OnSigbus(int sig, siginfo_t* info, void* context) {
  Marker& marker = t_marker;
  // si_code > 0: raised by the kernel for this access (BUS_ADRERR and friends), so si_addr is
  // the faulting address; a SIGBUS sent by a process (si_code <= 0) carries no address.
  if (info != nullptr && info->si_code > 0 && marker.begin != nullptr) {
    char* address = static_cast<char*>(info->si_addr);
    if (address >= marker.begin && address < marker.end) {
      const int saved_errno = errno;
      // Zero pages over the whole ring: every later access succeeds, and the reader, which sees
      // the fault at its next check, discards whatever it read from them.
      void* mapped = mmap(marker.begin, static_cast<std::size_t>(marker.end - marker.begin),
                          PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
      errno = saved_errno;
      if (mapped != MAP_FAILED) {
        if (marker.faulted == 0) marker.offset = static_cast<std::size_t>(address - marker.begin);
        marker.faulted = 1;
        g_handled.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
  }
  Chain(sig, info, context);
}

}  // namespace

void InstallRingFaultHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction ours = {};
    ours.sa_sigaction = OnSigbus;
    ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&ours.sa_mask);
    sigaction(SIGBUS, &ours, &g_previous);
  });
}

unsigned long RingFaultsHandled() { return g_handled.load(std::memory_order_relaxed); }

RingFaultScope::RingFaultScope(void* base, std::size_t size) {
  Marker& marker = t_marker;
  saved_ = {marker.begin, marker.end, marker.faulted != 0, marker.offset};
  marker.begin = static_cast<char*>(base);
  marker.end = base == nullptr ? nullptr : static_cast<char*>(base) + size;
  marker.faulted = 0;
  marker.offset = 0;
  // The marker must be in place before the first access to the mapping, which the compiler
  // could otherwise move above these stores (the handler runs on this thread: a signal fence
  // is enough).
  std::atomic_signal_fence(std::memory_order_seq_cst);
}

RingFaultScope::~RingFaultScope() {
  std::atomic_signal_fence(std::memory_order_seq_cst);
  Marker& marker = t_marker;
  const bool faulted = marker.faulted != 0;
  const std::size_t offset = marker.offset;
  const bool same_range = marker.begin == saved_.begin;
  marker.begin = saved_.begin;
  marker.end = saved_.end;
  marker.faulted = saved_.faulted || (faulted && same_range) ? 1 : 0;
  marker.offset = saved_.faulted ? saved_.offset : offset;
}

bool RingFaultScope::faulted() const {
  std::atomic_signal_fence(std::memory_order_seq_cst);
  return t_marker.faulted != 0;
}

std::size_t RingFaultScope::fault_offset() const { return t_marker.offset; }

}  // namespace vramscope::agent
