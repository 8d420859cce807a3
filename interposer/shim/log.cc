#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

namespace vramscope::interposer {
namespace {

constexpr int kMaxLinesPerSecond = 50;

constinit std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};
constinit std::atomic<std::int64_t> g_window_second{0};
constinit std::atomic<int> g_window_lines{0};
constinit std::atomic<std::uint64_t> g_dropped{0};
__attribute__((tls_model("initial-exec"))) constinit thread_local bool t_logging = false;

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarn:
      return "warning";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kOff:
      break;
  }
  return "";
}

// True if this line fits in the current one-second window.
bool TakeToken() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  const std::int64_t second = now.tv_sec;
  std::int64_t window = g_window_second.load(std::memory_order_relaxed);
  if (window != second &&
      g_window_second.compare_exchange_strong(window, second, std::memory_order_relaxed)) {
    g_window_lines.store(0, std::memory_order_relaxed);
  }
  return g_window_lines.fetch_add(1, std::memory_order_relaxed) < kMaxLinesPerSecond;
}

}  // namespace

void InitLogLevel() {
  const char* value = getenv("VRAMSCOPE_LOG");
  LogLevel level = LogLevel::kWarn;
  if (value != nullptr && value[0] != '\0') {
    if (strcmp(value, "off") == 0 || strcmp(value, "none") == 0 || strcmp(value, "0") == 0) {
      level = LogLevel::kOff;
    } else if (strcmp(value, "error") == 0) {
      level = LogLevel::kError;
    } else if (strcmp(value, "warn") == 0 || strcmp(value, "warning") == 0) {
      level = LogLevel::kWarn;
    } else if (strcmp(value, "info") == 0) {
      level = LogLevel::kInfo;
    } else if (strcmp(value, "debug") == 0 || strcmp(value, "trace") == 0) {
      level = LogLevel::kDebug;
    }
  }
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) <= g_level.load(std::memory_order_relaxed);
}

void WriteStderr(const char* text, std::size_t length) {
  while (length > 0) {
    const ssize_t n = write(STDERR_FILENO, text, length);
    if (n <= 0) return;  // EINTR or a closed stderr: give up quietly
    text += n;
    length -= static_cast<std::size_t>(n);
  }
}

void Log(LogLevel level, const char* format, ...) {
  if (!LogEnabled(level) || t_logging) return;
  t_logging = true;
  if (!TakeToken()) {
    g_dropped.fetch_add(1, std::memory_order_relaxed);
    t_logging = false;
    return;
  }
  char buffer[768];
  int used = snprintf(buffer, sizeof(buffer), "vramscope[%d] %s: ", static_cast<int>(getpid()),
                      LevelName(level));
  if (used < 0) used = 0;
  va_list args;
  va_start(args, format);
  int n = vsnprintf(buffer + used, sizeof(buffer) - static_cast<std::size_t>(used), format, args);
  va_end(args);
  if (n > 0) used += n;
  if (used > static_cast<int>(sizeof(buffer)) - 48) used = static_cast<int>(sizeof(buffer)) - 48;
  const std::uint64_t dropped = g_dropped.exchange(0, std::memory_order_relaxed);
  if (dropped != 0) {
    used += snprintf(buffer + used, sizeof(buffer) - static_cast<std::size_t>(used),
                     " (%llu lines dropped)", static_cast<unsigned long long>(dropped));
  }
  buffer[used++] = '\n';
  WriteStderr(buffer, static_cast<std::size_t>(used));
  t_logging = false;
}

}  // namespace vramscope::interposer
