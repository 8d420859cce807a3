// `vramscope export`: converts a run's recorded events to other tools' formats. Today one:
// `--format torch-snapshot`, the pickle PyTorch's memory_viz opens (torch_snapshot.h).
#pragma once

#include <memory>
#include <string_view>

#include "common/command.h"

namespace vramscope::cli {

inline constexpr std::string_view kExportSummary =
    "convert a run's events for other tools (PyTorch memory_viz snapshot)";

int RunExport(int argc, char** argv);
std::shared_ptr<void> DefineExportFlags(CLI::App& app);

}  // namespace vramscope::cli
