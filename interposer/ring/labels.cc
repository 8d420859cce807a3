#include "vramscope/ring/labels.h"

#include <stdarg.h>
#include <stdio.h>

#include "vramscope/utf8.h"

namespace vramscope::interposer {
namespace {

bool KeyChar(char c, bool first) {
  const bool alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
  return alpha || (!first && c >= '0' && c <= '9');
}

__attribute__((format(printf, 3, 4))) bool Fail(char* why, std::size_t why_size, const char* format,
                                                ...) {
  if (why != nullptr && why_size > 0) {
    va_list args;
    va_start(args, format);
    vsnprintf(why, why_size, format, args);
    va_end(args);
  }
  return false;
}

// At most the first 40 bytes of `text`, for "%.*s": a reason goes into one log or error line.
int Shown(std::string_view text) { return static_cast<int>(text.size() < 40 ? text.size() : 40); }

// Splits off the next label ("key=value" up to an unescaped ','), unescaping the value into
// `value_buffer`. `*rest` advances past the label and its separator.
bool NextLabel(std::string_view* rest, std::size_t index, std::string_view* key,
               std::string_view* value, char* value_buffer, char* why, std::size_t why_size) {
  const std::string_view item = *rest;
  const std::size_t equals = item.find('=');
  const std::size_t comma = item.find(',');
  if (equals == std::string_view::npos || (comma != std::string_view::npos && comma < equals)) {
    return Fail(why, why_size, "label %zu (\"%.*s\") has no '='", index + 1,
                Shown(item.substr(0, comma)), item.data());
  }
  *key = item.substr(0, equals);
  std::size_t length = 0;
  std::size_t i = equals + 1;
  for (; i < item.size() && item[i] != ','; ++i) {
    char c = item[i];
    if (c == '\\') {
      if (i + 1 >= item.size() || (item[i + 1] != ',' && item[i + 1] != '\\')) {
        return Fail(why, why_size, "label %zu (\"%.*s\"): '\\' must be followed by ',' or '\\'",
                    index + 1, Shown(*key), key->data());
      }
      c = item[++i];
    }
    if (length == kMaxLabelValueBytes) {
      return Fail(why, why_size, "label %zu (\"%.*s\"): value longer than 256 bytes", index + 1,
                  Shown(*key), key->data());
    }
    value_buffer[length++] = c;
  }
  *value = std::string_view(value_buffer, length);
  *rest = i < item.size() ? item.substr(i + 1) : std::string_view();
  return true;
}

}  // namespace

bool CheckLabel(std::string_view key, std::string_view value, char* why, std::size_t why_size) {
  if (key.empty()) return Fail(why, why_size, "a label key is empty");
  for (std::size_t i = 0; i < key.size(); ++i) {
    if (!KeyChar(key[i], i == 0)) {
      return Fail(why, why_size, "label key \"%.*s\" is not [A-Za-z_][A-Za-z0-9_]*", Shown(key),
                  key.data());
    }
  }
  if (key.size() > kMaxLabelKeyBytes) {
    return Fail(why, why_size, "label key \"%.*s...\" is longer than 64 bytes", Shown(key),
                key.data());
  }
  if (value.size() > kMaxLabelValueBytes) {
    return Fail(why, why_size, "label \"%.*s\": value longer than 256 bytes", Shown(key),
                key.data());
  }
  if (!IsValidUtf8(value)) {
    return Fail(why, why_size, "label \"%.*s\": value is not valid UTF-8", Shown(key), key.data());
  }
  return true;
}

bool ParseLabels(std::string_view text, LabelVisitor visit, void* context, char* why,
                 std::size_t why_size) {
  if (text.size() > kMaxLabelsTextBytes) {
    return Fail(why, why_size, "labels longer than %zu bytes", kMaxLabelsTextBytes);
  }
  char value_buffer[kMaxLabelValueBytes];
  // Pass 0 checks everything, pass 1 visits: a bad label anywhere means none is used.
  for (int pass = 0; pass < (visit == nullptr ? 1 : 2); ++pass) {
    std::string_view rest = text;
    for (std::size_t index = 0; !rest.empty(); ++index) {
      if (index == kMaxLabels) {
        return Fail(why, why_size, "more than %zu labels", kMaxLabels);
      }
      std::string_view key;
      std::string_view value;
      if (!NextLabel(&rest, index, &key, &value, value_buffer, why, why_size)) return false;
      if (!CheckLabel(key, value, why, why_size)) return false;
      if (pass == 1) visit(context, key, value);
    }
  }
  return true;
}

}  // namespace vramscope::interposer
