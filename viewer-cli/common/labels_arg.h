// Run labels on the command line: `--label KEY=VALUE` (run, history, check --baseline-from) and
// the VRAMSCOPE_LABELS text that `vramscope run` hands its child. Rules and text form:
// vramscope/ring/labels.h (the shim checks the same way).
//
// Thread safety: pure functions. Error convention: absl::Status (InvalidArgument, saying what is
// wrong with which label).
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <map>
#include <string>
#include <string_view>

namespace vramscope::cli {

using Labels = std::map<std::string, std::string>;

// One `--label KEY=VALUE` (the value as given, no escapes); a key given again replaces the value.
absl::Status AddLabelArg(std::string_view arg, Labels* labels);
// VRAMSCOPE_LABELS's text form into `labels` (added to, replacing keys given again).
absl::Status ParseLabelsText(std::string_view text, Labels* labels);
// The text form of `labels` (',' and '\' in values escaped); InvalidArgument when it would pass
// the shim's limits (number of labels, total length).
absl::StatusOr<std::string> FormatLabelsText(const Labels& labels);
// "k=v,k2=v2" on one line for people (control characters in values escaped: \n, \xHH), ""
// for none.
std::string LabelsForDisplay(const Labels& labels);

}  // namespace vramscope::cli
