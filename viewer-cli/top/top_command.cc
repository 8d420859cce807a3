// `vramscope top` and the `vramscope run --live` view: see top_command.h.
#include "top/top_command.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/time/clock.h>
#include <absl/time/time.h>
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>

#include "common/command.h"
#include "top/dashboard.h"
#include "top/nvml.h"
#include "top/top_model.h"
#include "top/watch_source.h"
#include "vramscope/command_line.h"
#include "vramscope/net_security.h"
#include "vramscope/process_key.h"

namespace vramscope::cli {
namespace {

using top::Dashboard;
using top::InputResult;
using top::TopModel;

constexpr char kDefaultCollector[] = "127.0.0.1:7411";

struct TopOptions {
  std::string collector = kDefaultCollector;
  absl::Duration interval = absl::Seconds(1);
  std::string filter;
  bool plain = false;
  bool once = false;
  net::ClientSecurity security;
  bool gpus = true;  // NVML's view of this machine's GPUs (--no-gpus: off)
};

// This machine's GPUs from NVML, given to the model at most once a second (an NVML query takes
// a few milliseconds). Without NVML it does nothing.
class GpuFeed {
 public:
  explicit GpuFeed(bool enabled) {
    if (!enabled) return;
    nvml_ = top::Nvml::Load();
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) == 0) host_ = host;
  }

  void Feed(TopModel& model) {
    if (nvml_ == nullptr || !model.has_data()) return;
    const absl::Time now = absl::Now();
    if (now - last_ < absl::Seconds(1)) return;
    last_ = now;
    model.SetGpus(nvml_->Query(), host_, model.time_ns());
  }

 private:
  std::unique_ptr<top::Nvml> nvml_;
  std::string host_;
  absl::Time last_ = absl::InfinitePast();
};

constexpr char kFooter[] =
    "Live dashboard of every process vramscope-collector knows: a row per process and device with "
    "allocated and reserved bytes now and at peak, fragmentation, allocations per second and "
    "OOMs; a graph of memory (the selected row or the total) over a window that fits how long it "
    "has been watched (30 s up to 60 min); the selected process's NVTX ranges and top allocation "
    "sites. Where NVML (the NVIDIA driver's libnvidia-ml.so.1) is present: a line per GPU of this "
    "machine with its capacity and used memory, and per GPU one row for the memory of this "
    "machine's processes that are not traced.\n"
    "Keys: q quit, s sort by the next column, r reverse, / filter by command or pid (Enter keeps, "
    "Esc cancels), j/k or arrows select, t graph selected/total, ? help.\n"
    "`vramscope run --live -- CMD` shows the same dashboard for CMD with no collector.\n"
    "Exit status: 0 ok; 2 usage; 3 the collector cannot be reached (in plain mode also when the "
    "stream to it breaks; the dashboard shows \"reconnecting\" and keeps trying).";

std::optional<absl::Duration> ParseInterval(const std::string& text) {
  double seconds = 0;
  if (absl::SimpleAtod(text, &seconds)) {
    if (seconds <= 0) return std::nullopt;
    return absl::Seconds(seconds);
  }
  absl::Duration duration;
  if (absl::ParseDuration(text, &duration) && duration > absl::ZeroDuration()) return duration;
  return std::nullopt;
}

void DefineFlags(CLI::App& app, TopOptions* options) {
  cmdline::MakeApp(app,
                   "[--collector ADDR] [--interval DURATION] [--filter TEXT] [--plain] [FLAGS]");
  app.footer(kFooter);
  app.add_option("--collector", options->collector,
                 "the collector (HOST:PORT); several, comma-separated, are merged (an agent "
                 "fleet's --collector a,b,c)")
      ->type_name("ADDR")
      ->check([](const std::string& value) {
        return value.empty() ? std::string("needs HOST:PORT (e.g. ") + kDefaultCollector + ")"
                             : std::string();
      });
  app.add_option_function<std::string>(
         "--interval",
         [options](const std::string& value) {
           std::optional<absl::Duration> interval = ParseInterval(value);
           if (!interval) {
             throw CLI::ValidationError("--interval '" + value +
                                        "' is not a positive duration (1, 0.5, 500ms, 2s)");
           }
           options->interval = *interval;
         },
         "update interval: seconds (1, 0.5) or 500ms, 2s (default 1s; the collector allows 50ms "
         "to 60s)")
      ->type_name("DURATION");
  app.add_option("--filter", options->filter,
                 "start with this filter (substring of the command line or pid)")
      ->type_name("TEXT");
  app.add_flag("--plain", options->plain,
               "plain lines instead of the dashboard (the default when stdout is not a terminal): "
               "one line per process and device per interval, key=value with bytes as integers, "
               "the command last");
  app.add_flag("--once", options->once, "print one snapshot in plain lines and exit");
  app.add_flag_callback(
      "--no-gpus", [options] { options->gpus = false; },
      "leave NVML alone: no GPU lines, no untraced row");
  cmdline::AddClientSecurityFlags(app, &options->security);
}

// False when stdout is gone (a closed pipe, where SIGPIPE is ignored).
bool PrintPlain(const TopModel& model) {
  for (const std::string& line : model.PlainGpuLines()) std::printf("%s\n", line.c_str());
  for (const top::Row& row : model.rows()) std::printf("%s\n", model.PlainLine(row).c_str());
  return std::fflush(stdout) == 0 && !std::ferror(stdout);
}

