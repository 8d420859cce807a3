// The stderr logger of the out-of-process programs (Debian 12's Abseil has no absl/log): one line
// per message, "<program> <I|W|E> <UTC time> <message>", written with one write(2), so lines of
// concurrent threads do not interleave. <program> is the running program's name
// (program_invocation_short_name: vramscope-agent, vramscope-collector, vramscope) unless
// SetLogProgram names another. The shim has its own logger (interposer/shim/log.h): it runs
// inside the application, where this one (Abseil, heap) may not.
// Thread safety: every function may be called from any thread; the level and the program are
// process-wide.
#ifndef VRAMSCOPE_LOG_H_
#define VRAMSCOPE_LOG_H_

#include <absl/strings/string_view.h>

namespace vramscope {

enum class LogLevel { kInfo, kWarning, kError };

void Log(LogLevel level, absl::string_view message);
// Messages below `level` are dropped (tests quieten the logger with kError).
void SetMinLogLevel(LogLevel level);
// The name lines start with; `program` must outlive every later Log call (a literal).
void SetLogProgram(const char* program);

}  // namespace vramscope

#endif  // VRAMSCOPE_LOG_H_
