// Byte sizes for the `vramscope` verbs: the one grammar of vramscope/size_parse.h (shared with
// the shim, the agent and the collector), under the names the verbs use.
#pragma once

#include "vramscope/size_parse.h"

namespace vramscope::cli {

using ::vramscope::FormatBytes;
using ::vramscope::ParseSize;

}  // namespace vramscope::cli
