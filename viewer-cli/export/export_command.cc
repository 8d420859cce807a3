#include "export/export_command.h"

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

#include "common/command.h"
#include "common/recorded_events.h"
#include "export/torch_snapshot.h"
#include "vramscope/collector/record_log.h"
#include "vramscope/command_line.h"

namespace vramscope::cli {
namespace {

constexpr char kFooter[] =
    "Writes a PyTorch memory snapshot (the pickle torch.cuda.memory._dump_snapshot writes; open "
    "it at https://pytorch.org/memory_viz) of one process's allocations: every alloc, free and "
    "pool reservation per device with its stack (when recorded with --stacks) and NVTX range, "
    "and the segments live at the end.\n"
    "EVENTS is an event log: `vramscope run --events FILE -- CMD` writes one, and "
    "vramscope-collector keeps one per process (*.vslog in its data directory). A --json report "
    "holds figures, not the allocations, and is refused.\n"
    "Exit codes: 0 written, 2 usage or unreadable input.";

struct ExportOptions {
  std::string format;
  std::string output;
  std::string input;
  std::optional<std::uint32_t> pid;
};

void DefineFlags(CLI::App& app, ExportOptions* options) {
  cmdline::MakeApp(app, "--format torch-snapshot -o OUT [--pid PID] EVENTS");
  app.footer(kFooter);
  app.add_option("--format", options->format, "the output format (today one: torch-snapshot)")
      ->type_name("FORMAT")
      ->required()
      ->check(CLI::IsMember({"torch-snapshot"}));
  app.add_option("-o,--output", options->output, "the file to write")
      ->type_name("FILE")
      ->required();
  app.add_option_function<std::uint32_t>(
         "--pid", [options](std::uint32_t pid) { options->pid = pid; },
         "the process to export (default: the first one that allocated)")
      ->type_name("PID");
  app.add_option("events", options->input, "the event log")->type_name("EVENTS")->required();
}

// A JSON report given where an event log belongs gets a message that says what to do.
bool LooksLikeJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char c = 0;
  while (in.get(c) && (c == ' ' || c == '\n' || c == '\r' || c == '\t')) {
  }
  return in && (c == '{' || c == '[');
}

const ProcessEvents* Choose(const RecordedEvents& events, std::optional<std::uint32_t> pid) {
  for (const ProcessEvents& process : events.processes()) {
    if (pid) {
      if (process.key.pid() == *pid) return &process;
      continue;
    }
    for (const v1::Event& event : process.events) {
      if (event.has_alloc()) return &process;
    }
  }
  return nullptr;
}

}  // namespace

std::shared_ptr<void> DefineExportFlags(CLI::App& app) {
  auto options = std::make_shared<ExportOptions>();
  DefineFlags(app, options.get());
  return options;
}

int RunExport(int argc, char** argv) {
  CLI::App app(std::string(kExportSummary), "vramscope export");
  auto options = std::make_shared<ExportOptions>();
  DefineFlags(app, options.get());
  if (std::optional<int> exit_code = cmdline::Parse(app, argc, argv)) return *exit_code;
  if (LooksLikeJson(options->input)) {
    std::fprintf(stderr,
                 "vramscope export: %s is a JSON report: reports hold figures, not the allocation "
                 "events a snapshot needs; record them with `vramscope run --events FILE -- CMD` "
                 "and export FILE\n",
                 options->input.c_str());
    return kExitUsage;
  }
  absl::StatusOr<RecordedEvents> events = ReadEventLog(options->input);
  if (!events.ok()) {
    std::fprintf(stderr, "vramscope export: %s\n", std::string(events.status().message()).c_str());
    return kExitUsage;
  }
  const ProcessEvents* process = Choose(*events, options->pid);
  if (process == nullptr) {
    std::fprintf(stderr, "vramscope export: %s: %s\n", options->input.c_str(),
                 options->pid ? "no process with that pid" : "no process allocated device memory");
    return kExitUsage;
  }
  TorchSnapshotStats stats;
  const std::string pickle = TorchSnapshot(*process, &stats);
  std::ofstream out(options->output, std::ios::binary | std::ios::trunc);
  out.write(pickle.data(), static_cast<std::streamsize>(pickle.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "vramscope export: cannot write %s\n", options->output.c_str());
    return kExitUsage;
  }
  std::fprintf(stderr,
               "vramscope export: %s: pid %u, %llu allocations, %llu frees, %llu segments at the "
               "end, %u device trace%s\n",
               options->output.c_str(), process->key.pid(),
               static_cast<unsigned long long>(stats.allocs),
               static_cast<unsigned long long>(stats.frees),
               static_cast<unsigned long long>(stats.segments_at_end), stats.devices,
               stats.devices == 1 ? "" : "s");
  return kExitOk;
}

}  // namespace vramscope::cli
