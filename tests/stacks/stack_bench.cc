// stack_bench: what allocation sites (VRAMSCOPE_STACKS=1) add to each recorded allocation, through
// the preloaded shim, at a realistic stack depth (PyTorch's Python -> libtorch -> c10 stacks are
// 20-40 frames deep at cudaMalloc; a benchmark's shallow main is not).
//
//   LD_PRELOAD=libvramscope.so stack_bench [--depth N] [--pairs N] [--runs N] [--sites N]
//
// It runs itself as a child 2 x --runs times, alternating VRAMSCOPE_STACKS=0 and =1 (a new
// process each: the shim reads its settings once), each child with a ring in a private temporary
// directory (stacks need a ring; VRAMSCOPE_RING_DIR as given is kept). A child calls down through
// --depth distinct functions (each its own code and return address), then times 7 rounds of
// --pairs cuMemAlloc_v2 + cuMemFree_v2 pairs of 4 KiB (the pool's warm hot path), cycling through
// --sites call sites of the allocation, and prints the median round's thread CPU time per pair.
// (The walk meets about 12 frames more than --depth: the bench's own, libc's start, the shim's.)
// Only the allocation walks the stack, so on - off is the cost per recorded allocation.
// Prints each run, the medians of each mode, the extra ns per allocation and a verdict against
// 300 ns. Driver: libcuda.so.1 as the loader finds it (the fake one via LD_LIBRARY_PATH, or the
// real one). Exit status: 0 ok, 1 over 300 ns, 2 bad arguments, 3 a child failed or no ring.
#include <dirent.h>
#include <dlfcn.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace {

using CuInit = int (*)(unsigned);
using CuRetain = int (*)(void**, int);
using CuSetCurrent = int (*)(void*);
using CuMemAlloc = int (*)(unsigned long long*, size_t);
using CuMemFree = int (*)(unsigned long long);

constexpr int kMaxDepth = 64;
constexpr int kMaxSites = 8;
constexpr int kRounds = 7;
constexpr double kGoalNs = 300;

CuMemAlloc g_alloc = nullptr;
CuMemFree g_free = nullptr;
int g_failures = 0;

double ThreadCpuNs() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// One allocation site per S: a distinct call instruction, so a distinct innermost frame.
template <int S>
__attribute__((noinline)) void AllocFree() {
  unsigned long long p = 0;
  if (g_alloc(&p, 4096) != 0 || g_free(p) != 0) ++g_failures;
  asm volatile("" ::: "memory");  // not a tail call
}

using Site = void (*)();
constexpr Site kSites[kMaxSites] = {AllocFree<0>, AllocFree<1>, AllocFree<2>, AllocFree<3>,
                                    AllocFree<4>, AllocFree<5>, AllocFree<6>, AllocFree<7>};

struct Plan {
  int depth;  // frames between main and the timing loop
  int pairs;
  int sites;
  std::vector<double> rounds;  // ns per pair
};

// The timing loop, at the bottom of the chain.
__attribute__((noinline)) void Measure(Plan* plan) {
  for (int i = 0; i < 2000; ++i) kSites[i % plan->sites]();  // warm: pool, rule cache, sites
  for (int r = 0; r < kRounds; ++r) {
    const double start = ThreadCpuNs();
    for (int i = 0; i < plan->pairs; ++i) kSites[i % plan->sites]();
    plan->rounds.push_back((ThreadCpuNs() - start) / plan->pairs);
  }
}

// Level<N>: N frames of distinct functions above Measure (a small local array each, as real
// frames have locals).
template <int N>
__attribute__((noinline)) void Level(Plan* plan, int remaining) {
  volatile char locals[16 + N % 5 * 8];
  locals[0] = static_cast<char>(remaining);
  if (remaining <= 1) {
    Measure(plan);
  } else if constexpr (N + 1 < kMaxDepth) {
    Level<N + 1>(plan, remaining - 1);
  }
  asm volatile("" ::: "memory");
  (void)locals[0];
}

