// fleet_load: a fleet load test driving the real binaries. It starts --collectors
// vramscope-collector processes and --agents vramscope-agent processes (each with its own ring
// directory, spool and --shard-key, as if on its own host, all given every collector), forks
// --processes traced "applications" per agent that write real rings with the ring writer library,
// replaying the bundled traces' allocation mix (traces/*.csv.gz: sizes, alloc/free pairing) at
// --rate events per second each, and measures:
//   * events written and stored per second (sustained, over the run);
//   * latency from ring write to Watch: each application notes when it wrote every Nth event; a
//     Watch stream per collector (50 ms) sees the process's alloc+free count pass it;
//   * the collectors' RSS, threads and CPU (from /proc), sampled every second;
//   * batches refused (the agents' final counters) and the exact count: at the end every log of
//     every collector is read, each (process, sequence) counted once, and the events of each
//     process compared with what it wrote (lost: fewer; doubled: a sequence stored twice in one
//     collector, or differently in two).
// --soak: collectors are SIGKILLed one after another every --kill-every seconds and restarted on
// their port after --down-for seconds, for the whole --duration.
// --synthetic-processes=N: instead, N processes are started directly over gRPC (one batch each,
// left running) and the collector's RSS is read: the live-table cost.
// --tls: TLS and bearer tokens on every connection: a throwaway CA and server certificate (for
// 127.0.0.1) made with the openssl command in a temporary directory, or copied from --tls-dir=DIR
// (ca.pem, server.pem, server.key: for machines without openssl), and random writer and reader
// tokens; the collectors get --tls-cert/--tls-key/--writer-token-file/--reader-token-file, the
// agents --tls-ca/--token-file (writer), the driver's Watch and ListProcesses the reader token.
// --collector-cpus=LIST (e.g. 0,1 or 0-1): every thread of every collector runs on those CPUs
// only (sched_setaffinity on each of its threads once it listens; later threads inherit it),
// the rest (driver, writers, agents) where fleet_load runs: a collector on a machine of its own
// with LIST's cores, the agents and applications standing for other hosts.
// --collector-args / --agent-args (or $VRAMSCOPE_LOAD_COLLECTOR_ARGS / _AGENT_ARGS): extra flags,
// split on spaces, for every collector / agent.
// Last line of a run: "result: key=value ..." (events_per_s, p50_ms, p99_ms, ...) for scripts.
//
// Exit codes: 0 the count check passed; 1 events lost or doubled (or not all stored in time); 2
// usage or a binary that would not start.
#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <absl/time/clock.h>
#include <absl/time/time.h>
#include <grpcpp/grpcpp.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "replay/trace_loader.h"
#include "tests/collector/test_util.h"
#include "tests/net/test_certs.h"
#include "tests/pipeline/subprocess.h"
#include "vramscope/collector/record_log.h"
#include "vramscope/net_security.h"
#include "vramscope/ring/ring_writer.h"
#include "vramscope/v1/collector.grpc.pb.h"

