#include "export/export_command.h"

#include <absl/strings/numbers.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

#include "common/args.h"
#include "common/command.h"
#include "common/recorded_events.h"
#include "export/torch_snapshot.h"
#include "vramscope/collector/record_log.h"

namespace vramscope::cli {
namespace {

void PrintHelp(std::FILE* out) {
  std::fprintf(
      out,
      "usage: vramscope export --format torch-snapshot -o OUT [--pid PID] EVENTS\n"
      "\n"
      "Writes a PyTorch memory snapshot (the pickle torch.cuda.memory._dump_snapshot writes;\n"
      "open it at https://pytorch.org/memory_viz) of one process's allocations: every alloc,\n"
      "free and pool reservation per device with its stack (when recorded with --stacks) and\n"
      "NVTX range, and the segments live at the end.\n"
      "\n"
      "EVENTS is an event log: `vramscope run --events FILE -- CMD` writes one, and\n"
      "vramscope-collector keeps one per process (*.vslog in its data directory). A --json\n"
      "report holds figures, not the allocations, and is refused.\n"
      "\n"
      "  --pid PID   the process to export (default: the first one that allocated)\n"
      "\n"
      "exit codes: 0 written, 2 usage or unreadable input\n");
}

struct ExportOptions {
  std::string format;
  std::string output;
  std::string input;
  std::optional<std::uint32_t> pid;
};

std::optional<ExportOptions> Parse(int argc, char** argv) {
  ExportOptions options;
  ArgReader args("export", argc, argv);
  std::string pid;
  while (args.Next()) {
    if (args.Is("--format")) {
      if (!args.Value(&options.format)) return std::nullopt;
    } else if (args.Is("-o") || args.Is("--output")) {
      if (!args.Value(&options.output)) return std::nullopt;
    } else if (args.Is("--pid")) {
      std::uint32_t value = 0;
      if (!args.Value(&pid)) return std::nullopt;
      if (!absl::SimpleAtoi(pid, &value)) {
        std::fprintf(stderr, "vramscope export: --pid needs a number, not '%s'\n", pid.c_str());
        return std::nullopt;
      }
      options.pid = value;
    } else if (!args.arg().empty() && args.arg()[0] != '-' && options.input.empty()) {
      options.input = std::string(args.arg());
    } else {
      std::fprintf(stderr, "vramscope export: unexpected argument '%s'\n",
                   std::string(args.arg()).c_str());
      return std::nullopt;
    }
  }
  if (options.format != "torch-snapshot") {
    std::fprintf(stderr, "vramscope export: --format torch-snapshot is required (%s)\n",
                 options.format.empty() ? "none given" : "unknown format");
    return std::nullopt;
  }
  if (options.output.empty() || options.input.empty()) {
    std::fprintf(stderr, "vramscope export: needs -o OUT and an EVENTS file\n");
    return std::nullopt;
  }
  return options;
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

int RunExport(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      PrintHelp(stdout);
      return kExitOk;
    }
  }
  std::optional<ExportOptions> options = Parse(argc, argv);
  if (!options) {
    PrintHelp(stderr);
    return kExitUsage;
  }
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
