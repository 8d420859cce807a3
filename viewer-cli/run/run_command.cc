// `vramscope run`: see run_command.h. The main job of vramscope with no daemon: start CMD with
// LD_PRELOAD=libvramscope.so and a private ring directory, drain while it runs, report at exit.
#include "run/run_command.h"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/time/time.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/command.h"
#include "common/labels_arg.h"
#include "common/perfetto_trace.h"
#include "common/recorded_events.h"
#include "common/report_text.h"
#include "common/size.h"
#include "common/symbolize.h"
#include "drain/ring_directory.h"
#include "run/chrome_trace.h"
#include "run/ring_session.h"
#include "vramscope/agent/outbox.h"
#include "vramscope/agent/uplink.h"
#include "vramscope/log.h"
#include "vramscope/net_security.h"

namespace vramscope::cli {
namespace {

constexpr int kPollIntervalMs = 10;
// After the report, how long to wait for the collector to acknowledge everything (--collector).
constexpr absl::Duration kCollectorWait = absl::Seconds(10);

struct RunOptions {
  std::string json_path;
  std::string trace_path;   // .pftrace: Perfetto protobuf; otherwise Chrome JSON
  std::string events_path;  // --events FILE: the event log `vramscope export` reads
  std::optional<std::uint64_t> max_peak;
  std::string collector;
  net::ClientSecurity security;  // how to reach the collector
  bool live = false;
  bool cupti = true;
  bool stacks = true;       // VRAMSCOPE_STACKS=1 for CMD unless --no-stacks
  bool no_stacks = false;   // --no-stacks given
  std::string folded_path;  // --folded FILE
  std::vector<char*> command;
  // --label KEY=VALUE merged over the environment's VRAMSCOPE_LABELS, as the child's
  // VRAMSCOPE_LABELS (empty: leave the environment as it is).
  std::string labels_text;
};

RunLiveViewFactory g_live_view_factory = nullptr;

void PrintRunUsage(std::FILE* out) {
  std::fprintf(
      out,
      "usage: vramscope run [--json FILE] [--trace FILE] [--events FILE] [--max-peak SIZE]\n"
      "                     [--collector ADDR] [--live] [--no-stacks] [--folded FILE]\n"
      "                     [--no-cupti] [--label KEY=VALUE]... [--] CMD [ARGS...]\n"
      "\n"
      "Runs CMD with the vramscope shim preloaded (no daemon needed). CMD and every process it\n"
      "starts are traced; at exit a report per process and device goes to stderr: peak\n"
      "requested, allocated and reserved bytes, fragmentation, counts, NVTX ranges, top sites,\n"
      "memory not freed at exit.\n"
      "\n"
      "options:\n"
      "  --json FILE       write the report as JSON (proto field names): one process -> a\n"
      "                    vramscope.v1.Report object; otherwise {\"reports\": [Report, ...]}\n"
      "  --trace FILE      write a trace for ui.perfetto.dev: FILE.pftrace a Perfetto protobuf\n"
      "                    trace (allocations as slices per device with their stacks as\n"
      "                    callstacks, exact requested/allocated/reserved counters, NVTX\n"
      "                    ranges); any other name a Chrome trace (JSON): per device counter\n"
      "                    tracks \"cuda:N allocated/reserved/requested\" (and \"cuda:N CUPTI\n"
      "                    device bytes\" with CUPTI), allocations as async slices, NVTX ranges\n"
      "  --events FILE     write every allocation, free, pool reservation, NVTX range and site\n"
      "                    as an event log, for `vramscope export --format torch-snapshot`\n"
      "  --max-peak SIZE   exit 1 when any process's peak RESERVED bytes on any device (what the\n"
      "                    driver held for it: the figure that runs out) exceed SIZE; SIZE is\n"
      "                    bytes or 512MiB, 4GiB, 1.5GB, 2G (K/M/G/T and KiB.. = 1024-based,\n"
      "                    KB/MB/GB/TB = 1000-based)\n"
      "  --collector ADDR  also stream the events to vramscope-collector at ADDR (HOST:PORT)\n"
      "                    while CMD runs, as vramscope-agent does (batches, sequence numbers,\n"
      "                    resend after a reconnect); after the report, wait up to 10 s for the\n"
      "                    collector to acknowledge everything. If it does not, a warning says\n"
      "                    so; the local report and files are complete either way. How to\n"
      "                    reach it (TLS, token; as vramscope-agent):\n"
      "%s"
      "  --live            show the live dashboard (as `vramscope top`) while CMD runs; on a\n"
      "                    terminal CMD reads /dev/null and its output is held back and\n"
      "                    printed when it exits; otherwise one plain line per process and\n"
      "                    device every second on stdout\n"
      "  --no-cupti        do not load CUPTI in CMD (default: VRAMSCOPE_CUPTI=1 unless the\n"
      "                    environment sets VRAMSCOPE_CUPTI: the driver's own memory records,\n"
      "                    reported as \"CUPTI (driver view)\" and traced as \"cuda:N CUPTI "
      "device\n"
      "                    bytes\"; if another tool holds CUPTI, one warning and hooks only)\n"
      "  --no-stacks       do not record allocation call stacks. By default CMD records the\n"
      "                    native call stack of every allocation (VRAMSCOPE_STACKS=1 unless\n"
      "                    the environment sets VRAMSCOPE_STACKS; about 0.2 us each, walked\n"
      "                    in CMD with cached unwind rules, resolved here with libdw): the\n"
      "                    report's top allocation sites get function (file:line) frames,\n"
      "                    and it lists the peak requested bytes of each calling library\n"
      "                    (--stacks, the old switch, is still accepted)\n"
      "  --folded FILE     write folded stacks for flamegraph.pl/speedscope:\n"
      "                    \"outermost;...;innermost BYTES\", BYTES = total requested bytes\n"
      "                    allocated from that stack over the run (every site, not only the top)\n"
      "  --label KEY=VALUE a label of this run (repeatable): job name, git commit, test id;\n"
      "                    KEY is [A-Za-z_][A-Za-z0-9_]* (64 bytes at most), VALUE UTF-8 (256\n"
      "                    bytes at most). Merged over the environment's VRAMSCOPE_LABELS\n"
      "                    (k=v,k=v) and passed to CMD in it; in reports and the collector's\n"
      "                    run history\n"
      "  -h, --help        this text\n"
      "\n"
      "NVTX ranges are received through NVTX_INJECTION64_PATH, set to the shim unless already\n"
      "set (no change to CMD needed).\n"
      "The shim is found at $VRAMSCOPE_SHIM, else next to this executable (build tree:\n"
      "../interposer/shim/libvramscope.so; installed: ../lib/libvramscope.so).\n"
      "exit status: CMD's (128+N when killed by signal N, 127 when it cannot start); when CMD\n"
      "succeeded: 1 if --max-peak was exceeded, else 2 if an output file could not be written,\n"
      "else 3 if --collector was given and the collector did not acknowledge every event\n"
      "within the 10 s (unreachable, refused, or events dropped beyond the 256 MiB kept in\n"
      "memory for it); 2 for usage errors.\n",
      net::kClientFlagsHelp);
}

// One --label; false after printing why.
bool TakeLabel(const std::string& label, Labels* labels) {
  absl::Status s = AddLabelArg(label, labels);
  if (!s.ok()) std::fprintf(stderr, "vramscope run: %s\n", std::string(s.message()).c_str());
  return s.ok();
}

// `--label`s over the environment's VRAMSCOPE_LABELS, as the text for CMD's. False after
// printing why (a malformed VRAMSCOPE_LABELS, or more than the shim takes).
bool MergeLabels(const Labels& given, std::string* text) {
  Labels merged;
  if (const char* env = getenv("VRAMSCOPE_LABELS"); env != nullptr) {
    if (absl::Status s = ParseLabelsText(env, &merged); !s.ok()) {
      std::fprintf(stderr, "vramscope run: VRAMSCOPE_LABELS in the environment: %s\n",
                   std::string(s.message()).c_str());
      return false;
    }
  }
  for (const auto& [key, value] : given) merged[key] = value;
  absl::StatusOr<std::string> formatted = FormatLabelsText(merged);
  if (!formatted.ok()) {
    std::fprintf(stderr, "vramscope run: --label: %s\n",
                 std::string(formatted.status().message()).c_str());
    return false;
  }
  *text = *std::move(formatted);
  return true;
}

// Returns nullopt after printing the problem (usage error) or for --help (help set).
std::optional<RunOptions> ParseArgs(int argc, char** argv, bool* help) {
  RunOptions options;
  Labels labels;
  int i = 1;
  auto value = [&](std::string_view flag, std::string* out) -> bool {
    const std::string_view arg = argv[i];
    if (arg.size() > flag.size() && arg.substr(0, flag.size()) == flag && arg[flag.size()] == '=') {
      *out = std::string(arg.substr(flag.size() + 1));
      return true;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "vramscope run: %.*s needs a value\n", static_cast<int>(flag.size()),
                   flag.data());
      return false;
    }
    *out = argv[++i];
    return true;
  };
  auto matches = [&](std::string_view flag) {
    const std::string_view arg = argv[i];
    return arg == flag || (arg.size() > flag.size() && arg.substr(0, flag.size()) == flag &&
                           arg[flag.size()] == '=');
  };
  for (; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      *help = true;
      return std::nullopt;
    }
    if (matches("--json")) {
      if (!value("--json", &options.json_path)) return std::nullopt;
    } else if (matches("--trace")) {
      if (!value("--trace", &options.trace_path)) return std::nullopt;
    } else if (matches("--events")) {
      if (!value("--events", &options.events_path)) return std::nullopt;
      if (options.events_path.empty()) {
        std::fprintf(stderr, "vramscope run: --events needs a file name\n");
        return std::nullopt;
      }
    } else if (matches("--max-peak")) {
      std::string size;
      if (!value("--max-peak", &size)) return std::nullopt;
      options.max_peak = ParseSize(size);
      if (!options.max_peak) {
        std::fprintf(stderr,
                     "vramscope run: --max-peak '%s' is not a size (examples: 4GiB, 512MiB, "
                     "1.5GB, 1073741824)\n",
                     size.c_str());
        return std::nullopt;
      }
    } else if (matches("--collector")) {
      if (!value("--collector", &options.collector)) return std::nullopt;
      if (options.collector.empty()) {
        std::fprintf(stderr, "vramscope run: --collector needs HOST:PORT (e.g. 127.0.0.1:7411)\n");
        return std::nullopt;
      }
    } else if (const std::string_view name = arg.substr(0, arg.find('='));
               net::IsClientFlag(name)) {
      std::string flag_value;
      if (!value(name, &flag_value)) return std::nullopt;
      net::SetClientFlag(name, flag_value, &options.security);
    } else if (arg == "--live") {
      options.live = true;
    } else if (arg == "--no-cupti") {
      options.cupti = false;
    } else if (arg == "--stacks") {
      options.stacks = true;
    } else if (arg == "--no-stacks") {
      options.no_stacks = true;
    } else if (matches("--folded")) {
      if (!value("--folded", &options.folded_path)) return std::nullopt;
      if (options.folded_path.empty()) {
        std::fprintf(stderr, "vramscope run: --folded needs a file name\n");
        return std::nullopt;
      }
      options.stacks = true;
    } else if (matches("--label")) {
      std::string label;
      if (!value("--label", &label) || !TakeLabel(label, &labels)) return std::nullopt;
    } else if (!arg.empty() && arg[0] == '-') {
      std::fprintf(stderr, "vramscope run: unknown option '%s'\n", argv[i]);
      return std::nullopt;
    } else {
      break;  // CMD starts here
    }
  }
  for (; i < argc; ++i) options.command.push_back(argv[i]);
  if (options.command.empty()) {
    std::fprintf(stderr, "vramscope run: no command given\n");
    return std::nullopt;
  }
  if (options.no_stacks) {
    if (!options.folded_path.empty()) {
      std::fprintf(stderr, "vramscope run: --folded needs the stacks that --no-stacks turns off\n");
      return std::nullopt;
    }
    options.stacks = false;
  }
  if (!labels.empty() && !MergeLabels(labels, &options.labels_text)) return std::nullopt;
  return options;
}

