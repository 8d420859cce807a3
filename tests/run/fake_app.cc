// A stand-in for a CUDA program under the shim: writes the records the shim would (pool reserve,
// NVTX ranges, allocations, frees) into a ring in $VRAMSCOPE_RING_DIR, then exits as told.
//
//   run_fake_app [--allocs N] [--size BYTES] [--leak K] [--fork] [--fork-killed] [--oom]
//                [--orphan-ms MS] [--exit CODE] [--signal SIG] [--abort] [--linger-ms MS]
//                [--file NAME] [--peak-time-file PATH]
// --peak-time-file PATH: once the last allocation of the workload is recorded (the peak), writes
// "PID NS\n" there, NS the wall clock (CLOCK_REALTIME) just after it.
// --file NAME is ignored: it puts NAME (any bytes) on the command line the ring records.
// Pool: one reserve of N * size rounded up to 2 MiB; each block's allocated size is the
// request rounded up to 512 bytes. --leak K leaves the last K blocks unfreed. --fork: a child
// (with its own ring, as the shim does after fork) allocates N/2 blocks and exits 0 first.
// --fork-killed: the child allocates N/2 blocks, frees none, and is killed with SIGKILL by this
// process (no exit record: it vanishes), which then goes on. After its workload the program
// works --linger-ms more (a sleep standing for work without allocations), then raises --signal
// SIG, or calls abort() with --abort, or exits with --exit CODE through its exit record.
// --orphan-ms MS: a child with its own ring allocates N/2 blocks and outlives this process by
// about MS ms (this process goes on once the child's ring exists), then exits 4 through its
// exit record. $VRAMSCOPE_LABELS goes into the main ring as the shim writes it.
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>

#include "vramscope/ring/ring_writer.h"

namespace {

using vramscope::interposer::RingError;
using vramscope::interposer::RingWriter;

constexpr std::uint64_t kBase = 0x7f0000000000;

std::uint64_t RoundUp(std::uint64_t v, std::uint64_t to) { return (v + to - 1) / to * to; }

// "PID NS\n" into `path` (written as PATH.tmp, then renamed: a reader sees all of it or none).
void WritePeakTime(const char* path) {
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  char tmp[4096];
  std::snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  FILE* out = std::fopen(tmp, "w");
  if (out == nullptr) return;
  std::fprintf(out, "%d %lld\n", static_cast<int>(getpid()),
               static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec);
  std::fclose(out);
  std::rename(tmp, path);
}

void Workload(RingWriter& ring, std::uint64_t allocs, std::uint64_t size, std::uint64_t leak,
              bool oom, const char* peak_time_file = nullptr) {
  const std::uint64_t rounded = RoundUp(size, 512);
  const std::uint64_t segment = RoundUp(allocs * rounded, 2 << 20);
  ring.RecordPoolReserve(0, kBase, segment);
  const char kStep[] = "step";
  ring.RecordNvtxPush(0, 1, 0, 0, kStep, strlen(kStep), nullptr, 0);
  for (std::uint64_t i = 0; i < allocs; ++i) {
    ring.RecordAlloc(0, kBase + i * rounded, size, rounded, VRAMSCOPE_RING_ALLOC_POOLED);
  }
  if (peak_time_file != nullptr) WritePeakTime(peak_time_file);
  vramscope_ring_pool_state_payload state = {};
  state.free_bytes = segment - allocs * rounded;
  state.largest_free_block_bytes = state.free_bytes;
  state.reserved_bytes = segment;
  ring.RecordPoolState(0, state);
  if (oom) ring.RecordOom(0, segment * 4, state.free_bytes, state.largest_free_block_bytes, 0);
  for (std::uint64_t i = 0; i + leak < allocs; ++i) {
    ring.RecordFree(0, kBase + i * rounded, size, rounded, VRAMSCOPE_RING_ALLOC_POOLED);
  }
  ring.RecordNvtxPop(0, 1);
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t allocs = 10, size = 1 << 20, leak = 0;
  int exit_code = 0, sig = 0;
  bool fork_child = false, fork_killed = false, oom = false, do_abort = false;
  unsigned linger_ms = 0, orphan_ms = 0;
  const char* peak_time_file = nullptr;
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : "0";
    if (strcmp(arg, "--allocs") == 0) {
      allocs = strtoull(next, nullptr, 10), ++i;
    } else if (strcmp(arg, "--size") == 0) {
      size = strtoull(next, nullptr, 10), ++i;
    } else if (strcmp(arg, "--leak") == 0) {
      leak = strtoull(next, nullptr, 10), ++i;
    } else if (strcmp(arg, "--exit") == 0) {
      exit_code = atoi(next), ++i;
    } else if (strcmp(arg, "--signal") == 0) {
      sig = atoi(next), ++i;
    } else if (strcmp(arg, "--fork") == 0) {
      fork_child = true;
    } else if (strcmp(arg, "--fork-killed") == 0) {
      fork_killed = true;
    } else if (strcmp(arg, "--abort") == 0) {
      do_abort = true;
    } else if (strcmp(arg, "--orphan-ms") == 0) {
      orphan_ms = static_cast<unsigned>(atoi(next)), ++i;
    } else if (strcmp(arg, "--linger-ms") == 0) {
      linger_ms = static_cast<unsigned>(atoi(next)), ++i;
    } else if (strcmp(arg, "--oom") == 0) {
      oom = true;
    } else if (strcmp(arg, "--peak-time-file") == 0) {
      peak_time_file = next, ++i;
    } else if (strcmp(arg, "--file") == 0) {
      ++i;
    } else {
      std::fprintf(stderr, "run_fake_app: unknown argument %s\n", arg);
      return 64;
    }
  }
  if (leak > allocs) leak = allocs;