int RunPlain(const TopOptions& options, top::WatchSource& source) {
  TopModel model;
  model.SetFilter(options.filter);
  GpuFeed gpus(options.gpus);
  for (;;) {
    // The collector sends at once and then every interval; allow it ample slack.
    std::optional<v1::StatsUpdate> update = source.TakeUpdate(options.interval + absl::Seconds(30));
    if (!update) {
      if (source.broken()) {
        std::fprintf(stderr, "vramscope top: lost the collector at %s: %s\n",
                     options.collector.c_str(), source.last_error().c_str());
        return kExitUnreachable;
      }
      continue;
    }
    model.Update(*update);
    gpus.Feed(model);
    // The reader went away (`vramscope top | head`): nothing more to do.
    if (!PrintPlain(model)) return kExitOk;
    if (options.once) {
      if (model.rows().empty()) std::fprintf(stderr, "vramscope top: no traced process\n");
      return kExitOk;
    }
  }
}

int RunDashboard(const TopOptions& options, top::WatchSource& source) {
  TopModel model;
  model.SetFilter(options.filter);
  Dashboard dashboard(options.collector);
  if (!dashboard.Start()) return kExitUsage;
  GpuFeed gpus(options.gpus);
  std::string wanted;
  for (;;) {
    if (std::optional<v1::StatsUpdate> update = source.TakeUpdate()) model.Update(*update);
    gpus.Feed(model);
    if (std::optional<v1::Report> report = source.TakeReport()) {
      if (ProcessKeyString(report->process()) == model.SelectedProcessKey()) {
        model.SetDetails(*report);
      }
    }
    if (const top::Row* row = model.selected(); row != nullptr && row->process_key != wanted) {
      wanted = row->process_key;
      source.SetWantedReport(row->process);
    }
    dashboard.Draw(model, source.status());
    // Up to 100 ms for a key: the screen follows keys at once and updates within 0.1 s.
    if (dashboard.HandleInput(model, 100) == InputResult::kQuit) break;
  }
  dashboard.Stop();
  return kExitOk;
}

// `vramscope run --live`.
class LiveView : public RunLiveView {
 public:
  explicit LiveView(bool terminal)
      : terminal_(terminal), dashboard_("run --live"), gpus_(/*enabled=*/true) {}

  bool TakesTerminal() const override { return terminal_; }

  void Tick(const std::function<std::vector<v1::Report>()>& reports) override {
    if (closed_) return;
    if (terminal_ && !dashboard_.started()) {
      if (!dashboard_.Start()) {
        closed_ = true;
        return;
      }
    }
    const absl::Time now = absl::Now();
    bool changed = false;
    if (now - last_update_ >= absl::Seconds(1)) {
      last_update_ = now;
      Feed(reports(), now);
      changed = true;
      if (!terminal_) (void)PrintPlain(model_);
    }
    if (!terminal_) return;
    // Every key waiting, without blocking: the run's poll loop must go on.
    for (;;) {
      const InputResult result = dashboard_.HandleInput(model_, 0);
      if (result == InputResult::kNone) break;
      if (result == InputResult::kQuit) {
        dashboard_.Stop();
        closed_ = true;
        std::fprintf(stderr,
                     "vramscope run: dashboard closed; the report follows when the command "
                     "exits\n");
        return;
      }
      changed = true;
    }
    if (changed) dashboard_.Draw(model_, "");
  }

  void Close(const std::vector<v1::Report>& reports) override {
    if (closed_) return;
    closed_ = true;
    Feed(reports, absl::Now());
    if (terminal_) {
      dashboard_.Stop();
    } else {
      (void)PrintPlain(model_);
    }
  }

 private:
  void Feed(const std::vector<v1::Report>& reports, absl::Time now) {
    model_.Update(
        top::UpdateFromReports(reports, static_cast<std::uint64_t>(absl::ToUnixNanos(now))));
    gpus_.Feed(model_);
    const std::string key = model_.SelectedProcessKey();
    for (const v1::Report& report : reports) {
      if (ProcessKeyString(report.process()) == key) model_.SetDetails(report);
    }
  }

  const bool terminal_;
  bool closed_ = false;
  absl::Time last_update_ = absl::InfinitePast();
  TopModel model_;
  Dashboard dashboard_;
  GpuFeed gpus_;
};

}  // namespace

std::shared_ptr<void> DefineTopFlags(CLI::App& app) {
  auto options = std::make_shared<TopOptions>();
  DefineFlags(app, options.get());
  return options;
}

int RunTop(int argc, char** argv) {
  CLI::App app(std::string(kTopSummary), "vramscope top");
  TopOptions options;
  DefineFlags(app, &options);
  if (std::optional<int> exit_code = cmdline::Parse(app, argc, argv)) return *exit_code;
  absl::StatusOr<net::ClientCredentials> credentials = net::LoadClientCredentials(options.security);
  if (!credentials.ok()) {
    std::fprintf(stderr, "vramscope top: %s\n",
                 std::string(credentials.status().message()).c_str());
    return kExitUsage;
  }
  top::WatchSourceOptions source_options;
  source_options.address = options.collector;
  source_options.credentials = *std::move(credentials);
  source_options.interval = options.interval;
  top::WatchSource source(source_options);
  if (absl::Status status = source.Connect(); !status.ok()) {
    std::fprintf(stderr, "vramscope top: %s\n", std::string(status.message()).c_str());
    return kExitUnreachable;
  }
  const bool terminal = isatty(STDOUT_FILENO) && isatty(STDIN_FILENO);
  if (options.plain || options.once || !terminal) return RunPlain(options, source);
  return RunDashboard(options, source);
}

std::unique_ptr<RunLiveView> MakeRunLiveView() {
  return std::make_unique<LiveView>(isatty(STDOUT_FILENO) && isatty(STDIN_FILENO));
}

}  // namespace vramscope::cli