bool IsFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The shim: $VRAMSCOPE_SHIM, else relative to this executable. Empty after printing why.
std::string FindShim() {
  if (const char* env = getenv("VRAMSCOPE_SHIM"); env != nullptr && env[0] != '\0') {
    if (IsFile(env)) return env;
    std::fprintf(stderr, "vramscope run: VRAMSCOPE_SHIM=%s is not a file\n", env);
    return "";
  }
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  std::vector<std::string> tried;
  if (n > 0) {
    exe[n] = '\0';
    std::string dir = exe;
    dir = dir.substr(0, dir.rfind('/'));
    for (const char* relative :
         {"/../interposer/shim/libvramscope.so", "/../lib/libvramscope.so",
          "/../lib/x86_64-linux-gnu/libvramscope.so", "/../lib64/libvramscope.so"}) {
      std::string candidate = dir + relative;
      if (IsFile(candidate)) return candidate;
      tried.push_back(candidate);
    }
  }
  std::fprintf(stderr, "vramscope run: cannot find libvramscope.so (looked at:");
  for (const std::string& path : tried) std::fprintf(stderr, " %s", path.c_str());
  std::fprintf(stderr, "); set VRAMSCOPE_SHIM=/path/to/libvramscope.so\n");
  return "";
}

// A private directory for the rings: on /dev/shm when usable (memory, not disk), else $TMPDIR.
std::string MakeRingDir() {
  std::vector<std::string> bases;
  // A container's /dev/shm is often 64 MiB: 16 rings of 4 MiB. Use it only with room to spare.
  struct statvfs shm;
  if (access("/dev/shm", W_OK) == 0 && statvfs("/dev/shm", &shm) == 0 &&
      static_cast<std::uint64_t>(shm.f_bavail) * shm.f_frsize >= (256ull << 20)) {
    bases.push_back("/dev/shm");
  }
  const char* tmp = getenv("TMPDIR");
  bases.push_back(tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp");
  for (const std::string& base : bases) {
    std::string pattern = base + "/vramscope-run.XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) return pattern;
  }
  return "";
}

void RemoveRingDir(const std::string& dir) {
  agent::RingDirectory rings(dir);
  // Ring files and any ".tmp" a writer left half-created.
  if (absl::StatusOr<std::vector<std::string>> found = rings.Scan(); found.ok()) {
    for (const std::string& path : *found) unlink(path.c_str());
  }
  rmdir(dir.c_str());  // fails (harmlessly) if a writer is still creating a file
}

volatile sig_atomic_t g_child = 0;

void ForwardSignal(int sig) {
  if (g_child > 0) kill(g_child, sig);
}

// fork + exec with the shim preloaded. Returns the pid, or -1 after printing why (exec errors
// come back through a close-on-exec pipe, so "command not found" is reported by us).
// With output_fd >= 0 (--live on a terminal), CMD's stdout and stderr go there and stdin is
// /dev/null.
pid_t Spawn(const RunOptions& options, const std::string& shim, const std::string& ring_dir,
            int* exec_errno, int output_fd = -1) {
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) return -1;
  const pid_t pid = fork();
  if (pid < 0) {
    close(report[0]);
    close(report[1]);
    return -1;
  }
  if (pid == 0) {
    // The child: default signal handling, the shim after anything already preloaded (ASan's
    // runtime must stay first).
    signal(SIGINT, SIG_DFL);
    signal(SIGQUIT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    const char* existing = getenv("LD_PRELOAD");
    const std::string preload =
        existing != nullptr && existing[0] != '\0' ? std::string(existing) + ":" + shim : shim;
    setenv("LD_PRELOAD", preload.c_str(), 1);
    setenv("VRAMSCOPE_RING_DIR", ring_dir.c_str(), 1);
    // NVTX ranges: every NVTX copy in CMD loads this path and finds the preloaded shim there.
    setenv("NVTX_INJECTION64_PATH", shim.c_str(), /*overwrite=*/0);
    // Stacks on by default; an explicit VRAMSCOPE_STACKS is the user's choice, --no-stacks wins.
    setenv("VRAMSCOPE_STACKS", options.stacks ? "1" : "0", options.stacks ? 0 : 1);
    if (!options.labels_text.empty()) setenv("VRAMSCOPE_LABELS", options.labels_text.c_str(), 1);
    // CUPTI's memory records on by default; an explicit VRAMSCOPE_CUPTI is the user's choice.
    setenv("VRAMSCOPE_CUPTI", options.cupti ? "1" : "0", options.cupti ? 0 : 1);
    if (output_fd >= 0) {
      const int null_fd = open("/dev/null", O_RDONLY);
      if (null_fd >= 0) dup2(null_fd, 0);
      dup2(output_fd, 1);
      dup2(output_fd, 2);
    }
    std::vector<char*> args = options.command;
    args.push_back(nullptr);
    execvp(args[0], args.data());
    const int err = errno;
    if (write(report[1], &err, sizeof(err)) != sizeof(err)) {
      // Nothing more to do: the parent sees exit status 127 either way.
    }
    _exit(err == ENOENT ? 127 : 126);
  }
  close(report[1]);
  int err = 0;
  ssize_t n;
  do {
    n = read(report[0], &err, sizeof(err));
  } while (n < 0 && errno == EINTR);
  close(report[0]);
  *exec_errno = n == sizeof(err) ? err : 0;
  return pid;
}

// Waits for the child while draining; returns its wait status.
int Supervise(pid_t child, RingSession& session, RunLiveView* live) {
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, child, 0));
  int status = 0;
  for (;;) {
    if (absl::Status s = session.Poll(); !s.ok()) {
      std::fprintf(stderr, "vramscope run: %s\n", std::string(s.message()).c_str());
    }
    if (live != nullptr) live->Tick([&session] { return session.Reports(); });
    if (pidfd >= 0) {
      // Wakes as soon as the child exits, else after the poll interval.
      pollfd fd = {pidfd, POLLIN, 0};
      poll(&fd, 1, kPollIntervalMs);
    } else {
      poll(nullptr, 0, kPollIntervalMs);
    }
    const pid_t done = waitpid(child, &status, WNOHANG);
    if (done == child) {
      timespec now{};
      clock_gettime(CLOCK_MONOTONIC, &now);  // the event clock
      session.ChildExited(status, static_cast<std::uint64_t>(now.tv_sec) * 1000000000u +
                                      static_cast<std::uint64_t>(now.tv_nsec));
      break;
    }
    if (done < 0 && errno != EINTR) {
      session.ChildExited(-1, 0);
      break;
    }
  }
  if (pidfd >= 0) close(pidfd);
  return status;
}

