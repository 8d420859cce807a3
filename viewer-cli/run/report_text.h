// The readable report `vramscope run` prints at exit, one block per process and device.
#pragma once

#include <string>
#include <vector>

#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {

std::string FormatRunReport(const v1::Report& report);

}  // namespace vramscope::cli
