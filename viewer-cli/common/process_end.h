// How a traced process ended, in words, the same in every output of the CLI (run's text, the
// HTML page, `vramscope report`'s process list, top, check). The fields are Report's (and
// ProcessStats'/ProcessSummary's): finished, exit_code, killed, signal (0 = unknown).
// Header-only: pure functions, thread-safe.
#pragma once

#include <absl/strings/str_cat.h>
#include <string.h>

#include <cstdint>
#include <string>

namespace vramscope::cli {

// "SIGKILL" for 9; "signal N" for a number without a name.
inline std::string SignalName(std::int32_t signal) {
  const char* abbrev = signal > 0 ? sigabbrev_np(signal) : nullptr;
  return abbrev != nullptr ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", signal);
}

// "exited 0", "killed by SIGKILL (signal 9)", "vanished without an exit record (killed, signal
// unknown)", "still running".
inline std::string ProcessEndText(bool finished, std::int32_t exit_code, bool killed,
                                  std::int32_t signal) {
  if (!finished) return "still running";
  if (!killed) return absl::StrCat("exited ", exit_code);
  if (signal > 0) return absl::StrCat("killed by ", SignalName(signal), " (signal ", signal, ")");
  return "vanished without an exit record (killed, signal unknown)";
}

// The short form for a table column: "exited", "killed SIGKILL", "vanished"; "" while running.
inline std::string ProcessEndTag(bool finished, bool killed, std::int32_t signal) {
  if (!finished) return "";
  if (!killed) return "exited";
  return signal > 0 ? absl::StrCat("killed ", SignalName(signal)) : "vanished";
}

}  // namespace vramscope::cli
