// The out-of-process logger: see vramscope/log.h.
#include "vramscope/log.h"

#include <absl/strings/str_format.h>
#include <errno.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <string>

namespace vramscope {
namespace {

// nullptr: program_invocation_short_name, read at each call (glibc sets it before main).
std::atomic<const char*> g_log_program{nullptr};
std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};

}  // namespace

void Log(LogLevel level, absl::string_view message) {
  if (static_cast<int>(level) < g_min_level.load(std::memory_order_relaxed)) return;
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  tm utc{};
  ::gmtime_r(&ts.tv_sec, &utc);
  const char tag = level == LogLevel::kInfo ? 'I' : level == LogLevel::kWarning ? 'W' : 'E';
  const char* program = g_log_program.load();
  if (program == nullptr) program = program_invocation_short_name;
  std::string line = absl::StrFormat("%s %c %02d:%02d:%02d.%03d %s\n", program, tag, utc.tm_hour,
                                     utc.tm_min, utc.tm_sec, ts.tv_nsec / 1000000, message);
  ssize_t ignored = ::write(2, line.data(), line.size());
  (void)ignored;
}

void SetMinLogLevel(LogLevel level) { g_min_level.store(static_cast<int>(level)); }

void SetLogProgram(const char* program) { g_log_program.store(program); }

}  // namespace vramscope
