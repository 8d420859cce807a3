// The HTML page of `vramscope report` rendered by headless Chromium (Debian's `chromium`, which
// scripts/install-deps.sh installs): its script ran and drew one plot per device (one path per
// series with one point per timeline point, one shaded rect per NVTX range instance), every
// figure in the rendered tables equals the JSON report's, and a hostile NVTX name stayed text.
// Chromium missing is a failure, not a skip: CI installs it.
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/report_file.h"
#include "common/report_text.h"
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
  // DOM after the page's script ran, the page opened with `fragment` (e.g. "#hover=..."). What
  // the page wrote to the console (errors, refused fetches) is in console_.
  std::string RenderedDom(const std::vector<v1::Report>& reports,
                          const std::string& fragment = "") {
    const std::string json = dir_.path() + "/report.json";
    const std::string html = dir_.path() + "/report.html";
    WriteFile(json, cli::FormatReportsJson(reports));
    const ExeResult made =
        testing::RunExe({exe_, "report", json, "--format=html", "-o", html}, dir_.path());
    EXPECT_EQ(made.code, 0) << made.err;
    page_ = testing::ReadFile(html);
    // As root Chromium needs --no-sandbox; a profile of its own keeps runs apart.
    const ExeResult dump =
        testing::RunExe({"timeout", "120", chromium_, "--headless", "--no-sandbox", "--disable-gpu",
                         "--user-data-dir=" + dir_.path() + "/profile", "--enable-logging=stderr",
                         "--v=0", "--dump-dom", "file://" + html + fragment},
                        dir_.path());
    EXPECT_EQ(dump.code, 0) << dump.err;
    console_.clear();
    for (absl::string_view line : absl::StrSplit(dump.err, '\n')) {
      if (absl::StrContains(line, ":CONSOLE")) absl::StrAppend(&console_, line, "\n");
    }
    return dump.out;
  }

  std::string exe_;
  std::string chromium_;
  std::string page_;
  std::string console_;
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

// The text of the element with id `id` (its child divs or list items, one line each).
std::vector<std::string> Lines(const std::string& dom, const std::string& id,
                               const std::string& item) {
  std::vector<std::string> lines;
  const std::size_t at = dom.find("id=\"" + id + "\"");
  if (at == std::string::npos) return lines;
  const std::size_t end = dom.find("</div></div>", at) != std::string::npos && item == "div"
                              ? dom.find("</div></div>", at)
                              : dom.find("</ol>", at);
  const std::string open = "<" + item + ">", close = "</" + item + ">";
  for (std::size_t p = dom.find(open, at); p != std::string::npos && p < end;
       p = dom.find(open, p + 1)) {
    const std::size_t q = dom.find(close, p);
    lines.push_back(testing::HtmlDecode(dom.substr(p + open.size(), q - p - open.size())));
  }
  return lines;
}

