// vramscope-collector: receives agents' event batches over gRPC, stores them per process in the
// data directory, and serves live statistics and reports. Exit codes: 0 after a clean shutdown
// (SIGINT/SIGTERM), 1 when the data directory or the listening address cannot be used, 2 usage
// (also: unusable TLS or token files, or a listener beyond loopback without TLS and tokens).
#include <absl/strings/match.h>
#include <absl/strings/str_format.h>
#include <absl/synchronization/mutex.h>
#include <google/protobuf/stubs/logging.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>

#include "vramscope/atomic_file.h"
#include "vramscope/collector/collector.h"
#include "vramscope/collector/metrics.h"
#include "vramscope/collector/service.h"
#include "vramscope/command_line.h"
#include "vramscope/log.h"

namespace vramscope::collector {
namespace {

constexpr char kDescription[] =
    "receives vramscope-agent event batches, stores them per process and serves statistics";

constexpr char kFooter[] =
    R"(Receives event batches from vramscope-agent, stores them per process (append-only, CRC-checked),
and serves live statistics (Watch), reports (GetReport) and ListProcesses over gRPC.

SIZE: bytes or a number with K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024) or KB, MB, GB, TB
(powers of 1000), e.g. 16MiB, 1G. Beyond loopback the collector serves only with TLS and tokens,
or with --insecure. --max-processes is per writer: per token when there are tokens, per client
certificate with mutual TLS and no tokens.

Exit codes: 0 after a clean shutdown (SIGINT/SIGTERM), 1 when the data directory or the
listening address cannot be used, 2 usage (also: unusable TLS or token files, or a listener
beyond loopback without TLS and tokens).)";

// The running server, for the signal thread; null while recovering.
ABSL_CONST_INIT absl::Mutex g_server_mu(absl::kConstInit);
CollectorServer* g_server ABSL_GUARDED_BY(g_server_mu) = nullptr;

// Where the run history goes, for the start line (never the URI: it may hold a password).
std::string HistoryKind(const std::string& database) {
  if (database == "off") return "off";
  if (database.empty()) return "in SQLite (history.sqlite)";
  if (absl::StartsWith(database, "sqlite:")) return "in SQLite (" + database.substr(7) + ")";
  return "in PostgreSQL";
}

// Writes `port` to `path` (through a temporary file and rename); false, logged, on failure.
bool WritePortFile(const std::string& path, int port) {
  if (absl::Status s = WriteFileAtomically(path, absl::StrFormat("%d\n", port)); !s.ok()) {
    Log(LogLevel::kError, std::string(s.message()));
    return false;
  }
  return true;
}

// The --metrics-* flags.
struct MetricsFlags {
  std::string listen;  // empty: no metrics
  MetricsOptions options;
  std::string port_file;

  // Starts the metrics endpoint; null, logged, when it cannot listen.
  std::unique_ptr<MetricsServer> Serve(const Collector* collector) const {
    absl::StatusOr<std::unique_ptr<MetricsServer>> server =
        ServeMetrics(listen, [metrics = std::make_shared<CollectorMetrics>(collector, options)] {
          return metrics->Render();
        });
    if (!server.ok()) {
      Log(LogLevel::kError, server.status().message());
      return nullptr;
    }
    Log(LogLevel::kInfo,
        absl::StrFormat("metrics on http://%s/metrics (metrics port %d), retention %s", listen,
                        (*server)->port(), absl::FormatDuration(options.retention)));
    return std::move(*server);
  }
};

std::string DefaultDataDir() {
  if (::geteuid() == 0) return "/var/lib/vramscope/collector";
  const char* home = ::getenv("HOME");
  return absl::StrCat(home != nullptr && *home != '\0' ? home : "/tmp",
                      "/.local/share/vramscope/collector");
}

// protobuf's own log lines. A string field that is not UTF-8 makes it log an ERROR for every
// message, from whatever client sent it; the refusal of that batch is already logged with its
// process and reason (service.cc), so those lines are dropped, and the rest go to our logger.
void ProtobufLog(google::protobuf::LogLevel level, const char* file, int line,
                 const std::string& message) {
  if (absl::StrContains(message, "invalid UTF-8")) return;
  const LogLevel ours = level <= google::protobuf::LOGLEVEL_INFO      ? LogLevel::kInfo
                        : level == google::protobuf::LOGLEVEL_WARNING ? LogLevel::kWarning
                                                                      : LogLevel::kError;
  Log(ours, absl::StrFormat("protobuf %s:%d: %s", file, line, message));
}

// Everything the command line sets.
struct CollectorFlags {
  ServerOptions server_options;
  uint64_t max_message_bytes = 16 << 20;
  std::string fsync = "never";
  CollectorOptions options;
  std::string port_file;
  MetricsFlags metrics;
  net::ServerSecurity security;
};

