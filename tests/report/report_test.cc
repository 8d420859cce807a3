// `vramscope report`'s forms from crafted reports (text, JSON, the HTML page: every figure
// findable and equal to the report, escaping of hostile names, the script's data), and the stats
// engine's NVTX range instances that the page shades.
#include <absl/strings/numbers.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "common/report_file.h"
#include "common/report_text.h"
#include "common/size.h"
#include "report/report_html.h"
#include "stats/stats_engine.h"
#include "tests/report/dom_check.h"
#include "tests/report/sample_reports.h"

namespace vramscope::cli {
namespace {

using ::vramscope::testing::CheckCell;
using ::vramscope::testing::DomCell;
using ::vramscope::testing::ExpectedPaths;
using ::vramscope::testing::FindCells;
using ::vramscope::testing::kHostileName;
using ::vramscope::testing::SampleReport;

std::size_t Count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

TEST(ReportHtmlTest, EveryFigureIsFindableAndEqualsTheReport) {
  const std::vector<v1::Report> reports = {SampleReport(), SampleReport()};
  const std::string html = FormatReportsHtml(reports);
  const std::vector<DomCell> cells = FindCells(html);
  std::set<std::string> seen;
  for (const DomCell& cell : cells) {
    EXPECT_TRUE(CheckCell(reports, cell).ok()) << CheckCell(reports, cell);
    EXPECT_TRUE(seen.insert(cell.path).second) << "shown twice: " << cell.path;
  }
  const std::set<std::string> expected = ExpectedPaths(reports);
  for (const std::string& path : expected) EXPECT_TRUE(seen.count(path)) << "missing: " << path;
  for (const std::string& path : seen) EXPECT_TRUE(expected.count(path)) << "unexpected: " << path;
  EXPECT_EQ(seen.size(), expected.size());
  EXPECT_GT(expected.size(), 300u);
}

TEST(ReportHtmlTest, ShownFormsMatchTheExactValues) {
  const std::vector<v1::Report> reports = {SampleReport()};
  for (const DomCell& cell : FindCells(FormatReportsHtml(reports))) {
    if (cell.unit == "count") {
      EXPECT_EQ(cell.text, cell.value) << cell.path;
    }
    if (cell.unit == "bytes" && cell.field != "net_growth_bytes") {
      std::uint64_t bytes = 0;
      ASSERT_TRUE(absl::SimpleAtoi(cell.value, &bytes)) << cell.path;
      EXPECT_EQ(cell.text, FormatBytes(bytes)) << cell.path;
    }
  }
  const std::string html = FormatReportsHtml(reports);
  EXPECT_NE(html.find("data-value=\"-4096\" title=\"-4096 bytes\">-4.00 KiB<"), std::string::npos);
  EXPECT_NE(html.find(">0xdeadbeefcafe<"), std::string::npos);
  EXPECT_NE(html.find(">OOM_VERDICT_CAPACITY<"), std::string::npos);
  EXPECT_NE(html.find(">2.500 ms<"), std::string::npos);  // total_time_ns 2500000
}

TEST(ReportHtmlTest, HostileNamesAreEscapedEverywhere) {
  const std::string html = FormatReportsHtml({SampleReport()});
  // Only our own four script elements open and close (error display, d3, data, plots).
  EXPECT_EQ(Count(html, "<script"), 4u);
  EXPECT_EQ(Count(html, "</script>"), 4u);
  EXPECT_EQ(Count(html, "<img"), 0u);
  EXPECT_EQ(Count(html, "<b>"), 0u);
  EXPECT_EQ(Count(html, "<!--"), 0u);
  EXPECT_NE(html.find("&lt;/script&gt;&lt;img src=x onerror=&quot;document.title=&#39;pwned&#39;"
                      "&quot;&gt;&amp;amp;&lt;!--&#39;&quot;"),
            std::string::npos);
  // In the script's JSON the label is domain:name with <, > and & as \u escapes.
  EXPECT_NE(html.find("\"label\":\"evil\\\"domain:\\u003c/script\\u003e\\u003cimg src=x onerror="
                      "\\\"document.title='pwned'\\\"\\u003e\\u0026amp;\\u003c!--'\\\"\"}"),
            std::string::npos);
  bool found = false;
  for (const DomCell& cell : FindCells(html)) {
    if (cell.field == "name" && cell.path.find("nvtx_ranges.0.") != std::string::npos) {
      EXPECT_EQ(cell.text, kHostileName);
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

TEST(ReportHtmlTest, SelfContainedWithOnePlotPerDevice) {
  const std::string html = FormatReportsHtml({SampleReport()});
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("Content-Security-Policy\" content=\"default-src 'none'"), std::string::npos);
  for (const char* remote : {"http://", "https://", "//cdn", "src=\"", "<link"}) {
    // XML namespaces (SVG, and those d3 knows) are the only URLs, and they are never fetched.
    if (std::string(remote) == "http://") {
      EXPECT_EQ(Count(html, remote), Count(html, "http://www.w3.org/")) << remote;
    } else {
      EXPECT_EQ(Count(html, remote), 0u) << remote;
    }
  }
  EXPECT_EQ(Count(html, "<svg class=\"plot\""), 2u);
  EXPECT_NE(html.find("id=\"plot-0-0\" data-report=\"0\" data-device=\"0\" data-points=\"5\" "
                      "data-ranges=\"3\""),
            std::string::npos);
  EXPECT_NE(html.find("id=\"plot-0-1\" data-report=\"0\" data-device=\"1\" data-points=\"5\" "
                      "data-ranges=\"3\""),
            std::string::npos);
  // Plot data relative to the earliest time (the first timeline point, 1 ms).
  EXPECT_NE(html.find("{\"id\":\"plot-0-0\",\"points\":[[0,0,0,4194304],[1000000,524288,1048576,"
                      "4194304],"),
            std::string::npos);
  EXPECT_NE(html.find("\"ranges\":[{\"s\":500000,\"e\":7500000,\"d\":0,\"label\":\"forward\"}"),
            std::string::npos);
}

// The state at the peak: the allocations live then, largest first, with kinds and sites named
// as people say them; by site and by library; what was left out, said.
TEST(ReportHtmlTest, PeakStateListsTheLiveAllocationsLargestFirst) {
  const std::string html = FormatReportsHtml({SampleReport()});
  const std::size_t table = html.find("<table class=\"peak-allocations\">");
  ASSERT_NE(table, std::string::npos);
  const std::string rows = html.substr(table, html.find("</table>", table) - table);
  std::vector<std::string> addresses;
  for (const DomCell& cell : FindCells(rows)) {
    if (cell.field == "address" && cell.path.rfind("0.devices.0.", 0) == 0) {
      addresses.push_back(cell.text);
    }
  }
  const std::vector<std::string> want = {"0x7f0000200000", "0x7f0000000000", "0x7f0000500000"};
  EXPECT_EQ(addresses, want);
  EXPECT_NE(rows.find(">pooled<"), std::string::npos);
  EXPECT_NE(rows.find(">libc10_cuda.so+0x2200<"), std::string::npos);
  EXPECT_NE(rows.find(">not freed<"), std::string::npos);
  EXPECT_NE(html.find("1 smaller allocations live at the peak (256 B) are not listed"),
            std::string::npos);
  const std::size_t by_site = html.find("<table class=\"peak-by-site\">");
  ASSERT_NE(by_site, std::string::npos);
  const std::string sites = html.substr(by_site, html.find("</table>", by_site) - by_site);
  EXPECT_LT(sites.find("(no site recorded)"),
            sites.find("train_step (model.py:42) &lt;lambda&gt;"));
  EXPECT_LT(sites.find("train_step (model.py:42)"), sites.find("libc10_cuda.so+0x2200"));
  const std::size_t by_library = html.find("<table class=\"peak-by-library\">");
  ASSERT_NE(by_library, std::string::npos);
  const std::string libraries =
      html.substr(by_library, html.find("</table>", by_library) - by_library);
  EXPECT_LT(libraries.find(">python3.12<"), libraries.find(">libc10_cuda.so<"));
  EXPECT_NE(html.find("data-allocations=\"5\""), std::string::npos);
  EXPECT_NE(html.find("95 not listed"), std::string::npos);
}

// The leak table names kinds and sites; the exact enum and id stay in data-value.
TEST(ReportHtmlTest, LeaksShowKindAndSiteNames) {
  const std::string html = FormatReportsHtml({SampleReport()});
  const std::size_t table = html.find("<table class=\"leaks\">");
  ASSERT_NE(table, std::string::npos);
  const std::string leaks = html.substr(table, html.find("</table>", table) - table);
  EXPECT_EQ(leaks.find(">ALLOCATION_KIND_"), std::string::npos) << leaks;
  EXPECT_NE(leaks.find("data-value=\"ALLOCATION_KIND_POOLED\">pooled<"), std::string::npos);
  EXPECT_NE(leaks.find("data-value=\"ALLOCATION_KIND_MANAGED\">managed<"), std::string::npos);
  EXPECT_EQ(leaks.find(">0xdeadbeefcafe<"), std::string::npos) << leaks;
  EXPECT_NE(leaks.find(">train_step (model.py:42) &lt;lambda&gt;<"), std::string::npos) << leaks;
  EXPECT_NE(leaks.find(">(no site recorded)<"), std::string::npos) << leaks;
}

TEST(ReportHtmlTest, EmptyReportsStillMakeAPage) {
  v1::Report running;
  running.mutable_process()->set_pid(7);
  const std::string html = FormatReportsHtml({running});
  EXPECT_NE(html.find("no device memory was allocated"), std::string::npos);
  EXPECT_NE(html.find("id=\"vramscope-plot-data\">[]</script>"), std::string::npos);
  for (const DomCell& cell : FindCells(html)) {
    EXPECT_TRUE(CheckCell({running}, cell).ok()) << cell.path;
    EXPECT_NE(cell.field, "exit_code");  // still running: no exit code
  }
  EXPECT_NE(FormatReportsHtml({}).find("no processes"), std::string::npos);
}

TEST(ReportTextJsonTest, JsonRoundTripsAndTextIsTheRunSummary) {
  const std::vector<v1::Report> one = {SampleReport()};
  absl::StatusOr<std::vector<v1::Report>> parsed = ParseReportsJson(FormatReportsJson(one), "x");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 1u);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals((*parsed)[0], one[0]));
  const std::vector<v1::Report> two = {SampleReport(), SampleReport()};
  const std::string json = FormatReportsJson(two);
  EXPECT_EQ(json.rfind("{\"reports\": [", 0), 0u);
  parsed = ParseReportsJson(json, "x");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->size(), 2u);
  EXPECT_NE(FormatRunReport(one[0]).find("vramscope: pid 4242: python train.py"),
            std::string::npos);
}

// Memory waiting for the free fence is named on the fragmentation line when there is some: it
// is what makes reserved exceed allocated while the program runs ahead of the GPU.
TEST(ReportTextJsonTest, TextNamesMemoryWaitingForTheFence) {
  v1::Report report = SampleReport();
  EXPECT_EQ(FormatRunReport(report).find("waiting for the fence"), std::string::npos);
  report.mutable_devices(0)->mutable_fragmentation_at_peak()->set_pending_fence_bytes(2048);
  const std::string text = FormatRunReport(report);
  EXPECT_NE(text.find("fragmentation at peak: external 33.3%, free 2.93 KiB (2.00 KiB waiting for "
                      "the fence), largest free 1.95 KiB"),
            std::string::npos)
      << text;
  // The JSON carries the field under its proto name.
  EXPECT_NE(FormatReportsJson({report}).find("\"pending_fence_bytes\": \"2048\""),
            std::string::npos);
}

TEST(ReportTextJsonTest, TextListsCallingLibrariesLargestFirst) {
  v1::Report report = SampleReport();
  const std::string text = FormatRunReport(report);
  const std::string block =
      "    peak requested by calling library (each its own peak):\n"
      "      128 MiB    libcublas.so.13\n"
      "      1.91 MiB   libc10_cuda.so\n"
      "      512 B      (unresolved)\n"
      "      4.00 KiB   without a recorded site\n";
  EXPECT_NE(text.find(block), std::string::npos) << text;

  // Past eight libraries (nine are all shown) the rest is one line.
  v1::DeviceReport& d = *report.mutable_devices(0);
  d.clear_peak_requested_bytes_by_library();
  d.set_unattributed_peak_requested_bytes(0);
  for (int i = 0; i < 9; ++i) {
    (*d.mutable_peak_requested_bytes_by_library())[absl::StrCat("lib", i, ".so")] = 1024 * (i + 1);
  }
  std::string nine = FormatRunReport(report);
  EXPECT_NE(nine.find("      1.00 KiB   lib0.so\n"), std::string::npos) << nine;
  EXPECT_EQ(nine.find("more libraries"), std::string::npos) << nine;
  EXPECT_EQ(nine.find("without a recorded site"), nine.rfind("without a recorded site")) << nine;
  (*d.mutable_peak_requested_bytes_by_library())["lib9.so"] = 512;
  const std::string ten = FormatRunReport(report);
  EXPECT_NE(ten.find("      9.00 KiB   lib8.so\n      8.00 KiB   lib7.so\n"), std::string::npos)
      << ten;
  EXPECT_NE(ten.find("      2.00 KiB   lib1.so\n"
                     "      ... and 2 more libraries, each at most 1.00 KiB (--json for all)\n"),
            std::string::npos)
      << ten;
  EXPECT_EQ(ten.find("lib0.so"), std::string::npos);

  // No sites recorded: no block.
  d.clear_peak_requested_bytes_by_library();
  report.mutable_devices(1)->clear_peak_requested_bytes_by_library();
  EXPECT_EQ(FormatRunReport(report).find("calling library"), std::string::npos);
}

// Every cut list says how many more there are and where to see them all: NVTX ranges, sites and
// leaks past five, OOMs past the first; a list of exactly five says nothing.
TEST(ReportTextJsonTest, NoListIsCutSilently) {
  v1::Report report;
  report.mutable_process()->set_pid(7);
  v1::DeviceReport& d = *report.add_devices();
  for (int i = 0; i < 8; ++i) {
    v1::NvtxRangeStats* r = d.add_nvtx_ranges();
    r->set_name(absl::StrCat("range", i));
    r->set_peak_allocated_bytes(1000 - i);
    v1::SiteStats* s = d.add_top_sites();
    s->set_site(i + 1);
    s->set_peak_live_bytes(1000 - i);
    v1::Leak* leak = d.add_leaks();
    leak->set_address(0x1000 * (i + 1));
    leak->set_requested_bytes(100);
    d.add_ooms()->set_requested_bytes(1 << 20);
  }
  d.mutable_top_sites()->DeleteSubrange(6, 2);  // six sites: one more
  const std::string text = FormatRunReport(report);
  EXPECT_NE(text.find("range4 "), std::string::npos) << text;
  EXPECT_EQ(text.find("range5 "), std::string::npos) << text;
  EXPECT_NE(text.find("      ... and 3 more NVTX ranges (--json for all)\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("      ... and 1 more allocation site (--json for all)\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find(" 0x5000 100 B ... and 3 more (--json for all)\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("      ... and 7 more (--json for all)\n"), std::string::npos) << text;
  EXPECT_NE(FormatRunReport(report, "--format json")
                .find("... and 3 more NVTX ranges (--format json for all)"),
            std::string::npos);

  // Five of each (one OOM): nothing was cut, nothing is said.
  d.mutable_nvtx_ranges()->DeleteSubrange(5, 3);
  d.mutable_top_sites()->DeleteSubrange(5, 1);
  d.mutable_leaks()->DeleteSubrange(5, 3);
  d.mutable_ooms()->DeleteSubrange(1, 7);
  EXPECT_EQ(FormatRunReport(report).find("more"), std::string::npos) << FormatRunReport(report);
}

// --- the stats engine's range instances ------------------------------------------------------

v1::Event Push(std::uint64_t t, std::uint32_t id, const std::string& name, std::uint32_t tid) {
  v1::Event e;
  e.set_time_ns(t);
  e.set_thread_id(tid);
  e.mutable_nvtx_push()->set_range_id(id);
  e.mutable_nvtx_push()->set_name(name);
  e.mutable_nvtx_push()->set_domain("d");
  return e;
}
v1::Event Pop(std::uint64_t t, std::uint32_t id, std::uint32_t tid) {
  v1::Event e;
  e.set_time_ns(t);
  e.set_thread_id(tid);
  e.mutable_nvtx_pop()->set_range_id(id);
  return e;
}
v1::Event Alloc(std::uint64_t t, std::uint32_t device, std::uint64_t address) {
  v1::Event e;
  e.set_time_ns(t);
  e.set_device(device);
  e.mutable_alloc()->set_address(address);
  e.mutable_alloc()->set_requested_bytes(1000);
  e.mutable_alloc()->set_allocated_bytes(1024);
  e.mutable_alloc()->set_kind(v1::ALLOCATION_KIND_POOLED);
  return e;
}

TEST(StatsNvtxInstancesTest, StartEndDepthAndOpenRangesEndAtTheLastEvent) {
  collector::ProcessStatsEngine engine;
  engine.Add(Alloc(100, 0, 0x1000));
  engine.Add(Push(200, 1, "outer", 9));
  engine.Add(Push(300, 2, "inner", 9));
  engine.Add(Alloc(350, 0, 0x2000));
  engine.Add(Pop(400, 2, 9));
  engine.Add(Push(450, 3, "other-thread", 10));
  engine.Add(Pop(500, 1, 9));
  engine.Add(Push(600, 4, "open", 9));
  engine.Add(Alloc(700, 0, 0x3000));
  const v1::Report report = engine.Report();
  ASSERT_EQ(report.devices_size(), 1);
  const v1::DeviceReport& d = report.devices(0);
  ASSERT_EQ(d.nvtx_instances_size(), 4);
  EXPECT_EQ(d.nvtx_instances_dropped(), 0u);
  struct Want {
    const char* name;
    std::uint64_t start, end;
    std::uint32_t depth, thread;
  } want[] = {{"outer", 200, 500, 0, 9},
              {"inner", 300, 400, 1, 9},
              {"other-thread", 450, 700, 0, 10},
              {"open", 600, 700, 0, 9}};
  for (int i = 0; i < 4; ++i) {
    const v1::NvtxRangeInstance& got = d.nvtx_instances(i);
    EXPECT_EQ(got.name(), want[i].name) << i;
    EXPECT_EQ(got.domain(), "d") << i;
    EXPECT_EQ(got.start_ns(), want[i].start) << i;
    EXPECT_EQ(got.end_ns(), want[i].end) << i;
    EXPECT_EQ(got.depth(), want[i].depth) << i;
    EXPECT_EQ(got.thread_id(), want[i].thread) << i;
  }
  // The totals are unchanged by the instances: inner and outer counted once each.
  for (const v1::NvtxRangeStats& range : d.nvtx_ranges()) EXPECT_EQ(range.count(), 1u);
}

TEST(StatsNvtxInstancesTest, BoundedPerProcessAndOnlyOnDevicesSeenBeforeTheClose) {
  collector::StatsOptions options;
  options.max_nvtx_instances = 3;
  collector::ProcessStatsEngine engine(options);
  engine.Add(Alloc(10, 0, 0x1000));
  for (std::uint32_t i = 0; i < 5; ++i) {
    engine.Add(Push(100 + 10 * i, i + 1, "step", 1));
    engine.Add(Pop(105 + 10 * i, i + 1, 1));
  }
  engine.Add(Alloc(200, 1, 0x2000));  // device 1 appears after every range closed
  engine.Add(Push(300, 99, "late", 1));
  engine.Add(Pop(310, 99, 1));
  const v1::Report report = engine.Report();
  ASSERT_EQ(report.devices_size(), 2);
  const v1::DeviceReport& d0 = report.devices(0);
  const v1::DeviceReport& d1 = report.devices(1);
  ASSERT_EQ(d0.nvtx_instances_size(), 3);
  EXPECT_EQ(d0.nvtx_instances(0).start_ns(), 100u);
  EXPECT_EQ(d0.nvtx_instances(2).end_ns(), 125u);
  EXPECT_EQ(d0.nvtx_instances_dropped(), 3u);  // 2 more steps and "late"
  EXPECT_EQ(d1.nvtx_instances_size(), 0);      // the kept ones closed before it was seen
  EXPECT_EQ(d1.nvtx_instances_dropped(), 3u);
}

}  // namespace
}  // namespace vramscope::cli
