// vramscope-collector: receives agents' event batches over gRPC, stores them per process in the
// data directory, and serves live statistics and reports. Exit codes: 0 after a clean shutdown
// (SIGINT/SIGTERM), 1 when the data directory or the listening address cannot be used, 2 usage
// (also: unusable TLS or token files, or a listener beyond loopback without TLS and tokens).
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_replace.h>
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
#include "vramscope/log.h"

namespace vramscope::collector {
namespace {

constexpr char kUsage[] = R"(usage: vramscope-collector [FLAGS]

Receives event batches from vramscope-agent, stores them per process (append-only, CRC-checked),
and serves live statistics (Watch), reports (GetReport) and ListProcesses over gRPC.

  --listen=HOST:PORT         address to serve on (default 127.0.0.1:7411: loopback only;
                             0.0.0.0:7411 serves the network, port 0 picks a free port)
  --data-dir=DIR             where process logs live (default $HOME/.local/share/vramscope/collector,
                             /var/lib/vramscope/collector for root)
  --max-message-bytes=SIZE   largest gRPC message accepted (default 16M)
  --max-processes=N          processes tracked at most per writer (token, or client
                             certificate with mutual TLS and no tokens) (default 4096)
  --max-disk-bytes=SIZE      bytes the logs may occupy; batches beyond are refused with
                             RESOURCE_EXHAUSTED and not acknowledged (default 0 = the disk's limit)
  --fsync=always|never       never (default): a batch is acknowledged once written to its
                             process's data file, which survives a collector crash, kill or
                             restart (the page cache outlives the process) but not a power
                             loss; always: fdatasync each batch before acknowledging it, power
                             loss included, at about a third of the ingest rate
  --port-file=FILE           write the port actually bound to FILE (useful with port 0)
  --database=DB              the run history (ListRuns, GetRun; `vramscope history`): every
                             finished process becomes a row. Default: SQLite in
                             DATA-DIR/history.sqlite; postgresql://USER@HOST:PORT/DB (a libpq
                             URI) shares one history between collectors; sqlite:PATH; off.
                             Rows queue in DATA-DIR/history-queue while the database is down
  --metrics-listen=HOST:PORT serve Prometheus metrics at http://HOST:PORT/metrics (off unless
                             given; :PORT or PORT means 127.0.0.1:PORT; port 0 picks a free one)
  --metrics-retention=DUR    how long a finished process stays in the metrics (default 5m;
                             e.g. 30s, 10m, 1h)
  --metrics-port-file=FILE   write the metrics port actually bound to FILE
@SECURITY@  --version                  the version, then exit
  --help                     this text

SIZE takes a K, M, G or T suffix (powers of 1024). Beyond loopback the collector serves only with
TLS and tokens, or with --insecure. --max-processes is per writer: per token when there are
tokens, per client certificate with mutual TLS and no tokens.
)";

std::string UsageText() {
  return absl::StrReplaceAll(kUsage, {{"@SECURITY@", net::kServerFlagsHelp}});
}

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

int Usage(const std::string& error) {
  std::fprintf(stderr, "vramscope-collector: %s\n\n%s", error.c_str(), UsageText().c_str());
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

  // 0, or the exit code of a usage error.
  int Parse(const std::string& name, const std::string& value) {
    if (name == "metrics-listen") {
      absl::StatusOr<std::string> address = MetricsListenAddress(value);
      if (!address.ok()) return Usage(std::string(address.status().message()));
      listen = *address;
    } else if (name == "metrics-retention") {
      if (!absl::ParseDuration(value, &options.retention) ||
          options.retention < absl::ZeroDuration()) {
        return Usage(absl::StrCat("--metrics-retention=", value, ": want a duration (30s, 5m)"));
      }
    } else if (name == "metrics-port-file") {
      port_file = value;
    } else {
      return Usage(absl::StrCat("unknown flag --", name));
    }
    return 0;
  }

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

int Main(int argc, char** argv) {
  // First, before any thread exists (recovery's, gRPC's): SIGINT/SIGTERM are taken by one thread
  // with sigwait, and every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  google::protobuf::SetLogHandler(&ProtobufLog);

  ServerOptions server_options;
  CollectorOptions options;
  options.database = "";  // the daemon keeps a history by default: SQLite in the data directory
  options.data_dir = DefaultDataDir();
  std::string port_file;
  MetricsFlags metrics;
  net::ServerSecurity security;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(UsageText().c_str(), stdout);
      return 0;
    }
    if (arg == "--version") {
      std::printf("%s %s\n", "vramscope-collector", VRAMSCOPE_VERSION);
      return 0;
    }
    if (arg == "--insecure") {
      security.insecure = true;
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
    auto size = [&]() { return ParseSize(value); };
    if (name == "listen") {
      server_options.listen = value;
    } else if (name == "data-dir") {
      options.data_dir = value;
    } else if (name == "max-message-bytes") {
      std::optional<uint64_t> v = size();
      if (!v || *v < 1024 || *v > (uint64_t{1} << 31) - 1) {
        return Usage(absl::StrCat("--max-message-bytes=", value, ": want 1K .. 2G"));
      }
      server_options.max_message_bytes = static_cast<int>(*v);
    } else if (name == "max-processes") {
      uint32_t v = 0;
      if (!absl::SimpleAtoi(value, &v) || v == 0) {
        return Usage(absl::StrCat("--max-processes=", value, ": want a positive count"));
      }
      options.max_processes = v;
    } else if (name == "max-disk-bytes") {
      std::optional<uint64_t> v = size();
      if (!v) return Usage(absl::StrCat("--max-disk-bytes=", value, ": want a size"));
      options.max_disk_bytes = *v;
    } else if (name == "fsync") {
      if (value != "always" && value != "never") {
        return Usage(absl::StrCat("--fsync=", value, ": want always or never"));
      }
      options.fsync = value == "always";
    } else if (name == "port-file") {
      port_file = value;
    } else if (name == "database") {
      options.database = value;
    } else if (absl::StartsWith(name, "metrics-")) {
      if (int code = metrics.Parse(name, value); code != 0) return code;
    } else if (net::SetServerFlag(name, value, &security)) {
    } else {
      return Usage(absl::StrCat("unknown flag --", name));
    }
  }

  // Security first: a refused setting is reported before a long recovery, never after it.
  absl::StatusOr<std::unique_ptr<net::ServerGuard>> guard =
      net::ServerGuard::Load(security, CollectorMethodRoles());
  if (!guard.ok()) {
    Log(LogLevel::kError, guard.status().message());
    return 2;
  }
  std::string listen_warning;
  if (absl::Status allowed = (*guard)->CheckListen(server_options.listen, &listen_warning);
      !allowed.ok()) {
    Log(LogLevel::kError, allowed.message());
    return 2;
  }
  if (!listen_warning.empty()) Log(LogLevel::kWarning, listen_warning);
  server_options.guard = *std::move(guard);

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
  bool started = port_file.empty() || WritePortFile(port_file, port);
  if (started && !metrics.listen.empty()) {
    metrics_server = metrics.Serve(collector->get());
    started =
        metrics_server != nullptr &&
        (metrics.port_file.empty() || WritePortFile(metrics.port_file, metrics_server->port()));
  }
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

}  // namespace
}  // namespace vramscope::collector

int main(int argc, char** argv) { return vramscope::collector::Main(argc, argv); }
