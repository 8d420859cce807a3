// libFuzzer target: the collector's log recovery (collector/record_log.h, Collector::Open), over a
// damaged or hostile log file in its data directory.
//
// Input: the image of one .vslog file (seeds: logs a Collector wrote, tests/fuzz/make_seeds.cc).
// Calls: ReadLog, FrameRecord; Collector::Open twice over a data directory holding the file,
// ListProcesses, GetReport.
// Contracts, beyond "no crash, no sanitizer finding":
//   - ReadLog fails only for a file that does not start with the magic; otherwise the records it
//     delivers, framed again, are exactly the file's first valid_bytes bytes, and valid_bytes is
//     the whole file unless damage is reported;
//   - that prefix alone re-reads to the same records without damage;
//   - recovery is done once: after Collector::Open cut the damage, a second Open loads the same
//     processes, batches and reports without a warning or error; and whatever was cut from a
//     corrupt (not torn) log was saved to the file's .corrupt-OFFSET copy.
#include <absl/strings/string_view.h>
#include <google/protobuf/stubs/logging.h>
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_check.h"
#include "vramscope/collector/collector.h"
#include "vramscope/collector/record_log.h"
#include "vramscope/log.h"

namespace vramscope::collector {
namespace {

CollectorOptions CollectorIn(const std::string& dir) {
  CollectorOptions options;
  options.data_dir = dir;
  return options;
}

void Write(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct Scan {
  absl::Status status;
  LogScan scan;
  std::vector<std::string> payloads;
};

Scan ReadAll(const std::string& path) {
  Scan result;
  result.status = ReadLog(
      path,
      [&](uint64_t, absl::string_view payload) {
        result.payloads.emplace_back(payload);
        return absl::OkStatus();
      },
      &result.scan);
  return result;
}

std::string Reports(const Collector& collector) {
  std::string all;
  const v1::ListProcessesResponse listed = collector.ListProcesses(true);
  for (const v1::ProcessSummary& summary : listed.processes()) {
    all += summary.ShortDebugString() + "\n";
    absl::StatusOr<v1::Report> report = collector.GetReport(summary.process());
    FUZZ_CHECK(report.ok(), "a listed process has no report: " + report.status().ToString());
    all += report->ShortDebugString() + "\n";
  }
  return all;
}

void Check(absl::string_view image) {
  char pattern[] = "/tmp/vramscope-log-fuzz.XXXXXX";
  if (mkdtemp(pattern) == nullptr) return;
  const std::string dir = pattern;
  const std::string path = dir + "/host_1_1.vslog";
  Write(path, image);

  // The reader alone.
  const Scan scan = ReadAll(path);
  const bool has_magic = image.substr(0, kLogMagic.size()) == kLogMagic;
  FUZZ_CHECK(scan.status.ok() == has_magic, "ReadLog: " + scan.status.ToString());
  if (has_magic) {
    FUZZ_CHECK(scan.scan.file_bytes == image.size(), "file size misread");
    FUZZ_CHECK(scan.scan.valid_bytes <= image.size(), "valid prefix beyond the end");
    FUZZ_CHECK(scan.scan.damaged == (scan.scan.valid_bytes < image.size()),
               "damage reported " + std::to_string(scan.scan.damaged) + " with " +
                   std::to_string(scan.scan.valid_bytes) + " of " + std::to_string(image.size()) +
                   " bytes valid");
    FUZZ_CHECK(scan.scan.records == scan.payloads.size(), "records miscounted");
    std::string framed(kLogMagic);
    for (const std::string& payload : scan.payloads) framed += FrameRecord(payload);
    FUZZ_CHECK(framed == image.substr(0, scan.scan.valid_bytes),
               "the delivered records are not the valid prefix");
    const std::string prefix_path = dir + "/prefix.bin";
    Write(prefix_path, framed);
    const Scan prefix = ReadAll(prefix_path);
    FUZZ_CHECK(prefix.status.ok() && !prefix.scan.damaged && prefix.payloads == scan.payloads,
               "the valid prefix does not re-read identically");
    std::filesystem::remove(prefix_path);
  }

  // Recovery by the collector, then a second start over what it left.
  std::string reports;
  LoadReport first;
  {
    auto collector = Collector::Open(CollectorIn(dir), &first);
    FUZZ_CHECK(collector.ok(), collector.status().ToString());
    reports = Reports(**collector);
  }
  const std::string recovered = std::filesystem::exists(path) ? Read(path) : "";
  if (first.files_loaded == 1) {
    FUZZ_CHECK(image.substr(0, recovered.size()) == recovered,
               "the recovered log is not a prefix of the file");
    if (!first.errors.empty()) {
      const std::string aside = path + ".corrupt-" + std::to_string(recovered.size());
      FUZZ_CHECK(Read(aside) == image.substr(recovered.size()),
                 "the corrupt part was not saved aside: " + first.errors[0]);
    }
  }
  LoadReport second;
  {
    auto collector = Collector::Open(CollectorIn(dir), &second);
    FUZZ_CHECK(collector.ok(), collector.status().ToString());
    FUZZ_CHECK(
        Reports(**collector) == reports,
        "a second recovery reports otherwise:\n" + Reports(**collector) + "instead of\n" + reports);
  }
  FUZZ_CHECK(second.files_loaded == first.files_loaded && second.batches == first.batches &&
                 second.events == first.events && second.truncated_bytes == 0 &&
                 second.warnings.empty(),
             "the recovered log needs recovering again: " +
                 (second.warnings.empty() ? std::string("counts differ") : second.warnings[0]));
  // A file the first start skipped is skipped again, for the same reason.
  FUZZ_CHECK(second.files_skipped == first.files_skipped, "skipped another number of files");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace vramscope::collector

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Invalid UTF-8 in a proto string is refused, and logged each time: not news here.
  google::protobuf::SetLogHandler(nullptr);
  // Above kError: every damaged log would log a line per input.
  vramscope::SetMinLogLevel(static_cast<vramscope::LogLevel>(3));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  vramscope::collector::Check(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