TEST_F(ReportChromiumTest, OneBandPerAllocationAndTheHoverTextIsRight) {
  const std::vector<v1::Report> reports = {SampleReport()};
  const std::string dom = RenderedDom(reports, "#hover=alloc-0-0:1");
  EXPECT_EQ(console_, "") << "the page logged to the console";
  EXPECT_EQ(dom.find("class=\"script-error\""), std::string::npos) << dom;
  EXPECT_NE(dom.find("<body data-rendered=\"true\""), std::string::npos);
  EXPECT_EQ(dom.find("<img"), std::string::npos);
  for (int d = 0; d < 2; ++d) {
    const std::string id = absl::StrCat("id=\"alloc-0-", d, "\"");
    const std::size_t begin = dom.find(id);
    ASSERT_NE(begin, std::string::npos) << id;
    const std::string svg = dom.substr(begin, dom.find("</svg>", begin) - begin);
    EXPECT_NE(svg.find("data-rendered=\"true\""), std::string::npos);
    const std::vector<std::string> bands = Elements(svg, "<path class=\"alloc-band");
    ASSERT_EQ(static_cast<int>(bands.size()), reports[0].devices(d).allocations_size());
    for (std::size_t i = 0; i < bands.size(); ++i) {
      EXPECT_NE(bands[i].find(absl::StrCat("data-index=\"", i, "\"")), std::string::npos);
      EXPECT_NE(bands[i].find(" d=\"M"), std::string::npos) << bands[i];
      EXPECT_EQ(bands[i].find("NaN"), std::string::npos) << bands[i];
    }
  }
  // Band 1 of device 0: 1000000 bytes requested from site 0xabc (libc10_cuda.so), in the
  // hostile range, from 2.5 to 2.9 ms (the plot starts at 1 ms).
  EXPECT_NE(dom.find("data-band=\"alloc-0-0:1\""), std::string::npos);
  const std::vector<std::string> tip = Lines(dom, "vramscope-tooltip", "div");
  const std::vector<std::string> want = {
      "0x7f0000100000: 976.56 KiB requested, 1.00 MiB allocated, pooled",
      "site: libc10_cuda.so+0x2200 (libc10_cuda.so)",
      absl::StrCat("NVTX range: evil\"domain:", kHostileName),
      "allocated at +1.500 ms, freed at +1.900 ms, age 400.000 us",
      "not live at the peak",
  };
  EXPECT_EQ(tip, want);
}

// A free moves the bands above it down, also after an allocation freed at its own time (a free
// sorted before its allocation must not take another band off the stack).
TEST_F(ReportChromiumTest, AFreeMovesTheBandsAboveItDown) {
  v1::Report report;
  report.mutable_process()->set_pid(7);
  v1::DeviceReport* device = report.add_devices();
  auto add = [&](std::uint64_t bytes, std::uint64_t alloc_ms, std::uint64_t free_ms) {
    v1::AllocationRecord* a = device->add_allocations();
    a->set_address(0x1000 * (device->allocations_size()));
    a->set_requested_bytes(bytes);
    a->set_allocated_bytes(bytes);
    a->set_kind(v1::ALLOCATION_KIND_POOLED);
    a->set_alloc_time_ns(alloc_ms * 1'000'000);
    a->set_free_time_ns(free_ms * 1'000'000);
  };
  add(100 << 20, 1, 4);  // C: freed at 4 ms, under D
  add(10 << 20, 2, 2);   // A: freed at once
  add(50 << 20, 3, 0);   // D: moves down at 4 ms
  for (int i = 0; i < 6; ++i) {
    v1::TimelinePoint* point = device->add_timeline();
    point->set_time_ns((i + 1) * 1'000'000);
  }
  const std::string dom = RenderedDom({report});
  EXPECT_EQ(console_, "");
  const std::vector<std::string> bands = Elements(dom, "<path class=\"alloc-band\"");
  ASSERT_EQ(bands.size(), 3u);
  auto moves = [](const std::string& band) { return std::count(band.begin(), band.end(), 'V'); };
  EXPECT_EQ(moves(bands[0]), 1) << bands[0];  // one rectangle
  EXPECT_EQ(moves(bands[2]), 3) << bands[2];  // a step down at 4 ms
}

TEST_F(ReportChromiumTest, ClickShowsTheStack) {
  const std::string dom = RenderedDom({SampleReport()}, "#click=alloc-0-0:0");
  EXPECT_EQ(console_, "");
  const std::vector<std::string> frames = Lines(dom, "stack-alloc-0-0", "li");
  const std::vector<std::string> want = {"train_step (model.py:42) <lambda>", "main & co"};
  EXPECT_EQ(frames, want);
  EXPECT_NE(dom.find("Stack of 0x7f0000000000 (1.00 MiB, site 0xdeadbeefcafe, python3.12)"),
            std::string::npos);
}