void DefineMetricsFlags(CLI::App& app, MetricsFlags* metrics) {
  app.add_option_function<std::string>(
         "--metrics-listen",
         [metrics](const std::string& value) {
           absl::StatusOr<std::string> address = MetricsListenAddress(value);
           if (!address.ok()) {
             throw CLI::ValidationError(std::string(address.status().message()));
           }
           metrics->listen = *address;
         },
         "serve Prometheus metrics at http://HOST:PORT/metrics (off unless given; :PORT or PORT "
         "means 127.0.0.1:PORT; port 0 picks a free one)")
      ->type_name("HOST:PORT");
  app.add_option_function<std::string>(
         "--metrics-retention",
         [metrics](const std::string& value) {
           if (!absl::ParseDuration(value, &metrics->options.retention) ||
               metrics->options.retention < absl::ZeroDuration()) {
             throw CLI::ValidationError("--metrics-retention '" + value +
                                        "': want a duration (30s, 5m)");
           }
         },
         "how long a finished process stays in the metrics (default 5m; e.g. 30s, 10m, 1h)")
      ->type_name("DURATION");
  app.add_option("--metrics-port-file", metrics->port_file,
                 "write the metrics port actually bound to FILE")
      ->type_name("FILE");
}

void DefineFlags(CLI::App& app, CollectorFlags* flags) {
  cmdline::MakeApp(app, "[FLAGS]");
  app.footer(kFooter);
  app.add_option("--listen", flags->server_options.listen,
                 "address to serve on (loopback only by default; 0.0.0.0:7411 serves the "
                 "network, port 0 picks a free port)")
      ->type_name("HOST:PORT");
  app.add_option("--data-dir", flags->options.data_dir,
                 "where process logs live (default $HOME/.local/share/vramscope/collector, "
                 "/var/lib/vramscope/collector for root)")
      ->type_name("DIR");
  cmdline::AddSize(app, "--max-message-bytes", &flags->max_message_bytes,
                   "largest gRPC message accepted (default 16MiB)", 1024, (uint64_t{1} << 31) - 1);
  app.add_option("--max-processes", flags->options.max_processes,
                 "processes tracked at most per writer (token, or client certificate with mutual "
                 "TLS and no tokens)")
      ->type_name("N")
      ->check(CLI::Range(uint32_t{1}, ~uint32_t{0}));
  cmdline::AddSize(app, "--max-disk-bytes", &flags->options.max_disk_bytes,
                   "bytes the logs may occupy; batches beyond are refused with RESOURCE_EXHAUSTED "
                   "and not acknowledged (default 0 = the disk's limit)");
  app.add_option("--fsync", flags->fsync,
                 "never: a batch is acknowledged once written to its process's data file (survives "
                 "a collector crash, not a power loss); always: fdatasync each batch first, at "
                 "about a third of the ingest rate")
      ->type_name("always|never")
      ->check(CLI::IsMember({"always", "never"}));
  app.add_option("--port-file", flags->port_file,
                 "write the port actually bound to FILE (useful with port 0)")
      ->type_name("FILE");
  app.add_option("--database", flags->options.database,
                 "the run history (ListRuns, GetRun; `vramscope history`). Default: SQLite in "
                 "DATA-DIR/history.sqlite; postgresql://USER@HOST:PORT/DB shares one history "
                 "between collectors; sqlite:PATH; off")
      ->type_name("DB");
  app.add_option_function<std::string>(
         "--history-defer",
         [flags](const std::string& value) {
           if (!absl::ParseDuration(value, &flags->options.history_max_defer) ||
               flags->options.history_max_defer < absl::ZeroDuration()) {
             throw CLI::ValidationError("--history-defer '" + value +
                                        "': want a duration (30s, 2m, 0)");
           }
         },
         "while batches arrive, history rows wait (the database write never competes with "
         "ingest) until ingest is quiet for 100ms, at most this long (default 30s; 0 writes "
         "each row at once)")
      ->type_name("DURATION");
  DefineMetricsFlags(app, &flags->metrics);
  cmdline::AddServerSecurityFlags(app, &flags->security);
}

// TLS and tokens, and whether they allow the listening address: 0, or exit code 2 (logged).
int LoadGuard(CollectorFlags* flags) {
  // Security first: a refused setting is reported before a long recovery, never after it.
  absl::StatusOr<std::unique_ptr<net::ServerGuard>> guard =
      net::ServerGuard::Load(flags->security, CollectorMethodRoles());
  if (!guard.ok()) {
    Log(LogLevel::kError, guard.status().message());
    return 2;
  }
  std::string listen_warning;
  if (absl::Status allowed = (*guard)->CheckListen(flags->server_options.listen, &listen_warning);
      !allowed.ok()) {
    Log(LogLevel::kError, allowed.message());
    return 2;
  }
  if (!listen_warning.empty()) Log(LogLevel::kWarning, listen_warning);
  flags->server_options.guard = *std::move(guard);
  return 0;
}