bool WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  if (!out) {
    std::fprintf(stderr, "vramscope run: cannot write %s: %s\n", path.c_str(), strerror(errno));
    return false;
  }
  return true;
}

// Waits (bounded) for the collector to acknowledge every batch, stops the uplink, and prints
// one line on how delivery went. False when something was left unacknowledged or dropped.
bool WaitForCollector(const std::string& address, agent::Outbox& outbox, agent::Uplink& uplink) {
  const bool acked = outbox.WaitAllAcked(kCollectorWait);
  uplink.Stop();
  const agent::AgentCounters c = outbox.counters();
  if (acked && c.batches_rejected > 0) {
    // Every batch was answered; the rejections are told below.
  } else if (acked) {
    std::fprintf(stderr,
                 "vramscope run: collector %s acknowledged all %llu events (%llu batches)\n",
                 address.c_str(), static_cast<unsigned long long>(c.events_cut),
                 static_cast<unsigned long long>(c.batches_cut));
  } else if (!uplink.ever_connected()) {
    std::fprintf(stderr,
                 "vramscope run: WARNING: cannot reach the collector at %s within %s: none of "
                 "%llu events (%llu batches) was stored there (%s). The report above is "
                 "complete; check --collector and that vramscope-collector runs there.\n",
                 address.c_str(), absl::FormatDuration(kCollectorWait).c_str(),
                 static_cast<unsigned long long>(c.events_cut),
                 static_cast<unsigned long long>(c.batches_cut),
                 std::string(uplink.last_error().message()).c_str());
  } else {
    std::fprintf(stderr,
                 "vramscope run: WARNING: the collector at %s acknowledged %llu of %llu batches "
                 "within %s (%s); the rest was not stored there. The report above is "
                 "complete.\n",
                 address.c_str(), static_cast<unsigned long long>(c.batches_acked),
                 static_cast<unsigned long long>(c.batches_cut),
                 absl::FormatDuration(kCollectorWait).c_str(),
                 std::string(uplink.last_error().message()).c_str());
  }
  if (c.batches_rejected > 0) {
    std::fprintf(stderr,
                 "vramscope run: WARNING: the collector at %s rejected %llu batches (%llu events) "
                 "as invalid: %s. The report above is complete.\n",
                 address.c_str(), static_cast<unsigned long long>(c.batches_rejected),
                 static_cast<unsigned long long>(c.events_rejected),
                 outbox.first_reject_reason().c_str());
  }
  if (c.batches_dropped > 0) {
    std::fprintf(stderr,
                 "vramscope run: WARNING: %llu events (%llu batches) were not sent to the "
                 "collector: more than the 256 MiB of unacknowledged batches kept in memory\n",
                 static_cast<unsigned long long>(c.events_dropped),
                 static_cast<unsigned long long>(c.batches_dropped));
  }
  return acked && c.batches_dropped == 0 && c.batches_rejected == 0;
}