namespace vramscope::load {
namespace {

using ::vramscope::testing::Subprocess;
using ::vramscope::testing::TempDir;

struct Options {
  int collectors = 1;
  int agents = 2;
  int processes = 20;    // per agent
  int64_t rate = 20000;  // events per second per process
  double duration_s = 10;
  bool soak = false;
  double kill_every_s = 5;
  double down_for_s = 1;
  int synthetic_processes = 0;
  int watchers = 0;
  double watch_seconds = 20;
  double drain_timeout_s = 120;  // after writing, how long to wait for every event to be stored
  int checkpoint_every = 0;      // events between latency checkpoints (0: rate / 20)
  bool tls = false;
  std::string tls_dir;  // ca.pem, server.pem, server.key made elsewhere (empty: openssl here)
  std::vector<int> collector_cpus;  // empty: where fleet_load runs
  std::vector<std::string> traces;
  std::vector<std::string> collector_args;
  std::vector<std::string> agent_args;
  std::string collector_bin;
  std::string agent_bin;
};

constexpr int kMaxCheckpoints = 4096;

// One application's shared record (the driver maps it before forking).
struct Slot {
  std::atomic<int32_t> pid;
  std::atomic<uint64_t> written;  // alloc+free records the ring took
  std::atomic<uint64_t> refused;  // records the full ring refused (counted by the ring too)
  std::atomic<int32_t> checkpoints;
  std::atomic<uint64_t> checkpoint_ns[kMaxCheckpoints];  // CLOCK_MONOTONIC of event k*every
};

uint64_t MonoNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

// The driver's own credentials (the reader token with --tls; a writer's for direct ingest).
net::ClientCredentials g_reader;
net::ClientCredentials g_writer;

// The one place this driver makes a channel to a collector. `args` may ask for a connection of
// its own (a distinct channel argument).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           grpc::ChannelArguments args = {},
                                           const net::ClientCredentials& credentials = g_reader) {
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  return net::MakeChannel(address, credentials, std::move(args));
}

std::string RandomToken() {
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  unsigned char bytes[24] = {};
  urandom.read(reinterpret_cast<char*>(bytes), sizeof(bytes));
  std::string token;
  for (unsigned char b : bytes) token += absl::StrFormat("%02x", b);
  return token;
}

// --tls: writes certificates and token files under `dir` and adds the binaries' flags to
// `options`; false (with a message) when the files cannot be made.
bool SetUpSecurity(const std::string& dir, Options* options) {
  std::string ca = dir + "/ca.pem";
  std::string cert = dir + "/server.pem";
  std::string key = dir + "/server.key";
  auto write_secret = [&](const std::string& name, const std::string& text) {
    const std::string file = dir + "/" + name;
    std::ofstream(file, std::ios::trunc) << text;
    ::chmod(file.c_str(), 0600);  // the binaries refuse secrets others may read
    return file;
  };
  if (options->tls_dir.empty()) {
    testing::TestCerts certs(dir);
    if (!certs.ok()) {
      std::fprintf(stderr,
                   "fleet_load: cannot make certificates (--tls-dir=DIR gives made ones): %s\n",
                   certs.error().c_str());
      return false;
    }
  } else {
    for (const char* name : {"ca.pem", "server.pem", "server.key"}) {
      std::ifstream in(options->tls_dir + "/" + name);
      if (!in) {
        std::fprintf(stderr, "fleet_load: no %s in --tls-dir %s\n", name, options->tls_dir.c_str());
        return false;
      }
      write_secret(name, std::string(std::istreambuf_iterator<char>(in), {}));
    }
  }
  const std::string writer_token = RandomToken();
  const std::string reader_token = RandomToken();
  const std::string writers = write_secret("writers", "load-agents " + writer_token + "\n");
  const std::string readers = write_secret("readers", "load-driver " + reader_token + "\n");
  const std::string agent_token = write_secret("agent.token", writer_token + "\n");
  const std::string driver_token = write_secret("driver.token", reader_token + "\n");
  options->collector_args.insert(
      options->collector_args.end(),
      {"--tls-cert=" + cert, "--tls-key=" + key, "--writer-token-file=" + writers,
       "--reader-token-file=" + readers});
  options->agent_args.insert(options->agent_args.end(),
                             {"--tls-ca=" + ca, "--token-file=" + agent_token});
  net::ClientSecurity reader;
  reader.ca_file = ca;
  reader.token_file = driver_token;
  net::ClientSecurity writer = reader;
  writer.token_file = agent_token;
  absl::StatusOr<net::ClientCredentials> loaded = net::LoadClientCredentials(reader);
  absl::StatusOr<net::ClientCredentials> loaded_writer = net::LoadClientCredentials(writer);
  if (!loaded.ok() || !loaded_writer.ok()) {
    std::fprintf(stderr, "fleet_load: %s %s\n", loaded.status().ToString().c_str(),
                 loaded_writer.status().ToString().c_str());
    return false;
  }
  g_reader = *std::move(loaded);
  g_writer = *std::move(loaded_writer);
  return true;
}

std::vector<std::string> SplitArgs(const std::string& text) {
  return absl::StrSplit(text, ' ', absl::SkipWhitespace());
}

// The traced application: replays `ops` into its own ring at `rate` events per second.
[[noreturn]] void Application(const std::string& ring_dir, const std::vector<cli::ReplayOp>& ops,
                              uint32_t slots_per_cycle, const Options& options, Slot* slot,
                              const std::atomic<int>* go) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  interposer::RingWriter writer;
  interposer::RingOpenOptions ring;
  ring.dir = ring_dir.c_str();
  ring.capacity = 1u << 20;
  if (writer.Open(ring) != interposer::RingError::kOk) ::_exit(3);
  writer.SetDeviceInfo(0, "load", nullptr, uint64_t{141} << 30);
  slot->pid.store(::getpid());
  while (go->load() == 0) ::usleep(1000);
  const int every = options.checkpoint_every;
  const uint64_t start = MonoNs();
  const uint64_t end = start + static_cast<uint64_t>(options.duration_s * 1e9);
  uint64_t written = 0;
  uint64_t refused = 0;
  size_t at = 0;
  uint64_t cycle = 0;
  while (true) {
    const uint64_t now = MonoNs();
    if (now >= end) break;
    // Paced: as many events as the rate allows by now (in steps of about 1 ms).
    const uint64_t due = static_cast<uint64_t>(static_cast<double>(now - start) / 1e9 *
                                               static_cast<double>(options.rate));
    if (written + refused >= due) {
      ::usleep(1000);
      continue;
    }
    for (uint64_t n = written + refused; n < due; ++n) {
      const cli::ReplayOp& op = ops[at];
      const uint64_t address = 0x100000000000ull + ((cycle * slots_per_cycle + op.slot) << 9);
      const bool ok =
          op.is_free
              ? writer.RecordFree(0, address, op.size, op.size, VRAMSCOPE_RING_ALLOC_POOLED)
              : writer.RecordAlloc(0, address, op.size, op.size, VRAMSCOPE_RING_ALLOC_POOLED);
      if (ok) {
        ++written;
        if (every > 0 && written % static_cast<uint64_t>(every) == 0) {
          const int32_t k = slot->checkpoints.load(std::memory_order_relaxed);
          if (k < kMaxCheckpoints) {
            slot->checkpoint_ns[k].store(MonoNs(), std::memory_order_relaxed);
            slot->checkpoints.store(k + 1, std::memory_order_release);
          }
        }
      } else {
        ++refused;
      }
      if (++at == ops.size()) {
        at = 0;
        ++cycle;
      }
    }
    slot->written.store(written, std::memory_order_relaxed);
    slot->refused.store(refused, std::memory_order_relaxed);
  }
  slot->written.store(written);
  slot->refused.store(refused);
  writer.MarkExited(0);
  writer.Close();
  ::_exit(0);
}