// The port file and the metrics endpoint; false, logged, when either cannot start.
bool StartSideServices(const CollectorFlags& flags, const Collector* collector, int port,
                       std::unique_ptr<MetricsServer>* metrics_server) {
  if (!flags.port_file.empty() && !WritePortFile(flags.port_file, port)) return false;
  if (flags.metrics.listen.empty()) return true;
  *metrics_server = flags.metrics.Serve(collector);
  return *metrics_server != nullptr &&
         (flags.metrics.port_file.empty() ||
          WritePortFile(flags.metrics.port_file, (*metrics_server)->port()));
}

// Recovers the data directory and serves until SIGINT or SIGTERM (blocked in `signals`).
int Serve(CollectorFlags& flags, const sigset_t& signals) {
  const ServerOptions& server_options = flags.server_options;
  const CollectorOptions& options = flags.options;
  // A signal that came while the flags were read ends the run here.
  const timespec no_wait{};
  if (int signal = sigtimedwait(&signals, nullptr, &no_wait); signal > 0) {
    Log(LogLevel::kInfo, absl::StrFormat("signal %d before start: exiting", signal));
    return 0;
  }
  // Until the server runs, a signal ends the process at once: recovery may be busy for long or
  // blocked in a read, and it is safe to end at any point (it survives SIGKILL the same way: the
  // damaged bytes are copied aside before a log is cut, a log is replaced only by rename).
  std::thread waiter([signals] {
    int signal = 0;
    sigwait(&signals, &signal);
    absl::MutexLock lock(&g_server_mu);
    if (g_server == nullptr) {
      Log(LogLevel::kInfo,
          absl::StrFormat("signal %d during recovery: exiting (the next start recovers again)",
                          signal));
      ::_exit(0);
    }
    Log(LogLevel::kInfo, absl::StrFormat("signal %d: shutting down", signal));
    g_server->Shutdown();
  });
  // On a failure below the waiter stays blocked; it touches only globals, so it may be left.
  auto fail = [&waiter] {
    waiter.detach();
    return 1;
  };

  absl::StatusOr<std::unique_ptr<Collector>> collector = Collector::Open(options);
  if (!collector.ok()) {
    Log(LogLevel::kError, collector.status().message());
    return fail();
  }
  absl::StatusOr<std::unique_ptr<CollectorServer>> server =
      CollectorServer::Start(collector->get(), server_options);
  if (!server.ok()) {
    Log(LogLevel::kError, server.status().message());
    return fail();
  }
  {
    absl::MutexLock lock(&g_server_mu);
    g_server = server->get();
  }
  int port = (*server)->port();
  std::unique_ptr<MetricsServer> metrics_server;
  const bool started = StartSideServices(flags, collector->get(), port, &metrics_server);
  if (!started) {
    (*server)->Shutdown();
    {
      absl::MutexLock lock(&g_server_mu);
      g_server = nullptr;
    }
    return fail();
  }
  Log(LogLevel::kInfo,
      absl::StrFormat(
          "serving on %s (port %d) with %s, data in %s, fsync %s, max message %d bytes, "
          "max disk %s, run history %s",
          server_options.listen, port, server_options.guard->Describe(), options.data_dir,
          options.fsync ? "always" : "never", server_options.max_message_bytes,
          options.max_disk_bytes == 0 ? std::string("unlimited")
                                      : absl::StrCat(options.max_disk_bytes),
          HistoryKind(options.database)));
  (*server)->Wait();
  waiter.join();
  Log(LogLevel::kInfo,
      absl::StrFormat("stopped: %d batches stored, %d duplicates ignored",
                      (*collector)->batches_stored(), (*collector)->batches_duplicate()));
  return 0;
}

int Main(int argc, char** argv) {
  // First, before any thread exists (recovery's, gRPC's): SIGINT/SIGTERM are taken by one thread
  // with sigwait, and every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  google::protobuf::SetLogHandler(&ProtobufLog);

  CLI::App app(kDescription, "vramscope-collector");
  CollectorFlags flags;
  flags.options.database = "";  // the daemon keeps a history by default: SQLite in the data dir
  flags.options.data_dir = DefaultDataDir();
  DefineFlags(app, &flags);
  if (std::optional<int> exit_code = cmdline::Parse(app, argc, argv)) return *exit_code;
  flags.server_options.max_message_bytes = static_cast<int>(flags.max_message_bytes);
  flags.options.fsync = flags.fsync == "always";
  if (int code = LoadGuard(&flags); code != 0) return code;
  return Serve(flags, signals);
}

}  // namespace
}  // namespace vramscope::collector

int main(int argc, char** argv) { return vramscope::collector::Main(argc, argv); }
