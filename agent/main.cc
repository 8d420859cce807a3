// vramscope-agent: drains the shim's event rings on this node and streams them to the collector.
// Exit codes: 0 ok; 1 --once could not deliver everything (the collector rejected batches, or
// did not acknowledge them in time); 2 usage (or unusable --spool-dir or default ring
// directory); 3 cannot reach the collector.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
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
#include "vramscope/command_line.h"
#include "vramscope/log.h"
#include "vramscope/net_security.h"

namespace vramscope::agent {
namespace {

constexpr char kDescription[] =
    "drains the shim's event rings on this node and streams them to vramscope-collector";

constexpr char kFooter[] =
    R"(Finds the event rings traced processes write (vramscope/ring.h), drains them, and streams the
events to vramscope-collector over gRPC, resending after reconnects; with --spool-dir every
unacknowledged batch is also on disk, and a restarted agent sends it.

A batch the collector rejects as invalid is not resent: with --spool-dir it is kept in
DIR/rejected/ (with FILE.reason), without one it is dropped; either way it is counted and
logged once per process, and everything else goes on.

Exit codes: 0 ok; 1 --once could not deliver everything (the collector rejected batches, or
did not acknowledge them within --once-timeout); 2 usage, unusable --spool-dir, a default ring
directory that cannot be created or is unsafe, or (--once) unreadable ring directory; 3 (--once)
the collector could not be reached.

SIZE: bytes or a number with K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024) or KB, MB, GB, TB
(powers of 1000), e.g. 512MiB, 1G. Only rings of the agent's own user are read, unless it runs
as root. Nothing is lost across a collector restart either way; across an agent restart (crash,
SIGKILL, upgrade) only with --spool-dir, and the same directory next time.)";

// Everything the command line sets.
struct AgentFlags {
  AgentOptions options;
  net::ClientSecurity security;
  bool once = false;
  int64_t poll_ms = 50;
  int64_t stats_seconds = 0;
  int64_t once_timeout_seconds = 30;
  int64_t max_backoff_ms = 10000;
};

void DefineFlags(CLI::App& app, AgentFlags* flags) {
  cmdline::MakeApp(app, "[FLAGS]");
  app.footer(kFooter);
  AgentOptions& options = flags->options;
  app.add_option("--collector", options.uplink.collector,
                 "collector address; several: the agent sends to the first that answers in an "
                 "order hashed from --shard-key (rendezvous), fails over to the next when it goes "
                 "down and returns when it is back")
      ->type_name("HOST:PORT[,HOST:PORT...]");
  app.add_option("--shard-key", options.uplink.host,
                 "what the collectors are ordered by (default: the host name; agents simulating "
                 "many hosts on one give each its own)")
      ->type_name("NAME");
  cmdline::AddClientSecurityFlags(app, &flags->security);
  app.add_option("--ring-dir", options.ring_dir,
                 "where the rings are (default $VRAMSCOPE_RING_DIR, else /dev/shm/vramscope, which "
                 "the agent creates: mode 1777 as root, 0700 otherwise)")
      ->type_name("DIR");
  app.add_option("--batch-events", options.batch_events, "events per batch at most")
      ->type_name("N")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--poll-interval-ms", flags->poll_ms,
                 "how often to look for new rings and records")
      ->type_name("N")
      ->check(CLI::Range(1, 60000));
  cmdline::AddSize(app, "--max-memory-bytes", &options.outbox.max_memory_bytes,
                   "unacknowledged batches kept in memory (with --spool-dir: copies of spooled "
                   "ones, the rest read back from disk) (default 256MiB)");
  app.add_option("--spool-dir", options.outbox.spool_dir,
                 "write every batch here before the ring lets go of its events, delete it once "
                 "acknowledged; a restarted agent sends what it finds there first (default: none)")
      ->type_name("DIR");
  cmdline::AddSize(app, "--max-spool-bytes", &options.outbox.max_spool_bytes,
                   "spool bound; beyond it batches are dropped, counted, logged and reported to "
                   "the collector as DropEvents (default 1GiB)");
  app.add_option("--max-backoff-ms", flags->max_backoff_ms,
                 "longest wait between reconnect attempts")
      ->type_name("N")
      ->check(CLI::Range(10, 3600000));
  app.add_option("--stats-interval", flags->stats_seconds,
                 "print the agent's counters this often (0 = never)")
      ->type_name("SECONDS")
      ->check(CLI::Range(0, 86400));
  app.add_flag("--once", flags->once,
               "drain every ring once, send, wait for the acknowledgements, exit");
  app.add_option("--once-timeout", flags->once_timeout_seconds,
                 "how long --once waits for the collector")
      ->type_name("SECONDS")
      ->check(CLI::Range(1, 86400));
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

// --once: drain everything, send, wait for the acknowledgements; the exit code.
int RunOnce(Agent& agent, const AgentFlags& flags) {
  const AgentOptions& options = flags.options;
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
  bool delivered = agent.outbox().WaitAllAcked(absl::Seconds(flags.once_timeout_seconds));
  agent.StopUplink();
  AgentCounters counters = agent.counters();
  Log(LogLevel::kInfo, absl::StrFormat("drained %d events; %s", drained, FormatCounters(counters)));
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
                        flags.once_timeout_seconds, agent.uplink().last_error().ToString()));
  }
  return 1;
}

// Drains and sends until SIGINT or SIGTERM (blocked in `signals`); the exit code.
int RunUntilSignal(Agent& agent, const AgentFlags& flags, const sigset_t& signals) {
  const AgentOptions& options = flags.options;
  absl::Notification stop;
  std::thread waiter([&] {
    int signal = 0;
    sigwait(&signals, &signal);
    Log(LogLevel::kInfo, absl::StrFormat("signal %d: stopping", signal));
    stop.Notify();
  });
  absl::Time next_stats = absl::Now() + absl::Seconds(flags.stats_seconds);
  bool dir_error_logged = false;
  while (!stop.WaitForNotificationWithTimeout(absl::Milliseconds(flags.poll_ms))) {
    absl::StatusOr<uint64_t> events = agent.Poll();
    if (!events.ok() && !dir_error_logged) {
      Log(LogLevel::kError, absl::StrCat(events.status().message(), "; will keep looking"));
    }
    dir_error_logged = !events.ok();
    if (flags.stats_seconds > 0 && absl::Now() >= next_stats) {
      Log(LogLevel::kInfo, FormatCounters(agent.counters()));
      next_stats = absl::Now() + absl::Seconds(flags.stats_seconds);
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

int Main(int argc, char** argv) {
  CLI::App app(kDescription, "vramscope-agent");
  AgentFlags flags;
  DefineFlags(app, &flags);
  if (std::optional<int> exit_code = cmdline::Parse(app, argc, argv)) return *exit_code;
  flags.options.uplink.max_backoff = absl::Milliseconds(flags.max_backoff_ms);
  AgentOptions& options = flags.options;
  absl::StatusOr<net::ClientCredentials> credentials = net::LoadClientCredentials(flags.security);
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
                                       options.uplink.collector, flags.once ? ", once" : ""));
  agent.StartUplink();
  return flags.once ? RunOnce(agent, flags) : RunUntilSignal(agent, flags, signals);
}

}  // namespace
}  // namespace vramscope::agent

int main(int argc, char** argv) { return vramscope::agent::Main(argc, argv); }
