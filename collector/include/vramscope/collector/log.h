// A small stderr logger for the collector daemon (Debian 12's Abseil has no absl/log): one line
// per message, "<program> <I|W|E> <UTC time> <message>", written with one write(2).
// Thread safety: Log may be called from any thread.
#ifndef VRAMSCOPE_COLLECTOR_LOG_H_
#define VRAMSCOPE_COLLECTOR_LOG_H_

#include <absl/strings/string_view.h>

namespace vramscope::collector {

enum class LogLevel { kInfo, kWarning, kError };

void Log(LogLevel level, absl::string_view message);
// Set once at start-up; default "vramscope-collector".
void SetLogProgram(const char* program);
// Messages below `level` are dropped (tests quieten the logger with kError).
void SetMinLogLevel(LogLevel level);

}  // namespace vramscope::collector

#endif  // VRAMSCOPE_COLLECTOR_LOG_H_
