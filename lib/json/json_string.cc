#include "vramscope/json/json_string.h"

#include <absl/strings/str_format.h>

#include <string>
#include <string_view>

#include "vramscope/utf8.h"

namespace vramscope::json {

std::string Quote(std::string_view text, QuoteFor where) {
  const std::string valid = ToValidUtf8(text);
  const bool script = where == QuoteFor::kScriptElement;
  std::string out = "\"";
  out.reserve(valid.size() + 2);
  for (const char c : valid) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (!script && (c == '\n' || c == '\r' || c == '\t')) {
      out += c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t";
    } else if (u < 0x20 || u == 0x7f || (script && (c == '<' || c == '>' || c == '&'))) {
      absl::StrAppendFormat(&out, "\\u%04x", u);
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

}  // namespace vramscope::json
