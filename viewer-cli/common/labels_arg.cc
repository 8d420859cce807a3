#include "common/labels_arg.h"

#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>

#include "vramscope/ring/labels.h"

namespace vramscope::cli {
namespace {

void AddParsed(void* context, std::string_view key, std::string_view value) {
  (*static_cast<Labels*>(context))[std::string(key)] = std::string(value);
}

}  // namespace

absl::Status AddLabelArg(std::string_view arg, Labels* labels) {
  const std::size_t equals = arg.find('=');
  if (equals == std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("label '", std::string(arg), "' is not KEY=VALUE (e.g. --label job=train)"));
  }
  const std::string_view key = arg.substr(0, equals);
  const std::string_view value = arg.substr(equals + 1);
  char why[160];
  if (!interposer::CheckLabel(key, value, why, sizeof(why))) {
    return absl::InvalidArgumentError(
        absl::StrCat(why, " (--label '", std::string(arg.substr(0, 80)), "')"));
  }
  (*labels)[std::string(key)] = std::string(value);
  return absl::OkStatus();
}

absl::Status ParseLabelsText(std::string_view text, Labels* labels) {
  char why[160];
  if (!interposer::ParseLabels(text, &AddParsed, labels, why, sizeof(why))) {
    return absl::InvalidArgumentError(why);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FormatLabelsText(const Labels& labels) {
  std::string text;
  for (const auto& [key, value] : labels) {
    if (!text.empty()) text += ',';
    absl::StrAppend(&text, key, "=");
    for (char c : value) {
      if (c == ',' || c == '\\') text += '\\';
      text += c;
    }
  }
  if (labels.size() > interposer::kMaxLabels) {
    return absl::InvalidArgumentError(
        absl::StrCat("more than ", interposer::kMaxLabels, " labels"));
  }
  if (text.size() > interposer::kMaxLabelsTextBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the labels take ", text.size(),
                                                   " bytes as VRAMSCOPE_LABELS, more than ",
                                                   interposer::kMaxLabelsTextBytes));
  }
  return text;
}

std::string LabelsForDisplay(const Labels& labels) {
  std::string text;
  for (const auto& [key, value] : labels) {
    if (!text.empty()) text += ',';
    absl::StrAppend(&text, key, "=");
    // One line: control characters (a newline in a value) are shown escaped.
    for (char c : value) {
      const auto byte = static_cast<unsigned char>(c);
      if (c == '\n') {
        text += "\\n";
      } else if (byte < 0x20 || byte == 0x7f) {
        absl::StrAppend(&text, "\\x", absl::Hex(byte, absl::kZeroPad2));
      } else {
        text += c;
      }
    }
  }
  return text;
}

}  // namespace vramscope::cli