struct ProcSample {
  uint64_t rss_bytes = 0;
  int threads = 0;
  double cpu_s = 0;  // user + system
};

ProcSample SampleProcess(pid_t pid) {
  ProcSample sample;
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      uint64_t kb = 0;
      std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipWhitespace());
      if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kb)) sample.rss_bytes = kb * 1024;
    } else if (line.rfind("Threads:", 0) == 0) {
      absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(8)), &sample.threads);
    }
  }
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string all((std::istreambuf_iterator<char>(stat)), {});
  const size_t close = all.rfind(')');
  if (close != std::string::npos) {
    std::vector<std::string> fields = absl::StrSplit(all.substr(close + 2), ' ');
    uint64_t utime = 0;
    uint64_t stime = 0;
    if (fields.size() > 13 && absl::SimpleAtoi(fields[11], &utime) &&
        absl::SimpleAtoi(fields[12], &stime)) {
      sample.cpu_s = static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
    }
  }
  return sample;
}

class Collectors {
 public:
  Collectors(const Options& options) : options_(options), dirs_(options.collectors) {
    processes_.resize(options.collectors);
    ports_.resize(options.collectors, 0);
  }
  bool Start(int i) {
    processes_[i] = std::make_unique<Subprocess>();
    std::vector<std::string> argv = {options_.collector_bin,
                                     absl::StrCat("--listen=127.0.0.1:", ports_[i]),
                                     "--data-dir=" + dirs_[i].path(), "--max-processes=100000"};
    argv.insert(argv.end(), options_.collector_args.begin(), options_.collector_args.end());
    if (!processes_[i]->Start(argv)) return false;
    const int port = processes_[i]->WaitForPort();
    if (port == 0) {
      std::fprintf(stderr, "collector %d did not start: %s\n", i, processes_[i]->output().c_str());
      return false;
    }
    ports_[i] = port;
    if (!options_.collector_cpus.empty() && !Pin(processes_[i]->pid())) return false;
    std::lock_guard<std::mutex> lock(mu_);
    pids_[i] = processes_[i]->pid();
    return true;
  }
  // Every thread of `pid` onto --collector-cpus (threads it starts later inherit the mask).
  bool Pin(pid_t pid) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : options_.collector_cpus) CPU_SET(cpu, &set);
    std::error_code error;
    int pinned = 0;
    for (const auto& task :
         std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), error)) {
      int tid = 0;
      if (!absl::SimpleAtoi(task.path().filename().string(), &tid)) continue;
      if (::sched_setaffinity(tid, sizeof(set), &set) != 0) {
        std::fprintf(stderr, "collector thread %d: sched_setaffinity: %s\n", tid, strerror(errno));
        return false;
      }
      ++pinned;
    }
    if (pinned == 0) std::fprintf(stderr, "collector %d: no thread to pin\n", pid);
    return pinned > 0;
  }
  void Kill(int i) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pids_.erase(i);
    }
    processes_[i]->Kill(SIGKILL);
    processes_[i]->Wait();
  }
  void StopAll() {
    for (auto& process : processes_) {
      if (process == nullptr) continue;
      process->Kill(SIGTERM);
      process->Wait();
    }
  }
  std::string Address(int i) const { return absl::StrCat("127.0.0.1:", ports_[i]); }
  std::string All() const {
    std::vector<std::string> all;
    for (int i = 0; i < options_.collectors; ++i) all.push_back(Address(i));
    return absl::StrJoin(all, ",");
  }
  std::map<int, pid_t> pids() const {
    std::lock_guard<std::mutex> lock(mu_);
    return pids_;
  }
  const std::string& dir(int i) const { return dirs_[i].path(); }

 private:
  const Options& options_;
  std::vector<TempDir> dirs_;
  std::vector<std::unique_ptr<Subprocess>> processes_;
  std::vector<int> ports_;
  mutable std::mutex mu_;
  std::map<int, pid_t> pids_;
};

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  size_t index = static_cast<size_t>(p * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(index, values.size() - 1)];
}

// Alloc and free events per process key (pid) over every collector's logs, each (process,
// sequence) once; `doubled` counts sequences stored twice in one directory or differently in two.
struct Stored {
  std::map<uint32_t, uint64_t> events;  // pid -> alloc+free events
  uint64_t batches = 0;
  uint64_t held_twice = 0;  // same batch at two collectors (counted once)
  uint64_t doubled = 0;
};

