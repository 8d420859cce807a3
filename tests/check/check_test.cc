// vramscope check's parts in process: reading reports (one Report or {"reports": [...]}, corrupt
// input), the comparison rules, the table, JUnit XML and GitHub annotations, atomic writes.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "check/check_output.h"
#include "check/compare.h"
#include "common/report_file.h"

namespace vramscope::cli {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;

v1::Report MakeReport(std::vector<std::string> command, std::uint64_t requested,
                      std::uint64_t allocated, std::uint64_t reserved) {
  v1::Report report;
  for (const std::string& arg : command) report.add_command_line(arg);
  v1::DeviceReport* device = report.add_devices();
  device->set_peak_requested_bytes(requested);
  device->set_peak_allocated_bytes(allocated);
  device->set_peak_reserved_bytes(reserved);
  return report;
}

void AddRange(v1::Report* report, std::string domain, std::string name, std::uint64_t peak) {
  v1::NvtxRangeStats* range = report->mutable_devices(0)->add_nvtx_ranges();
  range->set_domain(domain);
  range->set_name(name);
  range->set_peak_allocated_bytes(peak);
}

const Figure* Find(const Comparison& comparison, const std::string& name) {
  for (const Figure& f : comparison.figures) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

TEST(ReportFileTest, ReadsOneReportExactly) {
  const auto reports = ParseReportsJson(
      R"({"command_line": ["./app"], "devices": [{"device": {"ordinal": 2},
          "peak_reserved_bytes": "18446744073709551615"}]})",
      "x.json");
  ASSERT_TRUE(reports.ok()) << reports.status();
  ASSERT_EQ(reports->size(), 1u);
  EXPECT_EQ((*reports)[0].devices(0).device().ordinal(), 2u);
  EXPECT_EQ((*reports)[0].devices(0).peak_reserved_bytes(), 18446744073709551615ull);
}

