// The shim's logger: formats into a stack buffer and write(2)s one line to stderr.
//
// Safe inside any hook: no heap allocation, no locks, no stdio. A thread-local guard drops a
// message logged while that thread is already logging (re-entrancy through a hooked call), and
// a global rate limit (kMaxLinesPerSecond) keeps a hot path that fails from flooding stderr;
// dropped lines are counted and reported with the next line that gets through.
// Level from VRAMSCOPE_LOG: error, warn (default), info, debug, or off.
#pragma once

#include <atomic>
#include <cstdint>

namespace vramscope::interposer {

enum class LogLevel : int { kOff = 0, kError = 1, kWarn = 2, kInfo = 3, kDebug = 4 };

// Reads VRAMSCOPE_LOG (getenv only). Called by init; safe to call again (after fork).
void InitLogLevel();
bool LogEnabled(LogLevel level);
void Log(LogLevel level, const char* format, ...) __attribute__((format(printf, 2, 3)));

// Writes `text` to stderr unconditionally (the VRAMSCOPE_SUMMARY line).
void WriteStderr(const char* text, std::size_t length);

}  // namespace vramscope::interposer

#define VRAMSCOPE_LOG(level, ...)                                                          \
  do {                                                                                     \
    if (::vramscope::interposer::LogEnabled(::vramscope::interposer::LogLevel::level))     \
      ::vramscope::interposer::Log(::vramscope::interposer::LogLevel::level, __VA_ARGS__); \
  } while (0)

// Logs at most once per call site for the life of the process.
#define VRAMSCOPE_LOG_ONCE(level, ...)                                     \
  do {                                                                     \
    static std::atomic<bool> vramscope_logged_once_{false};                \
    if (!vramscope_logged_once_.exchange(true, std::memory_order_relaxed)) \
      VRAMSCOPE_LOG(level, __VA_ARGS__);                                   \
  } while (0)

// For the impossible only: logs and aborts.
#define VRAMSCOPE_CHECK(cond)                                                               \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      ::vramscope::interposer::Log(::vramscope::interposer::LogLevel::kError,               \
                                   "check failed: %s at %s:%d", #cond, __FILE__, __LINE__); \
      __builtin_trap();                                                                     \
    }                                                                                       \
  } while (0)