// Copies what CMD wrote while the dashboard held the terminal to stderr.
void ReplayHeldOutput(int fd) {
  if (lseek(fd, 0, SEEK_SET) != 0) return;
  char buffer[65536];
  bool first = true;
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) {
    if (first) std::fprintf(stderr, "vramscope run: CMD's output while the dashboard was shown:\n");
    first = false;
    std::fwrite(buffer, 1, static_cast<std::size_t>(n), stderr);
  }
}

}  // namespace

void SetRunLiveViewFactory(RunLiveViewFactory factory) { g_live_view_factory = factory; }

int RunRun(int argc, char** argv) {
  bool help = false;
  const std::optional<RunOptions> parsed = ParseArgs(argc, argv, &help);
  if (help) {
    PrintRunUsage(stdout);
    return kExitOk;
  }
  if (!parsed) {
    std::fprintf(stderr, "`vramscope run --help` for usage\n");
    return kExitUsage;
  }
  const RunOptions& options = *parsed;
  if (options.live && g_live_view_factory == nullptr) {
    std::fprintf(stderr, "vramscope run: --live is not available in this build\n");
    return kExitUsage;
  }
  absl::StatusOr<net::ClientCredentials> credentials = net::LoadClientCredentials(options.security);
  if (!credentials.ok()) {
    std::fprintf(stderr, "vramscope run: %s\n",
                 std::string(credentials.status().message()).c_str());
    return kExitUsage;
  }
  const std::string shim = FindShim();
  if (shim.empty()) return kExitUsage;
  const std::string ring_dir = MakeRingDir();
  if (ring_dir.empty()) {
    std::fprintf(stderr, "vramscope run: cannot create a ring directory in /dev/shm or $TMPDIR\n");
    return kExitUsage;
  }

  ChromeTrace trace;
  // --collector: the agent library's Outbox (sequence numbers, memory bound, counted drops) and
  // Uplink (stream, acknowledgements, reconnect and resend), as vramscope-agent uses them.
  std::unique_ptr<agent::Outbox> outbox;
  if (!options.collector.empty()) {
    // The uplink's per-retry warnings would interleave with CMD's output; one summary line
    // after the report says how delivery went.
    vramscope::SetMinLogLevel(vramscope::LogLevel::kError);
    outbox = std::make_unique<agent::Outbox>(agent::OutboxOptions{});
  }
  collector::StatsOptions stats_options;
  const std::size_t shown_sites = stats_options.max_top_sites;
  // --folded wants every site; the report keeps its usual top ones.
  if (!options.folded_path.empty()) stats_options.max_top_sites = SIZE_MAX;
  RingSession session(ring_dir, stats_options, options.trace_path.empty() ? nullptr : &trace,
                      outbox.get());
  // The per-allocation events, for --events and a Perfetto --trace.
  const bool perfetto = absl::EndsWith(options.trace_path, ".pftrace");
  RecordedEvents recorded;
  if (perfetto || !options.events_path.empty()) session.SetRecorder(&recorded);

  // Ctrl-C reaches CMD through the terminal's process group; we outlive it to report.
  struct sigaction ignore = {}, forward = {}, old_int, old_quit, old_term, old_hup;
  ignore.sa_handler = SIG_IGN;
  forward.sa_handler = ForwardSignal;
  sigaction(SIGINT, &ignore, &old_int);
  sigaction(SIGQUIT, &ignore, &old_quit);
  sigaction(SIGTERM, &forward, &old_term);
  sigaction(SIGHUP, &forward, &old_hup);

  // --live: the view; on a terminal CMD's output is held in an unlinked file meanwhile.
  std::unique_ptr<RunLiveView> live = options.live ? g_live_view_factory() : nullptr;
  int held_output = -1;
  if (live != nullptr && live->TakesTerminal()) {
    std::string held = ring_dir + "/output.XXXXXX";
    held_output = mkostemp(held.data(), O_CLOEXEC);
    if (held_output >= 0) unlink(held.c_str());
  }
  int exec_errno = 0;
  const pid_t child = Spawn(options, shim, ring_dir, &exec_errno, held_output);
  // Started after the fork: the child execs at once and needs none of gRPC's threads.
  std::unique_ptr<agent::Uplink> uplink;
  if (outbox != nullptr) {
    agent::UplinkOptions uplink_options;
    uplink_options.collector = options.collector;
    uplink_options.credentials = *credentials;
    // A collector that comes up late is found within a second, well inside kCollectorWait.
    uplink_options.max_backoff = absl::Seconds(1);
    uplink = std::make_unique<agent::Uplink>(outbox.get(), uplink_options);
    uplink->Start();
  }
  int exit_code;
  if (child < 0) {
    std::fprintf(stderr, "vramscope run: cannot start a process: %s\n", strerror(errno));
    exit_code = 126;
  } else {
    g_child = child;
    session.WatchChild(static_cast<std::uint32_t>(child));
    const int status = Supervise(child, session, live.get());
    g_child = 0;
    if (exec_errno != 0) {
      std::fprintf(stderr, "vramscope run: cannot run %s: %s\n", options.command[0],
                   strerror(exec_errno));
    }
    exit_code = WIFEXITED(status)     ? WEXITSTATUS(status)
                : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                      : 1;
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGQUIT, &old_quit, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);

  if (absl::Status s = session.Finish(); !s.ok()) {
    std::fprintf(stderr, "vramscope run: %s\n", std::string(s.message()).c_str());
  }
  std::vector<v1::Report> reports = session.Reports();
  bool outputs_ok = true;
  if (options.stacks) {
    const SymbolizeResult symbols = SymbolizeReports(&reports);
    if (symbols.unreadable_modules > 0) {
      std::fprintf(stderr,
                   "vramscope run: %zu modules of the allocation sites could not be read as "
                   "ELF files; their frames are shown as MODULE+0xOFFSET\n",
                   symbols.unreadable_modules);
    }
    if (recorded.events() > 0) SymbolizeSites(&recorded);
    if (!options.folded_path.empty()) {
      outputs_ok &= WriteFile(options.folded_path, FoldedStacks(reports));
      for (v1::Report& report : reports) {
        for (v1::DeviceReport& device : *report.mutable_devices()) {
          auto* sites = device.mutable_top_sites();
          if (static_cast<std::size_t>(sites->size()) > shown_sites) {
            sites->DeleteSubrange(static_cast<int>(shown_sites),
                                  sites->size() - static_cast<int>(shown_sites));
          }
        }
      }
    }
  }
  RemoveRingDir(ring_dir);
  if (live != nullptr) live->Close(reports);
  if (held_output >= 0) {
    ReplayHeldOutput(held_output);
    close(held_output);
  }

  for (const std::string& warning : session.warnings()) {
    std::fprintf(stderr, "vramscope run: %s\n", warning.c_str());
  }
  if (reports.empty() && exec_errno == 0) {
    std::fprintf(stderr,
                 "vramscope run: no process wrote an event ring (the shim records only programs "
                 "that use the CUDA driver)\n");
  }
  // Processes that never touched device memory (a wrapper shell, a launcher) get one line.
  int idle = 0;
  for (const v1::Report& report : reports) {
    if (report.devices().empty() && reports.size() > 1) {
      ++idle;
      continue;
    }
    std::fputs(FormatRunReport(report).c_str(), stderr);
  }
  if (idle > 0) {
    std::fprintf(stderr, "vramscope: %d more traced process%s used no device memory\n", idle,
                 idle == 1 ? "" : "es");
  }

  if (!options.json_path.empty())
    outputs_ok &= WriteFile(options.json_path, FormatReportsJson(reports));
  if (!options.trace_path.empty()) {
    outputs_ok &= WriteFile(options.trace_path,
                            perfetto ? PerfettoTrace(recorded, reports) : trace.Json(reports));
  }
  if (!options.events_path.empty()) {
    if (absl::Status s = WriteEventLog(options.events_path, recorded); !s.ok()) {
      std::fprintf(stderr, "vramscope run: %s\n", std::string(s.message()).c_str());
      outputs_ok = false;
    }
  }
  if (!options.trace_path.empty() && !perfetto && trace.slices_dropped() > 0) {
    std::fprintf(
        stderr,
        "vramscope run: the Chrome trace keeps 200000 slices, allocations and CUPTI points "
        "of each kind; %llu more were left out (FILE.pftrace keeps every allocation)\n",
        static_cast<unsigned long long>(trace.slices_dropped()));
  }
  if (recorded.dropped() > 0) {
    std::fprintf(stderr,
                 "vramscope run: kept the first %zu events for --events/--trace; %llu more were "
                 "not kept\n",
                 recorded.events(), static_cast<unsigned long long>(recorded.dropped()));
  }

  bool over = false;
  if (options.max_peak) {
    for (const v1::Report& report : reports) {
      for (const v1::DeviceReport& device : report.devices()) {
        if (device.peak_reserved_bytes() <= *options.max_peak) continue;
        over = true;
        std::fprintf(stderr,
                     "vramscope run: FAIL: pid %u cuda:%u peak reserved %s (%llu bytes) exceeds "
                     "--max-peak %s (%llu bytes)\n",
                     report.process().pid(), device.device().ordinal(),
                     FormatBytes(device.peak_reserved_bytes()).c_str(),
                     static_cast<unsigned long long>(device.peak_reserved_bytes()),
                     FormatBytes(*options.max_peak).c_str(),
                     static_cast<unsigned long long>(*options.max_peak));
      }
    }
    if (!over) {
      std::fprintf(stderr, "vramscope run: peak reserved within --max-peak %s\n",
                   FormatBytes(*options.max_peak).c_str());
    }
  }
  const bool delivered = uplink == nullptr || WaitForCollector(options.collector, *outbox, *uplink);
  if (exit_code != 0) return exit_code;
  if (over) return kExitCheckFailed;
  if (!outputs_ok) return kExitUsage;
  if (!delivered) return kExitUnreachable;
  return kExitOk;
}

}  // namespace vramscope::cli