TEST(ReportFileTest, ReadsAListWithoutLosingPrecision) {
  const auto reports = ParseReportsJson(
      R"({"reports": [{"command_line": ["a"], "devices": [{"peak_allocated_bytes": 9007199254740993}]},
                      {"command_line": ["b"]}]})",
      "x.json");
  ASSERT_TRUE(reports.ok()) << reports.status();
  ASSERT_EQ(reports->size(), 2u);
  EXPECT_EQ((*reports)[0].devices(0).peak_allocated_bytes(), 9007199254740993ull);
  EXPECT_EQ((*reports)[1].command_line(0), "b");
  const auto empty = ParseReportsJson(R"({"reports": []})", "x.json");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(ReportFileTest, RejectsCorruptInputNamingTheFile) {
  for (const char* bad : {"", "  \n", "{", "[1, 2]", "{\"devices\": 3}", "{\"bogus\": 1}",
                          "{\"reports\": [{\"bogus\": 1}]}", "{\"reports\": 5}",
                          "{\"devices\": [{\"peak_reserved_bytes\": \"-1\"}]}"}) {
    const auto reports = ParseReportsJson(bad, "base.json");
    ASSERT_FALSE(reports.ok()) << bad;
    EXPECT_EQ(reports.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(reports.status().message().find("base.json"), std::string::npos) << reports.status();
    EXPECT_EQ(reports.status().message().find('\n'), std::string::npos) << reports.status();
  }
}

TEST(ReportFileTest, RejectsDeepNestingBeforeParsing) {
  // protobuf's parser takes minutes over these (the square of the depth); the pre-scan refuses
  // them at the 65th level.
  for (const std::string& deep :
       {std::string(100000, '['),
        "{\"reports\": " + std::string(50000, '[') + std::string(50000, ']') + "}",
        "{\"command_line\": " + std::string(50000, '[') + std::string(50000, ']') + "}"}) {
    const auto reports = ParseReportsJson(deep, "deep.json");
    ASSERT_FALSE(reports.ok());
    EXPECT_EQ(reports.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(reports.status().message().find("deep.json: JSON nested deeper than 64 levels"),
              std::string::npos)
        << reports.status();
  }
  // Brackets inside strings are text: a command line of 100 KB of brackets is a report.
  const auto bracketed = ParseReportsJson(
      "{\"command_line\": [\"" + std::string(50000, '[') + std::string(50000, '{') + "\"]}", "f");
  ASSERT_TRUE(bracketed.ok()) << bracketed.status();
  EXPECT_EQ((*bracketed)[0].command_line(0).size(), 100000u);
}

TEST(ReportFileTest, RejectsDuplicateDevicesAndRanges) {
  EXPECT_FALSE(ParseReportsJson(
                   R"({"devices": [{"device": {"ordinal": 1}}, {"device": {"ordinal": 1}}]})", "f")
                   .ok());
  EXPECT_FALSE(
      ParseReportsJson(R"({"devices": [{"nvtx_ranges": [{"name": "a"}, {"name": "a"}]}]})", "f")
          .ok());
  EXPECT_TRUE(
      ParseReportsJson(
          R"({"devices": [{"nvtx_ranges": [{"name": "a"}, {"name": "a", "domain": "d"}]}]})", "f")
          .ok());
}

TEST(ReportFileTest, MissingFileIsFailedPrecondition) {
  const auto reports = ReadReportsFile("/nonexistent/vramscope/report.json");
  ASSERT_FALSE(reports.ok());
  EXPECT_EQ(reports.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(reports.status().message().find("/nonexistent/vramscope/report.json"),
            std::string::npos);
  EXPECT_FALSE(ReadReportsFile("/").ok());
}

TEST(CompareTest, WithinToleranceIsNotARegression) {
  const Comparison c = Compare({MakeReport({"a"}, 100 * kMiB, 200 * kMiB, 400 * kMiB)},
                               {MakeReport({"a"}, 105 * kMiB, 190 * kMiB, 400 * kMiB)}, {});
  ASSERT_EQ(c.figures.size(), 3u);
  EXPECT_EQ(c.Count(Verdict::kWithin), 3);  // exactly +5% and -5% are within 5%
}

TEST(CompareTest, GrowthBeyondToleranceRegressesAndShrinkingImproves) {
  CompareOptions options;
  options.tolerance_percent = 2.5;
  const Comparison c = Compare({MakeReport({"a"}, 1000 * kMiB, 1000 * kMiB, 1000 * kMiB)},
                               {MakeReport({"b"}, 1026 * kMiB, 1025 * kMiB, 900 * kMiB)}, options);
  EXPECT_EQ(Find(c, "cuda:0 peak requested")->verdict, Verdict::kRegression);
  EXPECT_EQ(Find(c, "cuda:0 peak allocated")->verdict, Verdict::kWithin);
  EXPECT_EQ(Find(c, "cuda:0 peak reserved")->verdict, Verdict::kImprovement);
  EXPECT_NEAR(*Find(c, "cuda:0 peak requested")->DeltaPercent(), 2.6, 1e-9);
  EXPECT_EQ(Find(c, "cuda:0 peak reserved")->DeltaBytes(), -100.0 * kMiB);
}

TEST(CompareTest, NvtxRangesMatchByDomainAndName) {
  v1::Report base = MakeReport({"a"}, kMiB, kMiB, kMiB);
  v1::Report now = base;
  AddRange(&base, "train", "step", 100 * kMiB);
  AddRange(&base, "", "eval", 50 * kMiB);
  AddRange(&now, "", "step", 500 * kMiB);  // another domain: a different range
  AddRange(&now, "train", "step", 120 * kMiB);
  const Comparison c = Compare({base}, {now}, {});
  EXPECT_EQ(Find(c, "cuda:0 range train:step peak allocated")->verdict, Verdict::kRegression);
  EXPECT_EQ(Find(c, "cuda:0 range step peak allocated")->verdict, Verdict::kAdded);
  EXPECT_EQ(Find(c, "cuda:0 range eval peak allocated")->verdict, Verdict::kRemoved);
}

TEST(CompareTest, NewDevicesRegressFromTheFloor) {
  v1::Report base = MakeReport({"a"}, kMiB, kMiB, kMiB);
  v1::Report now = base;
  v1::DeviceReport* d = now.add_devices();
  d->mutable_device()->set_ordinal(1);
  d->set_peak_requested_bytes(kMiB - 1);
  d->set_peak_reserved_bytes(kMiB);
  const Comparison c = Compare({base}, {now}, {});
  EXPECT_EQ(Find(c, "cuda:1 peak requested")->verdict, Verdict::kAdded);
  EXPECT_EQ(Find(c, "cuda:1 peak reserved")->verdict, Verdict::kRegression);
  EXPECT_EQ(Find(c, "cuda:1 peak allocated")->verdict, Verdict::kAdded);  // 0 bytes
  CompareOptions any;
  any.new_floor_bytes = 0;
  const Comparison c0 = Compare({base}, {now}, any);
  EXPECT_EQ(Find(c0, "cuda:1 peak requested")->verdict, Verdict::kRegression);
  EXPECT_EQ(Find(c0, "cuda:1 peak allocated")->verdict, Verdict::kAdded);
  // And a baseline of 0 has no percentage: the floor decides too.
  const Comparison zero =
      Compare({MakeReport({"a"}, 0, 0, 0)}, {MakeReport({"a"}, 1, 0, 2 * kMiB)}, {});
  EXPECT_EQ(Find(zero, "cuda:0 peak requested")->verdict, Verdict::kWithin);
  EXPECT_EQ(Find(zero, "cuda:0 peak allocated")->verdict, Verdict::kWithin);
  EXPECT_EQ(Find(zero, "cuda:0 peak reserved")->verdict, Verdict::kRegression);
}

TEST(CompareTest, ProcessesMatchByCommandLineInOrder) {
  const std::vector<v1::Report> base = {
      MakeReport({"sh", "-c", "x"}, 0, 0, 0), MakeReport({"worker"}, kMiB, kMiB, 100 * kMiB),
      MakeReport({"worker"}, kMiB, kMiB, 200 * kMiB), MakeReport({"gone"}, kMiB, kMiB, 10 * kMiB)};
  const std::vector<v1::Report> now = {MakeReport({"worker"}, kMiB, kMiB, 100 * kMiB),
                                       MakeReport({"sh", "-c", "x"}, 0, 0, 0),
                                       MakeReport({"worker"}, kMiB, kMiB, 300 * kMiB)};
  const Comparison c = Compare(base, now, {});
  ASSERT_EQ(c.figures.size(), 12u);
  // Second worker: 200 -> 300 MiB.
  EXPECT_EQ(c.figures[8].process, "worker");
  EXPECT_EQ(c.figures[8].verdict, Verdict::kRegression);
  EXPECT_EQ(c.Count(Verdict::kRegression), 1);
  EXPECT_EQ(c.Count(Verdict::kRemoved), 3);
  EXPECT_EQ(c.figures[11].process, "gone");
}

TEST(OutputTest, TableListsWhatChangedAligned) {
  v1::Report base = MakeReport({"./train"}, 100 * kMiB, 1024 * kMiB, 2048 * kMiB);
  v1::Report now = MakeReport({"./train"}, 100 * kMiB, 1280 * kMiB, 1024 * kMiB);
  const Comparison c = Compare({base}, {now}, {});
  const std::string table = FormatCheckTable(c, {});
  EXPECT_NE(table.find("cuda:0 peak allocated  1.00 GiB  1.25 GiB   +256 MiB  +25.00%  REGRESSION"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("cuda:0 peak reserved   2.00 GiB  1.00 GiB  -1.00 GiB  -50.00%"),
            std::string::npos)
      << table;
  EXPECT_EQ(table.find("peak requested"), std::string::npos) << table;
  EXPECT_NE(table.find("1 of 3 figures within 5% of the baseline, 1 improved; FAIL: 1 regression"),
            std::string::npos)
      << table;
}

TEST(OutputTest, AnnotationsEscapeWorkflowCommands) {
  v1::Report base = MakeReport({"a"}, kMiB, kMiB, kMiB);
  AddRange(&base, "d", "50%,x\ny", 100 * kMiB);
  v1::Report now = MakeReport({"a"}, kMiB, kMiB, kMiB / 2);
  AddRange(&now, "d", "50%,x\ny", 200 * kMiB);
  const std::string out = FormatGitHubAnnotations(Compare({base}, {now}, {}), {});
  EXPECT_NE(out.find("::error title=vramscope%3A cuda%3A0 range d%3A50%25%2Cx%0Ay peak "
                     "allocated::grew 100.00%25 (100 MiB -> 200 MiB, +104857600 bytes), "
                     "tolerance 5%25\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("::notice title=vramscope%3A cuda%3A0 peak reserved::shrank 50.00%25"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace vramscope::cli
