// vramscope-agent: drains the shim's event rings on this node and streams them to the collector.
// Exit codes: 0 ok; 1 --once could not deliver everything (the collector rejected batches, or
// did not acknowledge them in time); 2 usage (or unusable --spool-dir or default ring
// directory); 3 cannot reach the collector.
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_replace.h>
#include <absl/synchronization/notification.h>
#include <absl/time/clock.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>

#include "vramscope/agent/agent.h"
#include "vramscope/log.h"
#include "vramscope/net_security.h"

namespace vramscope::agent {
namespace {

constexpr char kUsage[] = R"(usage: vramscope-agent [FLAGS]

Finds the event rings traced processes write (vramscope/ring.h), drains them, and streams the
events to vramscope-collector over gRPC, resending after reconnects; with --spool-dir every
unacknowledged batch is also on disk, and a restarted agent sends it.

  --collector=HOST:PORT[,HOST:PORT...]
                             collector address (default 127.0.0.1:7411); several: the agent
                             sends to the first that answers in an order hashed from
                             --shard-key (rendezvous), fails over to the next when it goes
                             down and returns when it is back
  --shard-key=NAME           what the collectors are ordered by (default: the host name;
                             agents simulating many hosts on one give each its own)
@SECURITY@  --ring-dir=DIR             where the rings are (default $VRAMSCOPE_RING_DIR, else
                             /dev/shm/vramscope, which the agent creates: mode 1777 as
                             root, 0700 otherwise; where the shim writes when
                             VRAMSCOPE_RING_DIR is unset)
  --batch-events=N           events per batch at most (default 4096)
  --poll-interval-ms=N       how often to look for new rings and records (default 50)
  --max-memory-bytes=SIZE    unacknowledged batches kept in memory (with --spool-dir: copies
                             of spooled ones, the rest read back from disk) (default 256M)
  --spool-dir=DIR            write every batch here before the ring lets go of its events,
                             delete it once acknowledged; a restarted agent sends what it
                             finds there first (default: none: unacknowledged batches are
                             lost when the agent dies; beyond --max-memory-bytes they are
                             dropped)
  --max-spool-bytes=SIZE     spool bound; beyond it batches are dropped, counted, logged and
                             reported to the collector as DropEvents (default 1G)
  --max-backoff-ms=N         longest wait between reconnect attempts (default 10000)
  --stats-interval=SECONDS   print the agent's counters this often (default 0 = never)
  --once                     drain every ring once, send, wait for the acknowledgements, exit
  --once-timeout=SECONDS     how long --once waits for the collector (default 30)
  --version                  the version, then exit
  --help                     this text

A batch the collector rejects as invalid is not resent: with --spool-dir it is kept in
DIR/rejected/ (with FILE.reason), without one it is dropped; either way it is counted and
logged once per process, and everything else goes on.

Exit codes: 0 ok; 1 --once could not deliver everything (the collector rejected batches, or
did not acknowledge them within --once-timeout); 2 usage, unusable --spool-dir, a default ring
directory that cannot be created or is unsafe, or (--once) unreadable ring directory; 3 (--once)
the collector could not be reached.

SIZE takes a K, M, G or T suffix (powers of 1024). Only rings of the agent's own user are read,
unless it runs as root. Nothing is lost across a collector restart either way; across an agent
restart (crash, SIGKILL, upgrade) only with --spool-dir, and the same directory next time.
)";

std::string UsageText() {
  return absl::StrReplaceAll(kUsage, {{"@SECURITY@", net::kClientFlagsHelp}});
}

int Usage(const std::string& error) {
  std::fprintf(stderr, "vramscope-agent: %s\n\n%s", error.c_str(), UsageText().c_str());
  return 2;
}

std::optional<uint64_t> ParseSize(absl::string_view text) {
  uint64_t scale = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K':
      case 'k':
        scale = uint64_t{1} << 10;
        break;
      case 'M':
      case 'm':
        scale = uint64_t{1} << 20;
        break;
      case 'G':
      case 'g':
        scale = uint64_t{1} << 30;
        break;
      case 'T':
      case 't':
        scale = uint64_t{1} << 40;
        break;
      default:
        break;
    }
    if (scale != 1) text.remove_suffix(1);
  }
  uint64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value > UINT64_MAX / scale) return std::nullopt;
  return value * scale;
}

