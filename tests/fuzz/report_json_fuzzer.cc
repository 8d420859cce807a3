// libFuzzer target: the JSON report reader of `vramscope check` (viewer-cli/common/report_file.h).
//
// Input: the text of a report file (seeds: reports as `vramscope run --json` writes them, one
// and several processes, tests/fuzz/make_seeds.cc).
// Calls: ParseReportsJson; FormatReportsJson (what `vramscope run --json` writes) for the round
// trip.
// Contracts, beyond "no crash, no sanitizer finding":
//   - errors are InvalidArgument and name the input;
//   - accepted reports have unique device ordinals and NVTX ranges per device (what the checker
//     matches figures by), and written back as `vramscope run --json` writes them they parse to
//     the same reports.
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/util/message_differencer.h>

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/report_file.h"
#include "common/report_text.h"
#include "tests/fuzz/fuzz_check.h"

namespace vramscope::cli {
namespace {

constexpr std::string_view kWhat = "fuzz.json";

void CheckSame(const std::vector<v1::Report>& a, const std::vector<v1::Report>& b,
               const char* how) {
  FUZZ_CHECK(a.size() == b.size(), std::string(how) + ": another number of reports");
  for (std::size_t i = 0; i < a.size(); ++i) {
    // Field by field: maps serialize in no fixed order.
    FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equals(a[i], b[i]),
               std::string(how) + ": report " + std::to_string(i) + " differs:\n" +
                   a[i].ShortDebugString() + "\nthen\n" + b[i].ShortDebugString());
  }
}

void Check(std::string_view json) {
  absl::StatusOr<std::vector<v1::Report>> reports = ParseReportsJson(json, kWhat);
  if (!reports.ok()) {
    FUZZ_CHECK(reports.status().code() == absl::StatusCode::kInvalidArgument,
               "unexpected error: " + reports.status().ToString());
    FUZZ_CHECK(std::string(reports.status().message()).find(kWhat) != std::string::npos,
               "the error does not name the input: " + reports.status().ToString());
    return;
  }
  for (const v1::Report& report : *reports) {
    std::set<std::uint32_t> ordinals;
    for (const v1::DeviceReport& device : report.devices()) {
      FUZZ_CHECK(ordinals.insert(device.device().ordinal()).second, "a device listed twice");
      std::set<std::pair<std::string, std::string>> ranges;
      for (const v1::NvtxRangeStats& range : device.nvtx_ranges()) {
        FUZZ_CHECK(ranges.emplace(range.domain(), range.name()).second, "a range listed twice");
      }
    }
  }
  absl::StatusOr<std::vector<v1::Report>> again =
      ParseReportsJson(FormatReportsJson(*reports), kWhat);
  FUZZ_CHECK(again.ok(), "the reports written back are refused: " + again.status().ToString());
  CheckSame(*reports, *again, "written back");
}

}  // namespace
}  // namespace vramscope::cli

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Invalid UTF-8 in a proto string is refused, and logged each time: not news here.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  vramscope::cli::Check(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