  // Like the shim under `vramscope run`: no ring directory configured means no recording, and the
  // program still runs.
  const char* const dir = getenv("VRAMSCOPE_RING_DIR");
  RingWriter ring;
  const bool recording = dir != nullptr && ring.Open({.dir = dir}) == RingError::kOk;
  if (recording) {
    const std::uint8_t uuid[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    ring.SetDeviceInfo(0, "Fake GPU", uuid, 80ull << 30);
    // Labels as the shim writes them (the reader checks them).
    if (const char* labels = getenv("VRAMSCOPE_LABELS"); labels != nullptr && labels[0] != '\0') {
      ring.RecordLabels(labels, strlen(labels));
    }
  }
  if (fork_child) {
    const pid_t child = fork();
    if (child == 0) {
      RingWriter own;  // the child of a fork starts clean, with its own ring
      ring.Close();
      if (recording && own.Open({.dir = dir}) == RingError::kOk) {
        Workload(own, allocs / 2, size, 0, false);
        own.MarkExited(0);
      }
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
  }
  if (fork_killed) {
    int ready[2];
    if (pipe(ready) != 0) return 70;
    const pid_t child = fork();
    if (child == 0) {
      RingWriter own;
      ring.Close();
      if (recording && own.Open({.dir = dir}) == RingError::kOk) {
        Workload(own, allocs / 2, size, allocs / 2, false);
      }
      const char byte = 1;
      if (write(ready[1], &byte, 1) != 1) _exit(71);
      for (;;) pause();  // until killed
    }
    close(ready[1]);
    char byte = 0;
    if (read(ready[0], &byte, 1) != 1) return 72;
    close(ready[0]);
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
  }
  if (orphan_ms > 0) {
    int ready[2];
    if (pipe(ready) != 0) return 70;
    if (fork() == 0) {
      RingWriter own;
      ring.Close();
      const bool mine = recording && own.Open({.dir = dir}) == RingError::kOk;
      if (mine) Workload(own, allocs / 2, size, 0, false);
      const char byte = 1;
      if (write(ready[1], &byte, 1) != 1) _exit(71);
      usleep(orphan_ms * 1000u);
      if (mine) own.MarkExited(4);
      _exit(4);
    }
    close(ready[1]);
    char byte = 0;
    if (read(ready[0], &byte, 1) != 1) return 72;
    close(ready[0]);
  }
  if (recording) Workload(ring, allocs, size, leak, oom, peak_time_file);
  if (linger_ms > 0) usleep(linger_ms * 1000u);
  if (do_abort) abort();
  if (sig != 0) raise(sig);
  if (recording) ring.MarkExited(exit_code);
  return exit_code;
}
