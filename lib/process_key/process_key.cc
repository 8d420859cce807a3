// Process keys as text: see vramscope/process_key.h.
#include "vramscope/process_key.h"

#include <absl/strings/str_format.h>

namespace vramscope {

std::string ProcessKeyString(const v1::ProcessKey& key) {
  return absl::StrFormat("%s/%d/%d", key.host(), key.pid(), key.start_time_ns());
}

}  // namespace vramscope