int Child(int depth, int pairs, int sites) {
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  // RTLD_DEFAULT: the preloaded shim's entry points come first, as for a program linked to -lcuda.
  auto init = reinterpret_cast<CuInit>(dlsym(RTLD_DEFAULT, "cuInit"));
  auto retain = reinterpret_cast<CuRetain>(dlsym(RTLD_DEFAULT, "cuDevicePrimaryCtxRetain"));
  auto set_current = reinterpret_cast<CuSetCurrent>(dlsym(RTLD_DEFAULT, "cuCtxSetCurrent"));
  g_alloc = reinterpret_cast<CuMemAlloc>(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
  g_free = reinterpret_cast<CuMemFree>(dlsym(RTLD_DEFAULT, "cuMemFree_v2"));
  void* ctx = nullptr;
  if (cuda == nullptr || init == nullptr || retain == nullptr || set_current == nullptr ||
      g_alloc == nullptr || g_free == nullptr || init(0) != 0 || retain(&ctx, 0) != 0 ||
      set_current(ctx) != 0) {
    fprintf(stderr, "stack_bench: no CUDA driver (%s)\n", cuda == nullptr ? dlerror() : "init");
    return 3;
  }
  Plan plan{depth, pairs, sites, {}};
  Level<0>(&plan, depth);
  if (g_failures != 0) {
    fprintf(stderr, "stack_bench: %d allocations failed\n", g_failures);
    return 3;
  }
  printf("ns_per_pair=%.1f\n", Median(plan.rounds));
  return 0;
}

// Runs this program as a child with VRAMSCOPE_STACKS=`stacks`; its ns per pair, or -1.
double RunChild(const char* self, const std::string& ring_dir, bool stacks, int depth, int pairs,
                int sites) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (strncmp(*e, "VRAMSCOPE_STACKS=", 17) != 0) env.emplace_back(*e);
  }
  env.push_back(std::string("VRAMSCOPE_STACKS=") + (stacks ? "1" : "0"));
  if (getenv("VRAMSCOPE_RING_DIR") == nullptr) env.push_back("VRAMSCOPE_RING_DIR=" + ring_dir);
  std::vector<std::string> args = {self,      "--child",
                                   "--depth", std::to_string(depth),
                                   "--pairs", std::to_string(pairs),
                                   "--sites", std::to_string(sites)};
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  int fds[2];
  if (pipe(fds) != 0) return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  pid_t pid;
  const int spawned = posix_spawn(&pid, self, &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  if (spawned != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  const std::size_t at = out.find("ns_per_pair=");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || at == std::string::npos) return -1;
  return strtod(out.c_str() + at + 12, nullptr);
}

// Ring files the children left in `dir` (removed); stacks need one to be recorded at all.
int RemoveRings(const std::string& dir) {
  int rings = 0;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".ring") == 0) {
      ++rings;
      unlink((dir + "/" + name).c_str());
    }
  }
  closedir(d);
  return rings;
}

}  // namespace

int main(int argc, char** argv) {
  int depth = 30, pairs = 20000, runs = 5, sites = 4;
  bool child = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    int* target = a == "--depth"   ? &depth
                  : a == "--pairs" ? &pairs
                  : a == "--runs"  ? &runs
                  : a == "--sites" ? &sites
                                   : nullptr;
    if (a == "--child") {
      child = true;
    } else if (target != nullptr && i + 1 < argc) {
      *target = atoi(argv[++i]);
    } else {
      fprintf(stderr, "usage: stack_bench [--depth N] [--pairs N] [--runs N] [--sites N]\n");
      return 2;
    }
  }
  if (depth < 1 || depth > kMaxDepth || pairs < 1 || runs < 1 || sites < 1 || sites > kMaxSites) {
    fprintf(stderr, "stack_bench: depth 1-%d, sites 1-%d, pairs and runs >= 1\n", kMaxDepth,
            kMaxSites);
    return 2;
  }
  if (child) return Child(depth, pairs, sites);

  char dir_template[] = "/tmp/stack_bench.XXXXXX";
  const char* made = mkdtemp(dir_template);
  if (made == nullptr) return 3;
  const std::string ring_dir = made;
  const bool own_dir = getenv("VRAMSCOPE_RING_DIR") == nullptr;
  std::vector<double> off, on;
  std::string each;
  int missing_rings = 0;
  for (int r = 0; r < runs; ++r) {
    for (const bool stacks : {false, true}) {
      const double ns = RunChild("/proc/self/exe", ring_dir, stacks, depth, pairs, sites);
      if (ns < 0) {
        fprintf(stderr, "stack_bench: the child failed (stacks %s)\n", stacks ? "on" : "off");
        rmdir(ring_dir.c_str());
        return 3;
      }
      if (own_dir && RemoveRings(ring_dir) == 0) ++missing_rings;
      (stacks ? on : off).push_back(ns);
      char item[64];
      snprintf(item, sizeof(item), "%s%s %.0f", each.empty() ? "" : ", ", stacks ? "on" : "off",
               ns);
      each += item;
    }
  }
  rmdir(ring_dir.c_str());
  const double off_ns = Median(off), on_ns = Median(on), extra = on_ns - off_ns;
  printf(
      "stack_bench: depth=%d sites=%d pairs=%d runs=%d; ns per 4 KiB alloc+free pair, thread "
      "CPU, each run's median of %d rounds: %s\n",
      depth, sites, pairs, runs, kRounds, each.c_str());
  printf(
      "stack_bench: medians: stacks off %.1f ns, stacks on %.1f ns; extra per recorded "
      "allocation %.1f ns (goal <= %.0f)\n",
      off_ns, on_ns, extra, kGoalNs);
  if (missing_rings != 0) {
    printf("stack_bench: verdict: FAIL %d children opened no ring (stacks were not recorded)\n",
           missing_rings);
    return 3;
  }
  const bool ok = extra <= kGoalNs;
  printf("stack_bench: verdict: %s (%.0f ns extra per allocation at depth %d)\n",
         ok ? "ok" : "FAIL", extra, depth);
  return ok ? 0 : 1;
}