std::string FormatCounters(const AgentCounters& c) {
  return absl::StrFormat(
      "counters: %s, rings open %d finished %d skipped %d damaged %d identity-mismatch %d; "
      "batches cut %d (%d events) sent %d acked %d resent %d spooled %d replayed %d dropped %d "
      "(%d events) rejected %d (%d events, %d processes) pending %d; unusable spool files %d; "
      "reconnects %d",
      c.connected ? "connected" : "NOT connected", c.rings_open, c.rings_finished, c.rings_skipped,
      c.rings_damaged, c.rings_identity_mismatch, c.batches_cut, c.events_cut, c.batches_sent,
      c.batches_acked, c.batches_resent, c.batches_spooled, c.batches_replayed, c.batches_dropped,
      c.events_dropped, c.batches_rejected, c.events_rejected, c.processes_rejected,
      c.pending_batches, c.spool_files_rejected, c.reconnects);
}

int Main(int argc, char** argv) {
  AgentOptions options;
  net::ClientSecurity security;
  bool once = false;
  int64_t poll_ms = 50;
  int64_t stats_seconds = 0;
  int64_t once_timeout_seconds = 30;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(UsageText().c_str(), stdout);
      return 0;
    }
    if (arg == "--version") {
      std::printf("%s %s\n", "vramscope-agent", VRAMSCOPE_VERSION);
      return 0;
    }
    if (arg == "--once") {
      once = true;
      continue;
    }
    if (!absl::StartsWith(arg, "--")) return Usage(absl::StrCat("unexpected argument ", arg));
    std::string name;
    std::string value;
    size_t eq = arg.find('=');
    if (eq != absl::string_view::npos) {
      name = std::string(arg.substr(2, eq - 2));
      value = std::string(arg.substr(eq + 1));
    } else {
      name = std::string(arg.substr(2));
      if (i + 1 >= argc) return Usage(absl::StrCat("--", name, " needs a value"));
      value = argv[++i];
    }
    auto number = [&](int64_t min, int64_t max, int64_t* out) {
      return absl::SimpleAtoi(value, out) && *out >= min && *out <= max;
    };
    auto bad = [&](absl::string_view want) {
      return Usage(absl::StrCat("--", name, "=", value, ": want ", want));
    };
    int64_t n = 0;
    if (name == "collector") {
      options.uplink.collector = value;
    } else if (name == "shard-key") {
      options.uplink.host = value;
    } else if (net::SetClientFlag(name, value, &security)) {
    } else if (name == "ring-dir") {
      options.ring_dir = value;
    } else if (name == "batch-events") {
      if (!number(1, 1 << 20, &n)) return bad("1 .. 1048576");
      options.batch_events = static_cast<int>(n);
    } else if (name == "poll-interval-ms") {
      if (!number(1, 60000, &poll_ms)) return bad("1 .. 60000");
    } else if (name == "max-memory-bytes") {
      std::optional<uint64_t> size = ParseSize(value);
      if (!size) return bad("a size");
      options.outbox.max_memory_bytes = *size;
    } else if (name == "spool-dir") {
      options.outbox.spool_dir = value;
    } else if (name == "max-spool-bytes") {
      std::optional<uint64_t> size = ParseSize(value);
      if (!size) return bad("a size");
      options.outbox.max_spool_bytes = *size;
    } else if (name == "max-backoff-ms") {
      if (!number(10, 3600000, &n)) return bad("10 .. 3600000");
      options.uplink.max_backoff = absl::Milliseconds(n);
    } else if (name == "stats-interval") {
      if (!number(0, 86400, &stats_seconds)) return bad("0 .. 86400 seconds");
    } else if (name == "once-timeout") {
      if (!number(1, 86400, &once_timeout_seconds)) return bad("1 .. 86400 seconds");
    } else {
      return Usage(absl::StrCat("unknown flag --", name));
    }
  }
  absl::StatusOr<net::ClientCredentials> credentials = net::LoadClientCredentials(security);
  if (!credentials.ok()) {
    std::fprintf(stderr, "vramscope-agent: %s\n",
                 std::string(credentials.status().message()).c_str());
    return 2;
  }
  options.uplink.credentials = *std::move(credentials);
  options.all_users = ::geteuid() == 0;
  if (options.ring_dir.empty() && UsesDefaultRingDir()) {
    // The default directory is the agent's to make: a plain LD_PRELOAD run writes there only if
    // it exists and is safe.
    options.ring_dir = DefaultRingDir();
    if (absl::Status s = PrepareDefaultRingDir(options.ring_dir); !s.ok()) {
      std::fprintf(stderr, "vramscope-agent: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Agent agent(options);
  if (std::string error = agent.outbox().spool_error(); !error.empty()) {
    std::fprintf(stderr, "vramscope-agent: --spool-dir=%s: %s\n", options.outbox.spool_dir.c_str(),
                 error.c_str());
    return 2;
  }
  Log(LogLevel::kInfo, absl::StrFormat("rings in %s, collector %s%s", agent.options().ring_dir,
                                       options.uplink.collector, once ? ", once" : ""));
  agent.StartUplink();

  if (once) {
    uint64_t drained = 0;
    while (true) {
      absl::StatusOr<uint64_t> events = agent.Poll();
      if (!events.ok()) {
        Log(LogLevel::kError, events.status().message());
        return 2;
      }
      if (*events == 0) break;
      drained += *events;
    }
    bool delivered = agent.outbox().WaitAllAcked(absl::Seconds(once_timeout_seconds));
    agent.StopUplink();
    AgentCounters counters = agent.counters();
    Log(LogLevel::kInfo,
        absl::StrFormat("drained %d events; %s", drained, FormatCounters(counters)));
    if (delivered && counters.batches_rejected == 0) return 0;
    if (!agent.uplink().ever_connected()) {
      Log(LogLevel::kError,
          absl::StrFormat("cannot reach the collector at %s: %s (%s)", options.uplink.collector,
                          agent.uplink().last_error().ToString(),
                          net::ConnectHint(options.uplink.credentials)));
      return 3;
    }
    // The collector answered: it is reachable. Rejected batches are its verdict on their
    // contents (resending cannot help); they are told apart from batches it never answered.
    if (counters.batches_rejected > 0) {
      Log(LogLevel::kError,
          absl::StrFormat(
              "%d batches of %d processes were rejected by the collector: %s (first reason)%s",
              counters.batches_rejected, counters.processes_rejected,
              agent.outbox().first_reject_reason(),
              options.outbox.spool_dir.empty()
                  ? "; dropped (no --spool-dir)"
                  : absl::StrCat("; kept in ", options.outbox.spool_dir, "/rejected")));
    }
    if (!delivered) {
      Log(LogLevel::kError,
          absl::StrFormat("%d batches not acknowledged within %ds: %s", counters.pending_batches,
                          once_timeout_seconds, agent.uplink().last_error().ToString()));
    }
    return 1;
  }

  absl::Notification stop;
  std::thread waiter([&] {
    int signal = 0;
    sigwait(&signals, &signal);
    Log(LogLevel::kInfo, absl::StrFormat("signal %d: stopping", signal));
    stop.Notify();
  });
  absl::Time next_stats = absl::Now() + absl::Seconds(stats_seconds);
  bool dir_error_logged = false;
  while (!stop.WaitForNotificationWithTimeout(absl::Milliseconds(poll_ms))) {
    absl::StatusOr<uint64_t> events = agent.Poll();
    if (!events.ok() && !dir_error_logged) {
      Log(LogLevel::kError, absl::StrCat(events.status().message(), "; will keep looking"));
    }
    dir_error_logged = !events.ok();
    if (stats_seconds > 0 && absl::Now() >= next_stats) {
      Log(LogLevel::kInfo, FormatCounters(agent.counters()));
      next_stats = absl::Now() + absl::Seconds(stats_seconds);
    }
  }
  waiter.join();
  // Give the collector a moment for what is in flight; the rest stays in the spool for the next
  // run, or is lost with this process without one.
  agent.outbox().WaitAllAcked(absl::Seconds(2));
  agent.StopUplink();
  const AgentCounters counters = agent.counters();
  Log(LogLevel::kInfo, FormatCounters(counters));
  if (counters.pending_batches > 0) {
    Log(options.outbox.spool_dir.empty() ? LogLevel::kWarning : LogLevel::kInfo,
        options.outbox.spool_dir.empty()
            ? absl::StrFormat("%d batches unacknowledged, lost (no --spool-dir)",
                              counters.pending_batches)
            : absl::StrFormat("%d batches unacknowledged, kept in %s for the next run",
                              counters.pending_batches, options.outbox.spool_dir));
  }
  return 0;
}

}  // namespace
}  // namespace vramscope::agent

int main(int argc, char** argv) { return vramscope::agent::Main(argc, argv); }
