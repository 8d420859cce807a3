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
#include "vramscope/command_line.h"
#include "vramscope/log.h"
#include "vramscope/net_security.h"

namespace vramscope::cli {
namespace {

constexpr int kPollIntervalMs = 10;

struct RunOptions {
  std::string json_path;
  std::string trace_path;   // .pftrace: Perfetto protobuf; otherwise Chrome JSON
  std::string events_path;  // --events FILE: the event log `vramscope export` reads
  std::optional<std::uint64_t> max_peak;
  std::string collector;
  // --collector-wait: after the report, how long to wait for the collector to acknowledge
  // everything (seconds).
  double collector_wait_s = 10;
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

constexpr char kFooter[] =
    "Runs CMD with the vramscope shim preloaded (no daemon needed). CMD and every process it "
    "starts are traced; at exit a report per process and device goes to stderr: peak requested, "
    "allocated and reserved bytes, fragmentation, counts, NVTX ranges, top sites, memory not "
    "freed at exit.\n"
    "NVTX ranges are received through NVTX_INJECTION64_PATH, set to the shim unless already set "
    "(no change to CMD needed). The shim is found at $VRAMSCOPE_SHIM, else next to this "
    "executable (build tree: ../interposer/shim/libvramscope.so; installed: "
    "../lib/libvramscope.so).\n"
    "Exit status: CMD's (128+N when killed by signal N, 127 when it cannot start); when CMD "
    "succeeded: 1 if --max-peak was exceeded, else 2 if an output file could not be written, "
    "else 3 if --collector was given and the collector did not acknowledge every event within "
    "--collector-wait (unreachable, refused, or events dropped beyond the 256 MiB kept in memory "
    "for "
    "it); 2 for usage errors.";

// A file-name flag's check: refuses an empty name.
std::string NeedsFileName(const std::string& value) {
  return value.empty() ? "needs a file name" : "";
}

void DefineOutputFlags(CLI::App& app, RunOptions* options) {
  app.add_option("--json", options->json_path,
                 "write the report as JSON (proto field names): one process -> a "
                 "vramscope.v1.Report object; otherwise {\"reports\": [Report, ...]}")
      ->type_name("FILE");
  app.add_option("--trace", options->trace_path,
                 "write a trace for ui.perfetto.dev: FILE.pftrace a Perfetto protobuf trace "
                 "(allocations as slices per device with their stacks as callstacks, exact "
                 "requested/allocated/reserved counters, NVTX ranges); any other name a Chrome "
                 "trace (JSON): per device counter tracks, allocations as async slices, NVTX "
                 "ranges")
      ->type_name("FILE");
  app.add_option("--events", options->events_path,
                 "write every allocation, free, pool reservation, NVTX range and site as an event "
                 "log, for `vramscope export --format torch-snapshot`")
      ->type_name("FILE")
      ->check(NeedsFileName);
  cmdline::AddSize(app, "--max-peak", &options->max_peak,
                   "exit 1 when any process's peak RESERVED bytes on any device (what the driver "
                   "held for it: the figure that runs out) exceed SIZE");
  app.add_option("--folded", options->folded_path,
                 "write folded stacks for flamegraph.pl/speedscope: \"outermost;...;innermost "
                 "BYTES\", BYTES = total requested bytes allocated from that stack over the run")
      ->type_name("FILE")
      ->check(NeedsFileName);
}

void DefineFlags(CLI::App& app, RunOptions* options, Labels* labels) {
  cmdline::MakeApp(app, "[FLAGS] [--] CMD [ARGS...]");
  app.footer(kFooter);
  DefineOutputFlags(app, options);
  app.add_option("--collector", options->collector,
                 "also stream the events to vramscope-collector at ADDR (HOST:PORT) while CMD "
                 "runs, as vramscope-agent does; after the report, wait up to --collector-wait "
                 "for the collector to acknowledge everything (a warning if it does not)")
      ->type_name("ADDR")
      ->check([](const std::string& value) {
        return value.empty() ? "needs HOST:PORT (e.g. 127.0.0.1:7411)" : "";
      });
  app.add_option("--collector-wait", options->collector_wait_s,
                 "with --collector: how long to wait after the report for the collector to "
                 "acknowledge everything, in seconds (default 10; 0 = do not wait)")
      ->type_name("SECONDS")
      ->check(CLI::Range(0.0, 3600.0));
  cmdline::AddClientSecurityFlags(app, &options->security);
  app.add_flag("--live", options->live,
               "show the live dashboard (as `vramscope top`) while CMD runs; on a terminal CMD "
               "reads /dev/null and its output is held back and printed when it exits; otherwise "
               "one plain line per process and device every second on stdout");
  app.add_flag_callback(
      "--no-cupti", [options] { options->cupti = false; },
      "do not load CUPTI in CMD (default: VRAMSCOPE_CUPTI=1 unless the environment sets "
      "VRAMSCOPE_CUPTI: the driver's own memory records in the report and trace)");
  app.add_flag("--no-stacks", options->no_stacks,
               "do not record allocation call stacks (recorded by default, about 0.2 us each: the "
               "report's top allocation sites get function (file:line) frames)");
  app.add_flag("--stacks", options->stacks, "record allocation call stacks (the default)");
  app.add_option_function<std::vector<std::string>>(
         "--label",
         [labels](const std::vector<std::string>& values) {
           for (const std::string& value : values) {
             if (absl::Status s = AddLabelArg(value, labels); !s.ok()) {
               throw CLI::ValidationError(std::string(s.message()));
             }
           }
         },
         "a label of this run (repeatable): job name, git commit, test id; merged over the "
         "environment's VRAMSCOPE_LABELS and passed to CMD in it")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
}

// Where CMD starts: the first argument that is neither a flag nor a flag's value, or "--".
int CommandStart(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--" || arg.empty() || arg[0] != '-' || arg == "-") return i;
    if (arg.find('=') != std::string_view::npos) continue;
    const CLI::Option* option = app.get_option_no_throw(std::string(arg));
    if (option != nullptr && option->get_expected_max() > 0) ++i;  // its value
  }
  return argc;
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

// The flags, then CMD. nullopt: go on; else the exit code (--help, or a usage error printed).
std::optional<int> ParseRunArgs(int argc, char** argv, RunOptions* options) {
  CLI::App app(std::string(kRunSummary), "vramscope run");
  Labels labels;
  DefineFlags(app, options, &labels);
  int start = CommandStart(app, argc, argv);
  if (std::optional<int> exit_code = cmdline::Parse(app, start, argv)) return *exit_code;
  if (start < argc && std::string_view(argv[start]) == "--") ++start;
  for (int i = start; i < argc; ++i) options->command.push_back(argv[i]);
  if (options->command.empty()) return cmdline::UsageError(app, "no command given");
  if (!options->folded_path.empty()) {
    if (options->no_stacks) {
      return cmdline::UsageError(app, "--folded needs the stacks that --no-stacks turns off");
    }
    options->stacks = true;
  }
  if (options->no_stacks) options->stacks = false;
  if (!labels.empty() && !MergeLabels(labels, &options->labels_text)) return kExitUsage;
  return std::nullopt;
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
bool WaitForCollector(const std::string& address, absl::Duration wait, agent::Outbox& outbox,
                      agent::Uplink& uplink) {
  const bool acked = outbox.WaitAllAcked(wait);
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
                 address.c_str(), absl::FormatDuration(wait).c_str(),
                 static_cast<unsigned long long>(c.events_cut),
                 static_cast<unsigned long long>(c.batches_cut),
                 std::string(uplink.last_error().message()).c_str());
  } else {
    std::fprintf(stderr,
                 "vramscope run: WARNING: the collector at %s acknowledged %llu of %llu batches "
                 "within %s (%s); the rest was not stored there. The report above is "
                 "complete.\n",
                 address.c_str(), static_cast<unsigned long long>(c.batches_acked),
                 static_cast<unsigned long long>(c.batches_cut), absl::FormatDuration(wait).c_str(),
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

// What one run holds from the start of CMD to the report. Not movable: the session points at
// `trace` and `outbox`.
struct RunContext {
  std::string shim;
  std::string ring_dir;
  net::ClientCredentials credentials;
  ChromeTrace trace;
  // --collector: the agent library's Outbox (sequence numbers, memory bound, counted drops) and
  // Uplink (stream, acknowledgements, reconnect and resend), as vramscope-agent uses them.
  std::unique_ptr<agent::Outbox> outbox;
  std::unique_ptr<agent::Uplink> uplink;
  std::unique_ptr<RingSession> session;
  RecordedEvents recorded;  // the per-allocation events, for --events and a Perfetto --trace
  bool perfetto = false;
  std::size_t shown_sites = 0;
  std::unique_ptr<RunLiveView> live;
  int held_output = -1;  // --live on a terminal: CMD's output, held back
  int exec_errno = 0;
};

// Credentials, the shim, the ring directory and the session. 0, or the exit code after printing
// why.
int Prepare(const RunOptions& options, RunContext* run) {
  absl::StatusOr<net::ClientCredentials> credentials = net::LoadClientCredentials(options.security);
  if (!credentials.ok()) {
    std::fprintf(stderr, "vramscope run: %s\n",
                 std::string(credentials.status().message()).c_str());
    return kExitUsage;
  }
  run->credentials = *std::move(credentials);
  run->shim = FindShim();
  if (run->shim.empty()) return kExitUsage;
  run->ring_dir = MakeRingDir();
  if (run->ring_dir.empty()) {
    std::fprintf(stderr, "vramscope run: cannot create a ring directory in /dev/shm or $TMPDIR\n");
    return kExitUsage;
  }
  if (!options.collector.empty()) {
    // The uplink's per-retry warnings would interleave with CMD's output; one summary line
    // after the report says how delivery went.
    vramscope::SetMinLogLevel(vramscope::LogLevel::kError);
    run->outbox = std::make_unique<agent::Outbox>(agent::OutboxOptions{});
  }
  collector::StatsOptions stats_options;
  run->shown_sites = stats_options.max_top_sites;
  // --folded wants every site; the report keeps its usual top ones.
  if (!options.folded_path.empty()) stats_options.max_top_sites = SIZE_MAX;
  run->session = std::make_unique<RingSession>(run->ring_dir, stats_options,
                                               options.trace_path.empty() ? nullptr : &run->trace,
                                               run->outbox.get());
  run->perfetto = absl::EndsWith(options.trace_path, ".pftrace");
  if (run->perfetto || !options.events_path.empty()) run->session->SetRecorder(&run->recorded);
  return 0;
}

// Started after the fork: the child execs at once and needs none of gRPC's threads.
void StartUplink(const RunOptions& options, RunContext* run) {
  if (run->outbox == nullptr) return;
  agent::UplinkOptions uplink_options;
  uplink_options.collector = options.collector;
  uplink_options.credentials = run->credentials;
  // A collector that comes up late is found within a second, well inside --collector-wait's
  // default.
  uplink_options.max_backoff = absl::Seconds(1);
  run->uplink = std::make_unique<agent::Uplink>(run->outbox.get(), uplink_options);
  run->uplink->Start();
}

// Starts CMD and drains until it exits; CMD's exit code (126 when it could not start).
int RunChild(const RunOptions& options, RunContext* run) {
  // Ctrl-C reaches CMD through the terminal's process group; we outlive it to report.
  struct sigaction ignore = {}, forward = {}, old_int, old_quit, old_term, old_hup;
  ignore.sa_handler = SIG_IGN;
  forward.sa_handler = ForwardSignal;
  sigaction(SIGINT, &ignore, &old_int);
  sigaction(SIGQUIT, &ignore, &old_quit);
  sigaction(SIGTERM, &forward, &old_term);
  sigaction(SIGHUP, &forward, &old_hup);

  // --live: the view; on a terminal CMD's output is held in an unlinked file meanwhile.
  run->live = options.live ? g_live_view_factory() : nullptr;
  if (run->live != nullptr && run->live->TakesTerminal()) {
    std::string held = run->ring_dir + "/output.XXXXXX";
    run->held_output = mkostemp(held.data(), O_CLOEXEC);
    if (run->held_output >= 0) unlink(held.c_str());
  }
  const pid_t child = Spawn(options, run->shim, run->ring_dir, &run->exec_errno, run->held_output);
  StartUplink(options, run);
  int exit_code;
  if (child < 0) {
    std::fprintf(stderr, "vramscope run: cannot start a process: %s\n", strerror(errno));
    exit_code = 126;
  } else {
    g_child = child;
    run->session->WatchChild(static_cast<std::uint32_t>(child));
    const int status = Supervise(child, *run->session, run->live.get());
    g_child = 0;
    if (run->exec_errno != 0) {
      std::fprintf(stderr, "vramscope run: cannot run %s: %s\n", options.command[0],
                   strerror(run->exec_errno));
    }
    exit_code = WIFEXITED(status)     ? WEXITSTATUS(status)
                : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                      : 1;
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGQUIT, &old_quit, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  return exit_code;
}

// Names the allocation sites' frames and writes --folded; false when --folded failed.
bool SymbolizeAndFold(const RunOptions& options, RunContext* run,
                      std::vector<v1::Report>* reports) {
  if (!options.stacks) return true;
  const SymbolizeResult symbols = SymbolizeReports(reports);
  if (symbols.unreadable_modules > 0) {
    std::fprintf(stderr,
                 "vramscope run: %zu modules of the allocation sites could not be read as "
                 "ELF files; their frames are shown as MODULE+0xOFFSET\n",
                 symbols.unreadable_modules);
  }
  if (run->recorded.events() > 0) SymbolizeSites(&run->recorded);
  if (options.folded_path.empty()) return true;
  const bool ok = WriteFile(options.folded_path, FoldedStacks(*reports));
  for (v1::Report& report : *reports) {
    for (v1::DeviceReport& device : *report.mutable_devices()) {
      auto* sites = device.mutable_top_sites();
      if (static_cast<std::size_t>(sites->size()) > run->shown_sites) {
        sites->DeleteSubrange(static_cast<int>(run->shown_sites),
                              sites->size() - static_cast<int>(run->shown_sites));
      }
    }
  }
  return ok;
}

// The session's warnings and a report per process on stderr.
void PrintReports(const RunContext& run, const std::vector<v1::Report>& reports) {
  for (const std::string& warning : run.session->warnings()) {
    std::fprintf(stderr, "vramscope run: %s\n", warning.c_str());
  }
  if (reports.empty() && run.exec_errno == 0) {
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
}

// --json, --trace and --events; false when one could not be written.
bool WriteOutputs(const RunOptions& options, const RunContext& run,
                  const std::vector<v1::Report>& reports) {
  bool ok = true;
  if (!options.json_path.empty()) ok &= WriteFile(options.json_path, FormatReportsJson(reports));
  if (!options.trace_path.empty()) {
    ok &= WriteFile(options.trace_path,
                    run.perfetto ? PerfettoTrace(run.recorded, reports) : run.trace.Json(reports));
  }
  if (!options.events_path.empty()) {
    if (absl::Status s = WriteEventLog(options.events_path, run.recorded); !s.ok()) {
      std::fprintf(stderr, "vramscope run: %s\n", std::string(s.message()).c_str());
      ok = false;
    }
  }
  if (!options.trace_path.empty() && !run.perfetto && run.trace.slices_dropped() > 0) {
    std::fprintf(
        stderr,
        "vramscope run: the Chrome trace keeps 200000 slices, allocations and CUPTI points "
        "of each kind; %llu more were left out (FILE.pftrace keeps every allocation)\n",
        static_cast<unsigned long long>(run.trace.slices_dropped()));
  }
  if (run.recorded.dropped() > 0) {
    std::fprintf(stderr,
                 "vramscope run: kept the first %zu events for --events/--trace; %llu more were "
                 "not kept\n",
                 run.recorded.events(), static_cast<unsigned long long>(run.recorded.dropped()));
  }
  return ok;
}

// --max-peak: true (each excess printed) when a device's peak reserved bytes exceed it.
bool OverMaxPeak(const RunOptions& options, const std::vector<v1::Report>& reports) {
  if (!options.max_peak) return false;
  bool over = false;
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
  return over;
}

}  // namespace

void SetRunLiveViewFactory(RunLiveViewFactory factory) { g_live_view_factory = factory; }

std::shared_ptr<void> DefineRunFlags(CLI::App& app) {
  struct Flags {
    RunOptions options;
    Labels labels;
  };
  auto flags = std::make_shared<Flags>();
  DefineFlags(app, &flags->options, &flags->labels);
  return flags;
}

int RunRun(int argc, char** argv) {
  RunOptions options;
  if (std::optional<int> exit_code = ParseRunArgs(argc, argv, &options)) return *exit_code;
  if (options.live && g_live_view_factory == nullptr) {
    std::fprintf(stderr, "vramscope run: --live is not available in this build\n");
    return kExitUsage;
  }
  RunContext run;
  if (int code = Prepare(options, &run); code != 0) return code;
  const int exit_code = RunChild(options, &run);
  if (absl::Status s = run.session->Finish(); !s.ok()) {
    std::fprintf(stderr, "vramscope run: %s\n", std::string(s.message()).c_str());
  }
  std::vector<v1::Report> reports = run.session->Reports();
  bool outputs_ok = SymbolizeAndFold(options, &run, &reports);
  RemoveRingDir(run.ring_dir);
  if (run.live != nullptr) run.live->Close(reports);
  if (run.held_output >= 0) {
    ReplayHeldOutput(run.held_output);
    close(run.held_output);
  }
  PrintReports(run, reports);
  outputs_ok &= WriteOutputs(options, run, reports);
  const bool over = OverMaxPeak(options, reports);
  const bool delivered =
      run.uplink == nullptr ||
      WaitForCollector(options.collector, absl::Seconds(options.collector_wait_s), *run.outbox,
                       *run.uplink);
  if (exit_code != 0) return exit_code;
  if (over) return kExitCheckFailed;
  if (!outputs_ok) return kExitUsage;
  if (!delivered) return kExitUnreachable;
  return kExitOk;
}

}  // namespace vramscope::cli
