// JSON string literals for every JSON the programs write (traces, `replay --json`, the data of the
// HTML report). One escaper, so every output is valid JSON whatever bytes a name holds.
//
// Thread safety: a pure function. Errors: none; any input gives a valid literal.
#ifndef VRAMSCOPE_JSON_JSON_STRING_H_
#define VRAMSCOPE_JSON_JSON_STRING_H_

#include <string>
#include <string_view>

namespace vramscope::json {

enum class QuoteFor {
  // A JSON document: the escapes RFC 8259 requires, \n \r \t in their short form, DEL as \u007f
  // (allowed raw, but invisible in a viewer).
  kDocument,
  // JSON inside an HTML <script> element: as above, and < > & as \u003c \u003e \u0026, so no
  // "</script>" or "<!--" can form; control characters all as \u00XX.
  kScriptElement,
};

// `text` as a JSON string literal, quotes included. Text that is not valid UTF-8 is first escaped
// as ToValidUtf8 does (vramscope/utf8.h: each bad byte as \xHH), so the result is always valid
// UTF-8 and the name stays recognisable.
std::string Quote(std::string_view text, QuoteFor where = QuoteFor::kDocument);

}  // namespace vramscope::json

#endif  // VRAMSCOPE_JSON_JSON_STRING_H_
