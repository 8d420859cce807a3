// Text for proto3 `string` fields, which must hold well-formed UTF-8: a receiver's parser refuses
// a message with anything else (the collector rejects such a batch). The agent's drain and
// `vramscope run` pass every string that comes from the traced application (command line, host
// and GPU names, NVTX names, module paths) through ToValidUtf8 before it goes into a message; the
// collector checks incoming batches with IsValidUtf8.
//
// The escape: a string that is valid UTF-8 is left exactly as it is. Any other string has every
// backslash doubled ("\\") and every byte that does not belong to a well-formed UTF-8 sequence
// written as "\x" and two upper-case hex digits; well-formed characters in it are kept. Nothing
// is dropped, and UnescapeUtf8 gives the original bytes back for a string ToValidUtf8 changed.
// (Whether it did cannot be told from the result alone: a valid original with "\xE9" in it looks
// the same. Where exact bytes matter they travel beside the text, e.g.
// ProcessStartEvent.raw_command_line.)
//
// Thread safety: pure functions. Error convention: none (every input has a result).
#ifndef VRAMSCOPE_UTF8_H_
#define VRAMSCOPE_UTF8_H_

#include <string>
#include <string_view>

namespace vramscope {

// True when `text` is well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing
// above U+10FFFF), which is what protobuf requires of a string field.
bool IsValidUtf8(std::string_view text);

// The length of the longest prefix of `text` that is well-formed UTF-8.
std::size_t ValidUtf8Prefix(std::string_view text);

// `text` unchanged when it is valid UTF-8, else escaped as described above (always valid UTF-8).
std::string ToValidUtf8(std::string_view text);

// Reverses the escape of a string ToValidUtf8 changed: "\\" -> '\', "\xHH" -> that byte; any
// other backslash is kept as it is.
std::string UnescapeUtf8(std::string_view escaped);

}  // namespace vramscope

#endif  // VRAMSCOPE_UTF8_H_