Stored ReadAllLogs(const Collectors& collectors, int count) {
  Stored stored;
  // (pid, start, sequence) -> CRC-free identity: the payload's size and events.
  std::map<std::tuple<uint32_t, uint64_t, uint64_t>, std::pair<int, std::string>> seen;
  for (int i = 0; i < count; ++i) {
    for (const auto& entry : std::filesystem::directory_iterator(collectors.dir(i))) {
      if (entry.path().extension() != ".vslog") continue;
      collector::LogScan scan;
      absl::Status read = collector::ReadLog(
          entry.path().string(),
          [&](uint64_t, absl::string_view payload) {
            v1::EventBatch batch;
            if (!batch.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
              return absl::OkStatus();
            }
            auto key = std::make_tuple(batch.process().pid(), batch.process().start_time_ns(),
                                       batch.sequence());
            auto [it, inserted] = seen.try_emplace(key, i, std::string(payload));
            if (!inserted) {
              if (it->second.first == i || it->second.second != payload) {
                ++stored.doubled;
              } else {
                ++stored.held_twice;
              }
              return absl::OkStatus();
            }
            ++stored.batches;
            uint64_t n = 0;
            for (const v1::Event& event : batch.events()) {
              n += (event.has_alloc() || event.has_free()) ? 1 : 0;
            }
            stored.events[batch.process().pid()] += n;
            return absl::OkStatus();
          },
          &scan);
      if (!read.ok()) std::fprintf(stderr, "%s\n", std::string(read.message()).c_str());
    }
  }
  return stored;
}

int Synthetic(const Options& options) {
  Collectors collectors(options);
  if (!collectors.Start(0)) return 2;
  const pid_t pid = collectors.pids().at(0);
  const ProcSample before = SampleProcess(pid);
  auto stub = v1::Collector::NewStub(MakeChannel(collectors.Address(0), {}, g_writer));
  auto reader_stub = v1::Collector::NewStub(MakeChannel(collectors.Address(0)));
  const absl::Time start = absl::Now();
  constexpr int kPerStream = 1000;
  uint64_t acked = 0;
  for (int first = 0; first < options.synthetic_processes; first += kPerStream) {
    grpc::ClientContext context;
    auto stream = stub->Ingest(&context);
    const int last = std::min(options.synthetic_processes, first + kPerStream);
    std::thread reader([&] {
      v1::IngestAck ack;
      for (int i = first; i < last && stream->Read(&ack); ++i) ++acked;
    });
    for (int i = first; i < last; ++i) {
      // A start event and 99 allocations each, left running (no exit).
      stream->Write(
          testing::Batch(testing::Key(static_cast<uint32_t>(i + 1), "synthetic"), 1, 100));
    }
    reader.join();
    stream->WritesDone();
    stream->Finish();
  }
  const absl::Duration took = absl::Now() - start;
  const ProcSample after = SampleProcess(pid);
  grpc::ClientContext context;
  v1::ListProcessesRequest request;
  v1::ListProcessesResponse list;
  reader_stub->ListProcesses(&context, request, &list);
  std::printf(
      "synthetic: %d live processes (%d listed, %d acknowledged) in %s; collector RSS %.1f MiB "
      "before, %.1f MiB after (%.1f KiB per process), %d threads\n",
      options.synthetic_processes, list.processes_size(), static_cast<int>(acked),
      absl::FormatDuration(took).c_str(), before.rss_bytes / 1048576.0, after.rss_bytes / 1048576.0,
      (static_cast<double>(after.rss_bytes) - static_cast<double>(before.rss_bytes)) / 1024.0 /
          std::max(1, options.synthetic_processes),
      after.threads);
  collectors.StopAll();
  return list.processes_size() == options.synthetic_processes ? 0 : 1;
}

