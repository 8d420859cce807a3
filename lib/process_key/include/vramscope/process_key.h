// How a process is named in files, messages and tables: "host/pid/start_time_ns". The agent's
// spool, the collector's tables and the CLI's merges and views all key processes by this text.
// Thread safety: pure functions.
#ifndef VRAMSCOPE_PROCESS_KEY_H_
#define VRAMSCOPE_PROCESS_KEY_H_

#include <string>

#include "vramscope/v1/events.pb.h"

namespace vramscope {

// "host/pid/start_time_ns", e.g. "node7/4242/1700000000000000000".
std::string ProcessKeyString(const v1::ProcessKey& key);

}  // namespace vramscope

#endif  // VRAMSCOPE_PROCESS_KEY_H_