// #window=T0:T1 (seconds) shows that window on every plot, and other directives after '&' still
// apply: every time-axis tick of the first device's plots lies inside the window.
TEST_F(ReportChromiumTest, WindowZoomsEveryPlot) {
  const std::string dom = RenderedDom({SampleReport()}, "#window=0.001:0.002&click=alloc-0-0:0");
  EXPECT_EQ(console_, "");
  for (const std::string id : {"plot-0-0", "alloc-0-0"}) {
    const std::size_t at = dom.find("id=\"" + id + "\"");
    ASSERT_NE(at, std::string::npos) << id;
    const std::string tag = dom.substr(at, dom.find('>', at) - at);
    EXPECT_NE(tag.find("data-zoom="), std::string::npos) << tag;
    EXPECT_EQ(tag.find("data-zoom=\"1.000\""), std::string::npos) << tag;
    const std::size_t end = dom.find("</svg>", at);
    const std::string svg = dom.substr(at, end - at);
    int ticks = 0;
    for (std::size_t tick = svg.find("<g class=\"tick\""); tick != std::string::npos;
         tick = svg.find("<g class=\"tick\"", tick + 1)) {
      const std::size_t text = svg.find("<text", tick);
      const std::size_t open = svg.find('>', text) + 1;
      if (svg.compare(open, 1, "+") != 0) continue;  // a byte tick (the y axis)
      double value = 0;
      const std::string head = svg.substr(tick, svg.find('>', tick) - tick);
      ASSERT_TRUE(absl::SimpleAtod(testing::Attribute(head, "data-value"), &value)) << head;
      EXPECT_GE(value, 1e6 - 1) << id;
      EXPECT_LE(value, 2e6 + 1) << id;
      ++ticks;
    }
    EXPECT_GE(ticks, 3) << id;
  }
  EXPECT_NE(dom.find("Stack of 0x7f0000000000"), std::string::npos);
}

// Every axis tick of the byte axes is a round value of one unit: a multiple of a step of 1, 2
// or 5 x 10^k of it, and the label says that value; double-click zooms the time axis 2x.
TEST_F(ReportChromiumTest, RoundTicksAndZoom) {
  const std::string dom = RenderedDom({SampleReport()}, "#zoom=plot-0-0");
  EXPECT_EQ(console_, "");
  EXPECT_NE(dom.find("id=\"plot-0-0\""), std::string::npos);
  const std::size_t plot = dom.find("id=\"plot-0-0\"");
  EXPECT_NE(dom.substr(plot, dom.find('>', plot) - plot).find("data-zoom=\"2.000\""),
            std::string::npos);
  const std::map<std::string, double> units = {
      {"B", 1}, {"KiB", 1024}, {"MiB", 1048576}, {"GiB", 1073741824}};
  int checked = 0;
  for (const std::string& tick : Elements(dom, "<g class=\"tick\"")) {
    const std::size_t at = dom.find(tick);
    const std::size_t text = dom.find("<text", at);
    const std::size_t open = dom.find('>', text) + 1;
    const std::string label = dom.substr(open, dom.find("</text>", open) - open);
    double value = 0;
    ASSERT_TRUE(absl::SimpleAtod(testing::Attribute(tick, "data-value"), &value)) << tick;
    if (label.rfind("+", 0) == 0) continue;  // the time axis
    const std::vector<std::string> parts = absl::StrSplit(label, ' ');
    ASSERT_EQ(parts.size(), 2u) << label;
    ASSERT_TRUE(units.count(parts[1])) << label;
    double shown = 0;
    ASSERT_TRUE(absl::SimpleAtod(parts[0], &shown)) << label;
    const double scaled = value / units.at(parts[1]);
    EXPECT_NEAR(shown, scaled, 1e-9 * std::max(1.0, scaled)) << label;
    // Round: at most two significant digits after the leading one (0.5, 1.5, 2, 2.5, 10, 15).
    const double mantissa = scaled / std::pow(10, std::floor(std::log10(std::max(scaled, 1e-9))));
    EXPECT_NEAR(mantissa * 2, std::round(mantissa * 2), 1e-9) << label;
    ++checked;
  }
  EXPECT_GE(checked, 8);  // 2 plots per device, 2 devices, several ticks each
}

}  // namespace
}  // namespace vramscope