// --watchers=N: N Watch streams (1 s interval) against one collector holding 10 processes, read
// for --watch-seconds; prints the collector's RSS and threads and the updates each watcher got.
int Watchers(const Options& options) {
  Collectors collectors(options);
  if (!collectors.Start(0)) return 2;
  const pid_t pid = collectors.pids().at(0);
  {
    auto stub = v1::Collector::NewStub(MakeChannel(collectors.Address(0), {}, g_writer));
    grpc::ClientContext context;
    auto stream = stub->Ingest(&context);
    for (int i = 0; i < 10; ++i) {
      stream->Write(testing::Batch(testing::Key(static_cast<uint32_t>(i + 1), "watched"), 1, 100));
      v1::IngestAck ack;
      stream->Read(&ack);
    }
    stream->WritesDone();
    stream->Finish();
  }
  const ProcSample before = SampleProcess(pid);
  constexpr int kPerChannel = 100;
  std::vector<std::unique_ptr<v1::Collector::Stub>> stubs;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::StatsUpdate>>> readers;
  for (int i = 0; i < options.watchers; ++i) {
    if (i % kPerChannel == 0) {
      grpc::ChannelArguments args;
      args.SetInt("vramscope.load.channel", i);  // a connection of its own
      stubs.push_back(v1::Collector::NewStub(MakeChannel(collectors.Address(0), args)));
    }
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    v1::WatchRequest request;
    request.set_interval_ms(1000);
    readers.push_back(stubs.back()->Watch(contexts.back().get(), request));
  }
  std::vector<int> updates(options.watchers, 0);
  const absl::Time start = absl::Now();
  ProcSample peak;
  while (absl::Now() - start < absl::Seconds(options.watch_seconds)) {
    for (int i = 0; i < options.watchers; ++i) {
      v1::StatsUpdate update;
      if (readers[i]->Read(&update)) ++updates[i];
    }
    ProcSample s = SampleProcess(pid);
    peak.rss_bytes = std::max(peak.rss_bytes, s.rss_bytes);
    peak.threads = std::max(peak.threads, s.threads);
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::vector<int> sorted = updates;
  std::sort(sorted.begin(), sorted.end());
  std::printf(
      "watchers: %d Watch streams at 1 s for %.1f s: updates per watcher min %d, median %d, max %d "
      "(expected about %.0f); collector RSS %.1f MiB before, peak %.1f MiB; threads peak %d\n",
      options.watchers, seconds, sorted.front(), sorted[sorted.size() / 2], sorted.back(),
      seconds + 1, before.rss_bytes / 1048576.0, peak.rss_bytes / 1048576.0, peak.threads);
  for (auto& context : contexts) context->TryCancel();
  for (auto& reader : readers) {
    v1::StatsUpdate update;
    while (reader->Read(&update)) {
    }
    reader->Finish();
  }
  collectors.StopAll();
  return sorted.front() >= static_cast<int>(seconds * 0.8) ? 0 : 1;
}

int Run(const Options& options) {
  // The trace mix: every bundled trace's allocs and frees, concatenated.
  std::vector<cli::ReplayOp> ops;
  uint32_t slots = 0;
  for (const std::string& path : options.traces) {
    absl::StatusOr<cli::LoadedTrace> trace = cli::LoadTraceFile(path);
    if (!trace.ok()) {
      std::fprintf(stderr, "fleet_load: %s\n", std::string(trace.status().message()).c_str());
      return 2;
    }
    uint32_t most = 0;
    for (cli::ReplayOp op : trace->ops) {
      most = std::max(most, op.slot + 1);
      op.slot += slots;
      ops.push_back(op);
    }
    slots += most;
  }
  if (ops.empty()) {
    std::fprintf(stderr, "fleet_load: no trace (--trace=FILE.csv.gz)\n");
    return 2;
  }

  Collectors collectors(options);
  for (int i = 0; i < options.collectors; ++i) {
    if (!collectors.Start(i)) return 2;
  }
  const int apps = options.agents * options.processes;
  void* shared = ::mmap(nullptr, sizeof(Slot) * apps + 64, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return 2;
  auto* go = static_cast<std::atomic<int>*>(shared);
  Slot* slot = reinterpret_cast<Slot*>(static_cast<char*>(shared) + 64);

  std::vector<TempDir> ring_dirs(options.agents);
  std::vector<TempDir> spool_dirs(options.agents);
  std::vector<pid_t> children;
  for (int a = 0; a < options.agents; ++a) {
    for (int p = 0; p < options.processes; ++p) {
      const pid_t child = ::fork();
      if (child == 0) {
        Application(ring_dirs[a].path(), ops, slots, options, &slot[a * options.processes + p], go);
      }
      children.push_back(child);
    }
  }
  std::vector<std::unique_ptr<Subprocess>> agents;
  for (int a = 0; a < options.agents; ++a) {
    agents.push_back(std::make_unique<Subprocess>());
    std::vector<std::string> argv = {options.agent_bin,
                                     "--ring-dir=" + ring_dirs[a].path(),
                                     "--spool-dir=" + spool_dirs[a].path(),
                                     "--collector=" + collectors.All(),
                                     absl::StrCat("--shard-key=load-host-", a),
                                     "--poll-interval-ms=10",
                                     "--max-backoff-ms=1000"};
    argv.insert(argv.end(), options.agent_args.begin(), options.agent_args.end());
    if (!agents.back()->Start(argv)) return 2;
  }
  std::map<int32_t, int> slot_of_pid;
  for (int i = 0; i < apps; ++i) {
    while (slot[i].pid.load() == 0) ::usleep(1000);
    slot_of_pid[slot[i].pid.load()] = i;
  }

  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<double> latencies_ms;
  std::vector<int32_t> seen_checkpoints(apps, 0);
  // The latest alloc+free count each collector reports for each application; a process split over
  // collectors by a failover is the sum (a batch held by two is rare and only counts early).
  std::vector<std::vector<uint64_t>> counts(apps, std::vector<uint64_t>(options.collectors, 0));
  uint64_t seen_total = 0;
  // Soak: events written when each kill happened, and how long until Watch showed them all.
  std::vector<std::pair<uint64_t, uint64_t>> kill_marks;  // (written at kill, kill time ns)
  std::vector<double> resend_ms;
  // Watchers: one Watch stream per collector, reconnecting when it is killed.
  std::vector<std::thread> watchers;
  std::vector<std::unique_ptr<grpc::ClientContext>> watch_contexts(options.collectors);
  std::mutex contexts_mu;
  for (int c = 0; c < options.collectors; ++c) {
    watchers.emplace_back([&, c] {
      while (!stop.load()) {
        auto stub = v1::Collector::NewStub(MakeChannel(collectors.Address(c)));
        auto context = std::make_unique<grpc::ClientContext>();
        grpc::ClientContext* raw = context.get();
        {
          std::lock_guard<std::mutex> lock(contexts_mu);
          if (stop.load()) return;
          watch_contexts[c] = std::move(context);
        }
        v1::WatchRequest request;
        request.set_interval_ms(50);
        auto reader = stub->Watch(raw, request);
        v1::StatsUpdate update;
        while (reader->Read(&update)) {
          const uint64_t now = MonoNs();
          std::lock_guard<std::mutex> lock(mu);
          for (const v1::ProcessStats& stats : update.processes()) {
            auto it = slot_of_pid.find(static_cast<int32_t>(stats.process().pid()));
            if (it == slot_of_pid.end() || stats.devices_size() == 0) continue;
            const int i = it->second;
            const uint64_t mine = stats.devices(0).alloc_count() + stats.devices(0).free_count();
            seen_total += mine - std::min(mine, counts[i][c]);
            counts[i][c] = mine;
            uint64_t count = 0;
            for (uint64_t n : counts[i]) count += n;
            const int32_t written = slot[i].checkpoints.load(std::memory_order_acquire);
            while (seen_checkpoints[i] < written &&
                   count >= static_cast<uint64_t>(seen_checkpoints[i] + 1) *
                                static_cast<uint64_t>(options.checkpoint_every)) {
              const uint64_t at = slot[i].checkpoint_ns[seen_checkpoints[i]].load();
              latencies_ms.push_back(static_cast<double>(now - at) / 1e6);
              ++seen_checkpoints[i];
            }
          }
          while (!kill_marks.empty() && seen_total >= kill_marks.front().first) {
            resend_ms.push_back(static_cast<double>(now - kill_marks.front().second) / 1e6);
            kill_marks.erase(kill_marks.begin());
          }
        }
        reader->Finish();
        if (!stop.load()) ::usleep(100000);
      }
    });
  }
  // Resource samples.
  std::vector<ProcSample> peaks(options.collectors);
  std::vector<double> cpu_total(options.collectors, 0);
  std::vector<double> cpu_base(options.collectors, 0);
  std::thread sampler([&] {
    std::map<int, pid_t> last;
    while (!stop.load()) {
      for (const auto& [i, pid] : collectors.pids()) {
        ProcSample s = SampleProcess(pid);
        std::lock_guard<std::mutex> lock(mu);
        peaks[i].rss_bytes = std::max(peaks[i].rss_bytes, s.rss_bytes);
        peaks[i].threads = std::max(peaks[i].threads, s.threads);
        if (last.count(i) && last[i] != pid) cpu_base[i] = cpu_total[i];  // restarted
        cpu_total[i] = cpu_base[i] + s.cpu_s;
        last[i] = pid;
      }
      ::usleep(200000);
    }
  });

  const absl::Time start = absl::Now();
  go->store(1);
  // Soak: kill and restart collectors on a schedule while the applications write.
  int kills = 0;
  if (options.soak && options.collectors > 0) {
    absl::Time next = start + absl::Seconds(options.kill_every_s);
    const absl::Time end = start + absl::Seconds(options.duration_s);
    while (next + absl::Seconds(options.down_for_s) < end) {
      absl::SleepFor(next - absl::Now());
      const int victim = kills % options.collectors;
      uint64_t written_now = 0;
      for (int i = 0; i < apps; ++i) written_now += slot[i].written.load();
      {
        std::lock_guard<std::mutex> lock(mu);
        kill_marks.emplace_back(written_now, MonoNs());
      }
      collectors.Kill(victim);
      ++kills;
      std::printf("soak: killed collector %d at %s\n", victim,
                  absl::FormatDuration(absl::Now() - start).c_str());
      absl::SleepFor(absl::Seconds(options.down_for_s));
      if (!collectors.Start(victim)) return 2;
      next += absl::Seconds(options.kill_every_s);
    }
  }
  for (pid_t child : children) {
    int status = 0;
    ::waitpid(child, &status, 0);
  }
  const absl::Duration writing = absl::Now() - start;
  uint64_t written = 0;
  uint64_t refused_by_ring = 0;
  for (int i = 0; i < apps; ++i) {
    written += slot[i].written.load();
    refused_by_ring += slot[i].refused.load();
  }
  // Everything written is stored once every process is finished at some collector: its exit
  // record is its last, and a process's batches are stored in sequence order wherever they go.
  auto finished_processes = [&]() {
    std::set<uint32_t> finished;
    for (int c = 0; c < options.collectors; ++c) {
      auto stub = v1::Collector::NewStub(MakeChannel(collectors.Address(c)));
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::ListProcessesRequest request;
      request.set_include_finished(true);
      v1::ListProcessesResponse list;
      if (!stub->ListProcesses(&context, request, &list).ok()) continue;
      for (const auto& p : list.processes()) {
        if (p.finished()) finished.insert(p.process().pid());
      }
    }
    return finished.size();
  };
  const absl::Time drain_deadline = absl::Now() + absl::Seconds(options.drain_timeout_s);
  bool drained = false;
  while (!(drained = finished_processes() >= static_cast<size_t>(apps)) &&
         absl::Now() < drain_deadline) {
    ::usleep(100000);
  }
  const absl::Duration until_stored = absl::Now() - start;
  stop.store(true);
  {
    std::lock_guard<std::mutex> lock(contexts_mu);
    for (auto& context : watch_contexts) {
      if (context != nullptr) context->TryCancel();
    }
  }
  for (std::thread& t : watchers) t.join();
  sampler.join();
  uint64_t rejected = 0;
  uint64_t dropped = 0;
  for (auto& agent : agents) {
    agent->Kill(SIGTERM);
    agent->Wait();
    const std::string out = agent->output();
    // The final counters line: "... dropped N (M events) rejected N ...".
    const size_t at = out.rfind("counters:");
    if (at != std::string::npos) {
      std::vector<std::string> words = absl::StrSplit(out.substr(at), ' ');
      for (size_t w = 0; w + 1 < words.size(); ++w) {
        uint64_t n = 0;
        if (words[w] == "rejected" && absl::SimpleAtoi(words[w + 1], &n)) rejected += n;
        if (words[w] == "dropped" && absl::SimpleAtoi(words[w + 1], &n)) dropped += n;
      }
    }
  }
  collectors.StopAll();
  const Stored stored = ReadAllLogs(collectors, options.collectors);
  uint64_t stored_events = 0;
  uint64_t lost = 0;
  uint64_t extra = 0;
  for (int i = 0; i < apps; ++i) {
    const uint32_t pid = static_cast<uint32_t>(slot[i].pid.load());
    const uint64_t want = slot[i].written.load();
    auto it = stored.events.find(pid);
    const uint64_t have = it == stored.events.end() ? 0 : it->second;
    stored_events += have;
    if (have < want) lost += want - have;
    if (have > want) extra += have - want;
  }
  double cpu = 0;
  uint64_t rss = 0;
  int threads = 0;
  for (int c = 0; c < options.collectors; ++c) {
    cpu += cpu_total[c];
    rss = std::max(rss, peaks[c].rss_bytes);
    threads = std::max(threads, peaks[c].threads);
  }
  const double seconds = absl::ToDoubleSeconds(writing);
  std::printf(
      "fleet: %d collector(s), %d agents x %d processes, %s%s\n"
      "  written %llu events in %.1f s (%.0f events/s; ring full %llu); all stored after %.1f s "
      "(%.0f events/s end to end)\n"
      "  ring-to-Watch latency p50 %.0f ms, p99 %.0f ms (%zu samples, Watch interval 50 ms)\n"
      "  collector peak RSS %.1f MiB, peak threads %d, CPU %.1f s (%.0f%% of one core)\n"
      "  batches refused %llu, dropped by agents %llu; stored %llu events in %llu batches, lost "
      "%llu, doubled %llu (batches stored twice %llu, same batch at two collectors %llu); "
      "collector kills %d; after a kill, Watch showed every event written before it within %.0f "
      "ms (worst of %zu)\n",
      options.collectors, options.agents, options.processes,
      absl::StrFormat("%d events/s per process", options.rate).c_str(),
      options.soak ? " (soak)" : "", static_cast<unsigned long long>(written), seconds,
      static_cast<double>(written) / seconds, static_cast<unsigned long long>(refused_by_ring),
      absl::ToDoubleSeconds(until_stored),
      static_cast<double>(stored_events) / absl::ToDoubleSeconds(until_stored),
      Percentile(latencies_ms, 0.5), Percentile(latencies_ms, 0.99), latencies_ms.size(),
      rss / 1048576.0, threads, cpu, 100.0 * cpu / absl::ToDoubleSeconds(until_stored),
      static_cast<unsigned long long>(rejected), static_cast<unsigned long long>(dropped),
      static_cast<unsigned long long>(stored_events),
      static_cast<unsigned long long>(stored.batches), static_cast<unsigned long long>(lost),
      static_cast<unsigned long long>(extra), static_cast<unsigned long long>(stored.doubled),
      static_cast<unsigned long long>(stored.held_twice), kills,
      resend_ms.empty() ? 0.0 : *std::max_element(resend_ms.begin(), resend_ms.end()),
      resend_ms.size());
  const bool ok = lost == 0 && extra == 0 && stored.doubled == 0;
  std::printf("count check: %s\n", ok                      ? "PASS (every event stored once)"
                                   : drained || extra != 0 ? "FAIL"
                                                           : "FAIL (not all stored within "
                                                             "--drain-timeout: lost means not yet "
                                                             "stored)");
  const double stored_seconds = absl::ToDoubleSeconds(until_stored);
  std::printf(
      "result: collectors=%d tls=%d written_per_s=%.0f stored_per_s=%.0f p50_ms=%.0f p99_ms=%.0f "
      "rss_mib=%.1f cpu_s=%.1f events_per_collector_cpu_s=%.0f refused=%llu dropped=%llu lost=%llu "
      "doubled=%llu kills=%d resend_ms=%.0f resends=%zu\n",
      options.collectors, options.tls ? 1 : 0, static_cast<double>(written) / seconds,
      static_cast<double>(stored_events) / stored_seconds, Percentile(latencies_ms, 0.5),
      Percentile(latencies_ms, 0.99), rss / 1048576.0, cpu,
      cpu > 0 ? static_cast<double>(stored_events) / cpu : 0.0,
      static_cast<unsigned long long>(rejected), static_cast<unsigned long long>(dropped),
      static_cast<unsigned long long>(lost),
      static_cast<unsigned long long>(extra + stored.doubled), kills,
      resend_ms.empty() ? 0.0 : *std::max_element(resend_ms.begin(), resend_ms.end()),
      resend_ms.size());
  return ok ? 0 : 1;
}

int Usage(const std::string& error) {
  std::fprintf(
      stderr,
      "fleet_load: %s\n"
      "usage: fleet_load --trace=FILE.csv.gz... [--collectors=N] [--agents=N]\n"
      "         [--processes=N (per agent)] [--rate=EVENTS_PER_S (per process)]\n"
      "         [--duration=S] [--drain-timeout=S] [--soak [--kill-every=S] [--down-for=S]]\n"
      "         [--collector-cpus=LIST]\n"
      "         [--synthetic-processes=N] [--watchers=N [--watch-seconds=S]]\n"
      "         [--tls | --tls-dir=DIR] [--collector-args='...'] "
      "[--agent-args='...']\n"
      "$VRAMSCOPE_COLLECTOR and $VRAMSCOPE_AGENT name the binaries.\n",
      error.c_str());
  return 2;
}

// "0,1", "2-15", "0,4-7": CPU numbers below CPU_SETSIZE.
bool ParseCpuList(const std::string& text, std::vector<int>* cpus) {
  cpus->clear();
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> range = absl::StrSplit(item, absl::MaxSplits('-', 1));
    int first = 0;
    int last = 0;
    if (!absl::SimpleAtoi(range[0], &first)) return false;
    last = first;
    if (range.size() == 2 && !absl::SimpleAtoi(range[1], &last)) return false;
    if (first < 0 || last < first || last >= CPU_SETSIZE) return false;
    for (int cpu = first; cpu <= last; ++cpu) cpus->push_back(cpu);
  }
  return !cpus->empty();
}

int Main(int argc, char** argv) {
  Options options;
  options.collector_bin = testing::BinaryFromEnv("VRAMSCOPE_COLLECTOR");
  options.agent_bin = testing::BinaryFromEnv("VRAMSCOPE_AGENT");
  options.collector_args = SplitArgs(testing::Env("VRAMSCOPE_LOAD_COLLECTOR_ARGS"));
  options.agent_args = SplitArgs(testing::Env("VRAMSCOPE_LOAD_AGENT_ARGS"));
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    double d = 0;
    int64_t n = 0;
    if (name == "--soak") {
      options.soak = true;
    } else if (name == "--tls" && eq == std::string::npos) {
      options.tls = true;
    } else if (name == "--tls-dir" && !value.empty()) {
      options.tls = true;
      options.tls_dir = value;
    } else if (name == "--trace") {
      options.traces.push_back(value);
    } else if (name == "--collector-cpus") {
      if (!ParseCpuList(value, &options.collector_cpus)) {
        return Usage("--collector-cpus wants CPUs as 0,1 or 0-3, not '" + value + "'");
      }
    } else if (name == "--collector-args") {
      for (auto& a : SplitArgs(value)) options.collector_args.push_back(a);
    } else if (name == "--agent-args") {
      for (auto& a : SplitArgs(value)) options.agent_args.push_back(a);
    } else if (!absl::SimpleAtod(value, &d) || d < 0) {
      return Usage("bad or unknown flag " + arg);
    } else if (name == "--collectors" && d >= 1) {
      options.collectors = static_cast<int>(d);
    } else if (name == "--agents" && d >= 1) {
      options.agents = static_cast<int>(d);
    } else if (name == "--processes" && d >= 1) {
      options.processes = static_cast<int>(d);
    } else if (name == "--rate" && d >= 1) {
      options.rate = static_cast<int64_t>(d);
    } else if (name == "--duration" && d > 0) {
      options.duration_s = d;
    } else if (name == "--kill-every" && d > 0) {
      options.kill_every_s = d;
    } else if (name == "--down-for" && d >= 0) {
      options.down_for_s = d;
    } else if (name == "--watchers" && absl::SimpleAtoi(value, &n) && n > 0) {
      options.watchers = static_cast<int>(n);
    } else if (name == "--drain-timeout" && d > 0) {
      options.drain_timeout_s = d;
    } else if (name == "--watch-seconds" && d > 0) {
      options.watch_seconds = d;
    } else if (name == "--synthetic-processes" && absl::SimpleAtoi(value, &n) && n > 0) {
      options.synthetic_processes = static_cast<int>(n);
    } else {
      return Usage("bad or unknown flag " + arg);
    }
  }
  if (options.collector_bin.empty() || options.agent_bin.empty()) {
    return Usage("$VRAMSCOPE_COLLECTOR and $VRAMSCOPE_AGENT must name the binaries");
  }
  options.checkpoint_every = static_cast<int>(std::max<int64_t>(1, options.rate / 20));
  TempDir security_dir;
  if (options.tls && !SetUpSecurity(security_dir.path(), &options)) return 2;
  if (options.synthetic_processes > 0) return Synthetic(options);
  if (options.watchers > 0) return Watchers(options);
  return Run(options);
}

}  // namespace
}  // namespace vramscope::load

int main(int argc, char** argv) { return vramscope::load::Main(argc, argv); }
