// The HTML page of `vramscope report` rendered by headless Chromium (Debian's `chromium`, which
// scripts/install-deps.sh installs): its script ran and drew one plot per device (one path per
// series with one point per timeline point, one shaded rect per NVTX range instance), every
// figure in the rendered tables equals the JSON report's, and a hostile NVTX name stayed text.
// Chromium missing is a failure, not a skip: CI installs it.
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "check/report_file.h"
#include "run/report_text.h"
#include "tests/collector/test_util.h"
#include "tests/report/dom_check.h"
#include "tests/report/run_exe.h"
#include "tests/report/sample_reports.h"

namespace vramscope {
namespace {

using ::vramscope::testing::CheckCell;
using ::vramscope::testing::DomCell;
using ::vramscope::testing::ExeResult;
using ::vramscope::testing::ExpectedPaths;
using ::vramscope::testing::FindCells;
using ::vramscope::testing::kHostileName;
using ::vramscope::testing::SampleReport;
using ::vramscope::testing::TempDir;
using ::vramscope::testing::WriteFile;

// $CHROMIUM, else `chromium` on PATH.
std::string FindChromium() {
  if (const char* set = getenv("CHROMIUM"); set != nullptr && *set != '\0') return set;
  const char* path = getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    const std::size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string candidate = dirs.substr(start, end - start) + "/chromium";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

std::vector<std::string> Elements(const std::string& dom, const std::string& open) {
  std::vector<std::string> found;
  for (std::size_t at = dom.find(open); at != std::string::npos; at = dom.find(open, at + 1)) {
    found.push_back(dom.substr(at, dom.find('>', at) - at + 1));
  }
  return found;
}

class ReportChromiumTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* exe = getenv("VRAMSCOPE_EXE");
    exe_ = exe != nullptr ? exe : "";
    ASSERT_FALSE(exe_.empty()) << "VRAMSCOPE_EXE is not set (meson sets it)";
    chromium_ = FindChromium();
    ASSERT_FALSE(chromium_.empty())
        << "Debian's chromium is not installed (scripts/install-deps.sh installs it; or set "
           "$CHROMIUM): the HTML report cannot be checked in a browser";
  }

  // Writes the reports as JSON, has `vramscope report` make the page, and returns Chromium's
  // DOM after the page's script ran.
  std::string RenderedDom(const std::vector<v1::Report>& reports) {
    const std::string json = dir_.path() + "/report.json";
    const std::string html = dir_.path() + "/report.html";
    WriteFile(json, cli::FormatReportsJson(reports));
    const ExeResult made =
        testing::RunExe({exe_, "report", json, "--format=html", "-o", html}, dir_.path());
    EXPECT_EQ(made.code, 0) << made.err;
    page_ = testing::ReadFile(html);
    // As root Chromium needs --no-sandbox; a profile of its own keeps runs apart.
    const ExeResult dump = testing::RunExe(
        {"timeout", "120", chromium_, "--headless", "--no-sandbox", "--disable-gpu",
         "--user-data-dir=" + dir_.path() + "/profile", "--dump-dom", "file://" + html},
        dir_.path());
    EXPECT_EQ(dump.code, 0) << dump.err;
    return dump.out;
  }

  std::string exe_;
  std::string chromium_;
  std::string page_;
  TempDir dir_;
};

TEST_F(ReportChromiumTest, PlotsAreDrawnAndEveryTableFigureEqualsTheJson) {
  const std::vector<v1::Report> reports = {SampleReport()};
  // What the page was made from, read back the way `vramscope report` reads it.
  absl::StatusOr<std::vector<v1::Report>> json =
      cli::ParseReportsJson(cli::FormatReportsJson(reports), "report.json");
  ASSERT_TRUE(json.ok()) << json.status();
  const std::string dom = RenderedDom(reports);
  ASSERT_NE(dom.find("</html>"), std::string::npos) << dom.substr(0, 2000);

  // Plots: drawn by the script, one per device.
  const std::vector<std::string> svgs = Elements(dom, "<svg class=\"plot\"");
  ASSERT_EQ(svgs.size(), 2u);
  for (int d = 0; d < 2; ++d) {
    const std::string id = absl::StrCat("id=\"plot-0-", d, "\"");
    EXPECT_NE(svgs[d].find(id), std::string::npos) << svgs[d];
    EXPECT_NE(svgs[d].find("data-rendered=\"true\""), std::string::npos) << svgs[d];
    const std::size_t begin = dom.find(id);
    const std::string svg = dom.substr(begin, dom.find("</svg>", begin) - begin);
    const v1::DeviceReport& device = (*json)[0].devices(d);
    for (const char* series : {"requested_bytes", "allocated_bytes", "reserved_bytes"}) {
      const std::vector<std::string> paths =
          Elements(svg, absl::StrCat("<path class=\"series ", series, "\""));
      ASSERT_EQ(paths.size(), 1u) << series;
      const std::string& path = paths[0];
      const std::size_t d_at = path.find(" d=\"");
      ASSERT_NE(d_at, std::string::npos) << path;
      const std::string commands = path.substr(d_at + 4, path.find('"', d_at + 4) - d_at - 4);
      int points = 0;
      for (char c : commands) points += c == 'M' || c == 'V';
      EXPECT_EQ(points, device.timeline_size()) << series << ": " << commands;
      EXPECT_EQ(commands.find("NaN"), std::string::npos) << commands;
    }
    EXPECT_EQ(static_cast<int>(Elements(svg, "<rect class=\"nvtx-range\"").size()),
              device.nvtx_instances_size());
  }

  // Tables: every figure, exactly as in the JSON; none lost in parsing.
  const std::vector<DomCell> rendered = FindCells(dom);
  EXPECT_EQ(rendered.size(), FindCells(page_).size());
  std::set<std::string> seen;
  for (const DomCell& cell : rendered) {
    const absl::Status s = CheckCell(*json, cell);
    EXPECT_TRUE(s.ok()) << s;
    seen.insert(cell.path);
  }
  for (const std::string& path : ExpectedPaths(*json)) {
    EXPECT_TRUE(seen.count(path)) << "not in the rendered page: " << path;
  }

  // The hostile name is text, in the table and in the plot's tooltips; it ran nothing.
  EXPECT_EQ(dom.find("<img"), std::string::npos);
  EXPECT_NE(dom.find("<title>vramscope report: pid 4242 python</title>"), std::string::npos);
  const std::string hostile_label =
      absl::StrCat("evil\"domain:", kHostileName);  // as the tooltip shows it
  std::size_t hostile_titles = 0;
  for (std::size_t at = dom.find("<title>"); at != std::string::npos;
       at = dom.find("<title>", at + 1)) {
    const std::string text =
        testing::HtmlDecode(dom.substr(at + 7, dom.find("</title>", at) - at - 7));
    if (text.rfind(hostile_label, 0) == 0) ++hostile_titles;
  }
  EXPECT_EQ(hostile_titles, 4u);  // two instances on each of the two devices
}

}  // namespace
}  // namespace vramscope
