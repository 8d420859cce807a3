// A small stderr logger for the agent (Debian 12's Abseil has no absl/log): one line per message,
// "vramscope-agent <I|W|E> <UTC time> <message>", written with one write(2).
// Thread safety: Log may be called from any thread.
#ifndef VRAMSCOPE_AGENT_LOG_H_
#define VRAMSCOPE_AGENT_LOG_H_

#include <absl/strings/string_view.h>

namespace vramscope::agent {

enum class LogLevel { kInfo, kWarning, kError };

void Log(LogLevel level, absl::string_view message);
// Messages below `level` are dropped (tests quieten the logger with kError).
void SetMinLogLevel(LogLevel level);

}  // namespace vramscope::agent

#endif  // VRAMSCOPE_AGENT_LOG_H_
