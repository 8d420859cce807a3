#include "replay/replay_command.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "common/command.h"
#include "replay/snapshot_loader.h"
#include "vramscope/command_line.h"
#include "vramscope/json/json_string.h"
#include "vramscope/pool/pool.h"

namespace vramscope::cli {
namespace {

// A progress bar on stderr, drawn only when stderr is a terminal and only once the work has taken
// half a second (short traces, pipes and CI logs see nothing). Redrawn at most ten times a second.
class ProgressBar {
 public:
  ProgressBar() : enabled_(isatty(STDERR_FILENO) == 1), start_(Clock::now()) {}
  ~ProgressBar() { Clear(); }

  void Update(std::string_view phase, double fraction) {
    if (!enabled_) return;
    const Clock::time_point now = Clock::now();
    if (now - start_ < std::chrono::milliseconds(500)) return;
    if (drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    drawn_ = true;
    constexpr int kWidth = 40;
    fraction = std::clamp(fraction, 0.0, 1.0);
    const int filled = static_cast<int>(fraction * kWidth);
    std::fprintf(stderr, "\r%-7.*s [%s%s] %3d%%", static_cast<int>(phase.size()), phase.data(),
                 std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                 static_cast<int>(fraction * 100));
    std::fflush(stderr);
  }

  void Clear() {
    if (!drawn_) return;
    std::fputs("\r\033[K", stderr);  // back to the line start, erase it
    std::fflush(stderr);
    drawn_ = false;
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_;
  bool drawn_ = false;
  Clock::time_point start_;
  Clock::time_point last_draw_;
};

std::string Thousands(std::uint64_t value) {
  std::string digits = absl::StrCat(value);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

// "7.17 GiB"
std::string Human(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return absl::StrFormat("%d B", bytes);
  return absl::StrFormat("%.2f %s", value, kUnits[unit]);
}

// "7.17 GiB (7,701,353,160 B)"
std::string Bytes(std::uint64_t bytes) {
  if (bytes < 1024) return Human(bytes);
  return absl::StrFormat("%s (%s B)", Human(bytes), Thousands(bytes));
}

double Ratio(std::uint64_t numerator, std::uint64_t denominator) {
  return denominator == 0 ? 0.0 : static_cast<double>(numerator) / static_cast<double>(denominator);
}

// PolicyNames() split at its commas, the default first.
std::vector<std::string_view> PolicyList() {
  std::vector<std::string_view> names;
  std::string_view rest = vramscope::pool::PolicyNames();
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    names.push_back(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return names;
}

constexpr char kFooter[] =
    "Replays the alloc and free_requested events of a recorded allocation trace through "
    "vramscope's pool over a virtual upstream: address bookkeeping only, no GPU needed, every "
    "free reusable at once. Reports peak live, requested, allocated and reserved bytes, reserved "
    "over live, external fragmentation (1 - largest free block / free bytes) when reserved bytes "
    "reach their peak, upstream (driver) calls, and the host time the pool spends per alloc or "
    "free (the fastest of up to 5 runs, pool calls only).\n"
    "TRACE is a CSV file, plain or gzip-compressed, with the header "
    "action,addr,size,stream,time_us,site as recorded from PyTorch (see traces/README.md). "
    "free_completed, segment_alloc and segment_free rows are checked and skipped. The trace must "
    "be consistent: a free of an address that is not live, an alloc of a live address, a size of "
    "0 or above 2^48, a malformed number or an unknown action is an error naming FILE:LINE.\n"
    "TRACE may also be a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot, or `vramscope "
    "export --format torch-snapshot`): one device's trace is replayed, the first holding an alloc "
    "unless --device N says which. Frees of blocks allocated before the snapshot's history began "
    "are skipped. The pickle is read as plain data only: GLOBAL, REDUCE and every other "
    "object-building opcode are refused (exit 2), nothing is run.\n"
    "A progress bar is drawn on stderr when stderr is a terminal and the replay takes more than "
    "half a second.\n"
    "Exit codes: 0 ok; 2 bad usage, or a trace that cannot be read or is invalid; 1 the pool "
    "broke its contract (a bug: please report it).";

struct ReplayFlags {
  std::string trace;
  bool json = false;
  std::string policy;
  ReplayOptions options;
  std::optional<std::uint32_t> device;
};

std::string PolicyHelp() {
  std::string policies;
  for (std::string_view name : PolicyList()) {
    policies +=
        policies.empty() ? absl::StrFormat("%s (default)", name) : absl::StrFormat(", %s", name);
  }
  return "the pool's layout policy: " + policies;
}

void DefineFlags(CLI::App& app, ReplayFlags* flags) {
  cmdline::MakeApp(app,
                   "TRACE [--json] [--policy NAME] [--device N]\n"
                   "                        [--fence MODEL --gpu-lag US]");
  app.footer(kFooter);
  app.add_option("trace", flags->trace, "the trace (CSV, .csv.gz) or PyTorch snapshot")
      ->type_name("TRACE");
  app.add_flag("--json", flags->json, "print one JSON object on stdout instead of the table");
  app.add_option("--policy", flags->policy, PolicyHelp())
      ->type_name("NAME")
      ->check([](const std::string& policy) {
        for (std::string_view name : PolicyList()) {
          if (name == policy) return std::string();
        }
        return absl::StrFormat("unknown policy '%s' (known: %s)", policy,
                               vramscope::pool::PolicyNames());
      });
  app.add_option_function<std::uint32_t>(
         "--device", [flags](std::uint32_t device) { flags->device = device; },
         "a snapshot's device trace to replay")
      ->type_name("N");
  app.add_option("--fence", flags->options.fence,
                 "when a free becomes reusable: none (default: at once), gpuwait (the shim's "
                 "default rule: stream-aware event fences, reusable once the GPU passed the free; "
                 "rather than grow or wait on the host, every free so far is handed over to waits "
                 "on the GPU), events (VRAMSCOPE_FENCE_GPU_WAIT=0: the event fences with the lag "
                 "bound that waits on the host for the oldest fence rather than grow), devsync "
                 "(VRAMSCOPE_FENCE_EVENTS=0: a device synchronisation after 1,024 frees or 2.2 GB, "
                 "one at a time)")
      ->type_name("MODEL")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, FenceModel>{{"none", FenceModel::kNone},
                                            {"events", FenceModel::kEvents},
                                            {"gpuwait", FenceModel::kGpuWait},
                                            {"devsync", FenceModel::kDeviceSync}}));
  app.add_option("--gpu-lag", flags->options.gpu_lag_us,
                 "how far the GPU runs behind the trace's host times, microseconds (default 0; a "
                 "free never completes before its free_completed row)")
      ->type_name("US")
      ->check(CLI::Range(0, 60000000));
  app.add_option("--lag-fraction", flags->options.lag_fraction,
                 "events, gpuwait: wait (hand over) rather than grow while over 1/N of what the "
                 "pool holds waits for "
                 "fences (as VRAMSCOPE_FENCE_LAG_FRACTION; 0: grow)")
      ->type_name("N")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--map-piece", flags->options.map_piece_bytes,
                 "the physical handle size of the shim's vmm pool, bytes (as VRAMSCOPE_VMM_PIECE): "
                 "memory goes back to the driver in whole pieces; the map granularity (2 MiB) "
                 "gives back any free granule, 0 only whole mappings")
      ->type_name("BYTES")
      ->check(CLI::Range(std::size_t{0}, std::size_t{1} << 40));
  app.add_option("--handover-fraction", flags->options.handover_fraction,
                 "gpuwait: hand every free so far over rather than grow while over 1/N of what "
                 "the pool holds waits for fences (as VRAMSCOPE_FENCE_HANDOVER_FRACTION, default "
                 "256; 0: only past --lag-fraction)")
      ->type_name("N")
      ->check(CLI::Range(0, 1000000));
}

}  // namespace

std::string FormatReplayJson(const LoadedTrace& trace, const ReplayResult& result) {
  const vramscope::pool::PoolStats& s = result.stats;
  const std::uint64_t upstream_calls = s.upstream_grow_calls + s.upstream_shrink_calls;
  std::string out = "{\n";
  auto field = [&out](std::string_view key, const std::string& value) {
    absl::StrAppendFormat(&out, "%s  \"%s\": %s", out.size() > 2 ? ",\n" : "", key, value);
  };
  field("trace", json::Quote(trace.name));
  field("policy", json::Quote(result.policy));
  field("events", absl::StrCat(trace.ops.size()));
  field("alloc_events", absl::StrCat(trace.alloc_events));
  field("free_events", absl::StrCat(trace.free_events));
  field("skipped_events", absl::StrCat(trace.skipped_events));
  field("peak_live_bytes", absl::StrCat(trace.peak_live_bytes));
  field("peak_requested_bytes", absl::StrCat(s.peak_requested_bytes));
  field("peak_allocated_bytes", absl::StrCat(s.peak_allocated_bytes));
  field("peak_reserved_bytes", absl::StrCat(s.peak_reserved_bytes));
  field("reserved_over_live",
        absl::StrFormat("%.6f", Ratio(s.peak_reserved_bytes, trace.peak_live_bytes)));
  field("reserved_over_allocated",
        absl::StrFormat("%.6f", Ratio(s.peak_reserved_bytes, s.peak_allocated_bytes)));
  field("fragmentation_at_peak", absl::StrFormat("%.6f", result.fragmentation_at_peak));
  field("free_bytes_at_peak", absl::StrCat(result.free_bytes_at_peak));
  field("largest_free_block_at_peak", absl::StrCat(result.largest_free_block_at_peak));
  field("upstream_calls", absl::StrCat(upstream_calls));
  field("upstream_grow_calls", absl::StrCat(s.upstream_grow_calls));
  field("upstream_shrink_calls", absl::StrCat(s.upstream_shrink_calls));
  field("upstream_calls_per_alloc",
        absl::StrFormat("%.6f", Ratio(upstream_calls, trace.alloc_events)));
  field("upstream_mapped_pieces", absl::StrCat(result.upstream_mapped_pieces));
  field("ns_per_event", absl::StrFormat("%.1f", result.ns_per_event));
  field("timed_runs", absl::StrCat(result.timed_runs));
  field("oom_count", absl::StrCat(s.oom_count));
  field("failed_allocs", absl::StrCat(result.failed_allocs));
  field("live_at_end_count", absl::StrCat(trace.live_at_end_count));
  field("live_at_end_bytes", absl::StrCat(trace.live_at_end_bytes));
  if (result.options.fence != FenceModel::kNone) {
    field("fence_model", json::Quote(FenceModelName(result.options.fence)));
    field("gpu_lag_us", absl::StrCat(result.options.gpu_lag_us));
    field("host_wait_us", absl::StrCat(result.host_wait_us));
    field("lag_waits", absl::StrCat(result.lag_waits));
    field("fence_syncs", absl::StrCat(result.fence_syncs));
    field("handovers", absl::StrCat(result.handovers));
  }
  out += "\n}\n";
  return out;
}

std::string FormatReplayText(const LoadedTrace& trace, const ReplayResult& result) {
  const std::string_view names = vramscope::pool::PolicyNames();
  const bool default_policy = result.policy == names.substr(0, names.find(','));
  const vramscope::pool::PoolStats& s = result.stats;
  const std::uint64_t upstream_calls = s.upstream_grow_calls + s.upstream_shrink_calls;
  std::string out;
  auto row = [&out](std::string_view label, const std::string& value) {
    absl::StrAppendFormat(&out, "  %-23s %s\n", label, value);
  };
  absl::StrAppendFormat(&out, "replay of %s\n", trace.name);
  row("policy", absl::StrCat(result.policy, default_policy ? " (default)" : ""));
  row("events replayed",
      absl::StrFormat("%s (%s alloc, %s free; %s other rows skipped)", Thousands(trace.ops.size()),
                      Thousands(trace.alloc_events), Thousands(trace.free_events),
                      Thousands(trace.skipped_events)));
  row("peak live", Bytes(trace.peak_live_bytes));
  row("peak requested", Bytes(s.peak_requested_bytes));
  row("peak allocated", Bytes(s.peak_allocated_bytes));
  row("peak reserved", Bytes(s.peak_reserved_bytes));
  row("reserved / live",
      absl::StrFormat("%.3f", Ratio(s.peak_reserved_bytes, trace.peak_live_bytes)));
  row("fragmentation at peak",
      absl::StrFormat("%.3f (largest free block %s of %s free)", result.fragmentation_at_peak,
                      Human(result.largest_free_block_at_peak), Human(result.free_bytes_at_peak)));
  row("upstream calls",
      absl::StrFormat("%s (%s grow, %s shrink; %.4f per alloc)", Thousands(upstream_calls),
                      Thousands(s.upstream_grow_calls), Thousands(s.upstream_shrink_calls),
                      Ratio(upstream_calls, trace.alloc_events)));
  row("physical handles", absl::StrFormat("%s mapped (pieces of --map-piece)",
                                          Thousands(result.upstream_mapped_pieces)));
  row("pool host time", absl::StrFormat("%.1f ns per event (fastest of %d runs)",
                                        result.ns_per_event, result.timed_runs));
  row("out of memory", absl::StrCat(s.oom_count, result.failed_allocs > s.oom_count
                                                     ? absl::StrCat(" (", result.failed_allocs,
                                                                    " allocations refused)")
                                                     : ""));
  row("live at end", absl::StrFormat("%s allocations, %s", Thousands(trace.live_at_end_count),
                                     Bytes(trace.live_at_end_bytes)));
  if (result.options.fence != FenceModel::kNone) {
    row("fence model",
        absl::StrFormat(
            "%s, GPU %s us behind; host waited %s us for %s fences; %s syncs; %s handed over",
            FenceModelName(result.options.fence), Thousands(result.options.gpu_lag_us),
            Thousands(result.host_wait_us), Thousands(result.lag_waits),
            Thousands(result.fence_syncs), Thousands(result.handovers)));
  }
  return out;
}

std::shared_ptr<void> DefineReplayFlags(CLI::App& app) {
  auto flags = std::make_shared<ReplayFlags>();
  DefineFlags(app, flags.get());
  return flags;
}

namespace {

// Loads, replays and prints; the exit code.
int Execute(const ReplayFlags& flags) {
  const std::string& trace_path = flags.trace;
  const ReplayOptions& options = flags.options;
  const std::string& policy = flags.policy;
  ProgressBar bar;
  SnapshotLoadInfo snapshot;
  absl::StatusOr<LoadedTrace> trace = LoadAnyTrace(
      trace_path, flags.device, [&bar](double fraction) { bar.Update("reading", fraction); },
      &snapshot);
  if (!trace.ok()) {
    bar.Clear();
    std::fprintf(stderr, "vramscope replay: %s\n", std::string(trace.status().message()).c_str());
    return kExitUsage;
  }
  if (snapshot.frees_before_history > 0) {
    bar.Clear();
    std::fprintf(stderr,
                 "vramscope replay: %s: %llu frees of blocks allocated before the snapshot's "
                 "history began were skipped\n",
                 trace_path.c_str(),
                 static_cast<unsigned long long>(snapshot.frees_before_history));
  }
  absl::StatusOr<ReplayResult> result = ReplayTrace(
      *trace, policy,
      [&bar](std::string_view phase, double fraction) { bar.Update(phase, fraction); }, options);
  bar.Clear();
  if (!result.ok()) {
    std::fprintf(stderr, "vramscope replay: %s: %s\n", trace_path.c_str(),
                 std::string(result.status().message()).c_str());
    return result.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage
                                                                        : kExitCheckFailed;
  }
  const std::string report =
      flags.json ? FormatReplayJson(*trace, *result) : FormatReplayText(*trace, *result);
  std::fputs(report.c_str(), stdout);
  return kExitOk;
}

}  // namespace

int RunReplay(int argc, char** argv) {
  CLI::App app(std::string(kReplaySummary), "vramscope replay");
  ReplayFlags flags;
  DefineFlags(app, &flags);
  if (std::optional<int> exit_code = cmdline::Parse(app, argc, argv)) return *exit_code;
  if (app.count("--gpu-lag") > 0 && flags.options.fence == FenceModel::kNone) {
    return cmdline::UsageError(app, "--gpu-lag needs --fence events or --fence devsync");
  }
  if (flags.trace.empty()) return cmdline::UsageError(app, "missing TRACE");
  return Execute(flags);
}

}  // namespace vramscope::cli
