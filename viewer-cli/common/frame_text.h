// A stack frame as vramscope's sites write it, taken apart: `function (file:line)` (symbolized,
// viewer-cli/common/symbolize.h) or `PATH+0xOFFSET` (as the drain names a return address); any
// other text is a function name alone. Used by the Perfetto and PyTorch exports.
// Thread safety: a pure function.
#pragma once

#include <absl/strings/numbers.h>

#include <cstdint>
#include <string>

namespace vramscope::cli {

struct FrameText {
  std::string function;  // the whole text when not symbolized
  std::string file;      // symbolized: the source file; else the module PATH ("??" if none)
  std::int64_t line = 0;
  std::uint64_t offset = 0;  // PATH+0xOFFSET: OFFSET
  bool symbolized = false;
};

inline FrameText ParseFrameText(const std::string& text) {
  FrameText frame;
  const std::size_t open = text.rfind(" (");
  if (open != std::string::npos && text.size() > open + 2 && text.back() == ')') {
    const std::string inner = text.substr(open + 2, text.size() - open - 3);
    const std::size_t colon = inner.rfind(':');
    if (colon != std::string::npos && absl::SimpleAtoi(inner.substr(colon + 1), &frame.line)) {
      frame.function = text.substr(0, open);
      frame.file = inner.substr(0, colon);
      frame.symbolized = true;
      return frame;
    }
  }
  frame.function = text;
  const std::size_t plus = text.rfind("+0x");
  if (plus == std::string::npos || !absl::SimpleHexAtoi(text.substr(plus + 3), &frame.offset)) {
    frame.file = "??";
    frame.offset = 0;
    return frame;
  }
  frame.file = text.substr(0, plus);
  return frame;
}

}  // namespace vramscope::cli
