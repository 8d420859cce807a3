// TopModel without a terminal: rows per process and device, sorting, filtering, a selection that
// follows its row, rates, the graph's history, details of the selected process, and the exact
// text of table and plain lines.
#include "top/top_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace vramscope::cli::top {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr std::uint64_t kMiB = 1 << 20;
constexpr std::uint64_t kSecond = 1000000000;

struct DeviceFigures {
  std::uint32_t ordinal;
  std::uint64_t allocated;
  std::uint64_t reserved;
  std::uint64_t alloc_count = 0;
  double fragmentation = 0;
  int ooms = 0;
};

void AddProcess(v1::StatsUpdate& update, std::uint32_t pid, const std::string& command,
                const std::vector<DeviceFigures>& devices) {
  v1::ProcessStats* stats = update.add_processes();
  stats->mutable_process()->set_host("node1");
  stats->mutable_process()->set_pid(pid);
  stats->mutable_process()->set_start_time_ns(pid);
  stats->add_command_line(command);
  for (const DeviceFigures& figures : devices) {
    v1::DeviceReport* device = stats->add_devices();
    device->mutable_device()->set_ordinal(figures.ordinal);
    device->set_current_allocated_bytes(figures.allocated);
    device->set_peak_allocated_bytes(figures.allocated * 2);
    device->set_current_reserved_bytes(figures.reserved);
    device->set_peak_reserved_bytes(figures.reserved * 2);
    device->set_alloc_count(figures.alloc_count);
    device->set_allocs_per_second(7.5);
    device->mutable_fragmentation()->set_external_fragmentation(figures.fragmentation);
    for (int i = 0; i < figures.ooms; ++i) device->add_ooms();
  }
}

// Two processes, three rows: 100/cuda:0 (reserved 300 MiB), 100/cuda:1 (100 MiB), 200/cuda:0
// (200 MiB).
v1::StatsUpdate TwoProcesses(std::uint64_t time_ns, std::uint64_t count = 10) {
  v1::StatsUpdate update;
  update.set_time_ns(time_ns);
  AddProcess(update, 100, "python train.py",
             {{0, 250 * kMiB, 300 * kMiB, count, 0.25, 1}, {1, 50 * kMiB, 100 * kMiB, 0}});
  AddProcess(update, 200, "./bench", {{0, 150 * kMiB, 200 * kMiB, 0}});
  return update;
}

std::vector<std::string> Keys(const TopModel& model) {
  std::vector<std::string> keys;
  for (const Row& row : model.rows()) {
    keys.push_back(std::to_string(row.process.pid()) + ":" + std::to_string(row.device));
  }
  return keys;
}

TEST(TopModelTest, OneRowPerProcessAndDeviceSortedByReserved) {
  TopModel model;
  EXPECT_FALSE(model.has_data());
  model.Update(TwoProcesses(kSecond));
  EXPECT_TRUE(model.has_data());
  EXPECT_EQ(model.processes(), 2u);
  EXPECT_THAT(Keys(model), ElementsAre("100:0", "200:0", "100:1"));
  const Row& row = model.rows()[0];
  EXPECT_EQ(row.command, "python train.py");
  EXPECT_EQ(row.allocated, 250 * kMiB);
  EXPECT_EQ(row.peak_allocated, 500 * kMiB);
  EXPECT_EQ(row.reserved, 300 * kMiB);
  EXPECT_EQ(row.peak_reserved, 600 * kMiB);
  EXPECT_DOUBLE_EQ(row.fragmentation, 0.25);
  EXPECT_EQ(row.ooms, 1u);
  // The first snapshot has no previous counts: the report's average rate.
  EXPECT_DOUBLE_EQ(row.alloc_rate, 7.5);
}

TEST(TopModelTest, SortCyclesThroughColumnsAndReverses) {
  TopModel model;
  model.Update(TwoProcesses(kSecond));
  model.SetSort(SortColumn::kAllocated);
  EXPECT_THAT(Keys(model), ElementsAre("100:0", "200:0", "100:1"));
  model.ReverseSort();
  EXPECT_FALSE(model.descending());
  EXPECT_THAT(Keys(model), ElementsAre("100:1", "200:0", "100:0"));
  model.SetSort(SortColumn::kPid);  // names and pids ascend by default
  EXPECT_TRUE(!model.descending());
  EXPECT_THAT(Keys(model), ElementsAre("100:0", "100:1", "200:0"));
  model.SetSort(SortColumn::kCommand);
  EXPECT_THAT(Keys(model), ElementsAre("200:0", "100:0", "100:1"));
  // Cycling visits every column and comes back.
  std::vector<std::string> seen;
  for (int i = 0; i < kSortColumns; ++i) {
    model.CycleSort();
    seen.emplace_back(SortColumnName(model.sort()));
  }
  EXPECT_EQ(model.sort(), SortColumn::kCommand);
  EXPECT_THAT(seen, ElementsAre("reserved", "peak reserved", "allocated", "peak allocated",
                                "fragmentation", "alloc rate", "OOMs", "pid", "command"));
}

TEST(TopModelTest, FilterMatchesCommandOrPid) {
  TopModel model;
  model.Update(TwoProcesses(kSecond));
  model.SetFilter("bench");
  EXPECT_THAT(Keys(model), ElementsAre("200:0"));
  model.SetFilter("100");
  EXPECT_THAT(Keys(model), ElementsAre("100:0", "100:1"));
  model.SetFilter("nothing like it");
  EXPECT_TRUE(model.rows().empty());
  EXPECT_EQ(model.selected(), nullptr);
  EXPECT_EQ(model.total_rows(), 3u);
  model.SetFilter("");
  EXPECT_EQ(model.rows().size(), 3u);
}

TEST(TopModelTest, SelectionFollowsItsRowAndClamps) {
  TopModel model;
  model.Update(TwoProcesses(kSecond));
  ASSERT_NE(model.selected(), nullptr);
  EXPECT_EQ(model.selected()->key, "node1/100/100/0");
  model.MoveSelection(1);
  EXPECT_EQ(model.selected()->key, "node1/200/200/0");
  EXPECT_EQ(model.SelectedProcessKey(), "node1/200/200");
  // Re-sorting moves the row; the selection goes with it.
  model.SetSort(SortColumn::kPid);
  EXPECT_EQ(model.selected()->key, "node1/200/200/0");
  EXPECT_EQ(model.selected_index(), 2u);
  model.MoveSelection(5);
  EXPECT_EQ(model.selected_index(), 2u);
  model.MoveSelection(-9);
  EXPECT_EQ(model.selected_index(), 0u);
  model.SelectLast();
  EXPECT_EQ(model.selected_index(), 2u);
  model.SelectFirst();
  EXPECT_EQ(model.selected_index(), 0u);
  // A filter hiding the selected row selects the first row shown.
  model.MoveSelection(1);
  model.SetFilter("bench");
  EXPECT_EQ(model.selected()->key, "node1/200/200/0");
  model.SetFilter("train");
  EXPECT_EQ(model.selected()->key, "node1/100/100/0");
}

TEST(TopModelTest, RatesComeFromCountsBetweenUpdates) {
  TopModel model;
  model.Update(TwoProcesses(10 * kSecond, 100));
  model.Update(TwoProcesses(12 * kSecond, 160));  // 60 allocations in 2 s
  EXPECT_DOUBLE_EQ(model.rows()[0].alloc_rate, 30.0);
  model.Update(TwoProcesses(13 * kSecond, 160));
  EXPECT_DOUBLE_EQ(model.rows()[0].alloc_rate, 0.0);
}

TEST(TopModelTest, ProcessesThatGoAwayLoseTheirRows) {
  TopModel model;
  model.Update(TwoProcesses(kSecond));
  model.MoveSelection(1);  // 200:0
  v1::StatsUpdate update;
  update.set_time_ns(2 * kSecond);
  AddProcess(update, 100, "python train.py", {{0, kMiB, 2 * kMiB}});
  model.Update(update);
  EXPECT_THAT(Keys(model), ElementsAre("100:0"));
  EXPECT_EQ(model.selected()->key, "node1/100/100/0");
}

TEST(TopModelTest, GraphPlacesSamplesInTimeAndCarriesThemForward) {
  TopModelOptions options;
  options.history_ns = 100 * kSecond;
  TopModel model(options);
  auto one = [](std::uint64_t time_ns, std::uint64_t reserved) {
    v1::StatsUpdate update;
    update.set_time_ns(time_ns);
    AddProcess(update, 1, "a", {{0, reserved / 2, reserved}});
    return update;
  };
  model.Update(one(1000 * kSecond, 10 * kMiB));
  model.Update(one(1050 * kSecond, 40 * kMiB));
  model.Update(one(1100 * kSecond, 20 * kMiB));
  // 10 columns of 10 s over (1000 s, 1100 s]: the sample at 1000 s is older than the window.
  const std::vector<GraphColumn> graph = model.Graph(10);
  ASSERT_EQ(graph.size(), 10u);
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(graph[i].has_data) << i;
  EXPECT_TRUE(graph[4].has_data);  // 1050 s ends column 4
  EXPECT_EQ(graph[4].reserved, 40 * kMiB);
  EXPECT_EQ(graph[4].allocated, 20 * kMiB);
  for (int i = 5; i < 9; ++i) EXPECT_EQ(graph[i].reserved, 40 * kMiB) << i;  // carried
  EXPECT_EQ(graph[9].reserved, 20 * kMiB);
  EXPECT_THAT(model.GraphTitle(), HasSubstr("pid 1 cuda:0"));
  EXPECT_THAT(model.GraphTitle(), HasSubstr("max 40.0M"));
}

TEST(TopModelTest, GraphOfTheTotalSumsRows) {
  TopModel model;
  model.Update(TwoProcesses(1000 * kSecond));
  model.ToggleGraphTotal();
  const std::vector<GraphColumn> graph = model.Graph(4);
  EXPECT_EQ(graph[3].reserved, 600 * kMiB);
  EXPECT_EQ(graph[3].allocated, 450 * kMiB);
  EXPECT_THAT(model.GraphTitle(), HasSubstr("total"));
}

TEST(TopModelTest, HistoryIsBoundedBySamplesAndAge) {
  TopModelOptions options;
  options.max_samples = 3;
  options.history_ns = 300 * kSecond;
  options.fit_window = false;
  TopModel model(options);
  for (int i = 1; i <= 10; ++i) model.Update(TwoProcesses(static_cast<std::uint64_t>(i) * kSecond));
  int with_data = 0;
  for (const GraphColumn& column : model.Graph(1000)) with_data += column.has_data ? 1 : 0;
  EXPECT_GT(with_data, 0);
  // Only the last 3 samples (8 s, 9 s, 10 s) remain: the graph starts at the 8 s one.
  const std::vector<GraphColumn> graph = model.Graph(300);
  int first = -1;
  for (int i = 0; i < 300; ++i) {
    if (graph[i].has_data) {
      first = i;
      break;
    }
  }
  EXPECT_EQ(first, 300 - 1 - 2);  // 300 columns over 5 min: 1 s each
}

TEST(TopModelTest, RangesFromTheUpdateSitesFromTheDetails) {
  TopModel model;
  v1::StatsUpdate update = TwoProcesses(kSecond);
  v1::NvtxRangeStats* small = update.mutable_processes(0)->mutable_devices(0)->add_nvtx_ranges();
  small->set_name("backward");
  small->set_peak_allocated_bytes(kMiB);
  v1::NvtxRangeStats* large = update.mutable_processes(0)->mutable_devices(0)->add_nvtx_ranges();
  large->set_name("forward");
  large->set_peak_allocated_bytes(9 * kMiB);
  model.Update(update);
  std::vector<v1::NvtxRangeStats> ranges = model.SelectedRanges();
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0].name(), "forward");
  EXPECT_TRUE(model.SelectedSites().empty());
  EXPECT_FALSE(model.has_details());

  v1::Report report;
  *report.mutable_process() = update.processes(0).process();
  v1::DeviceReport* device = report.add_devices();
  device->mutable_device()->set_ordinal(0);
  v1::SiteStats* site = device->add_top_sites();
  site->add_frames("step (train.py:42)");
  site->set_peak_live_bytes(5 * kMiB);
  model.SetDetails(report);
  ASSERT_EQ(model.SelectedSites().size(), 1u);
  EXPECT_EQ(model.SelectedSites()[0].frames(0), "step (train.py:42)");
  // Another process selected: its details are not these.
  model.MoveSelection(1);
  EXPECT_FALSE(model.has_details());
  EXPECT_TRUE(model.SelectedSites().empty());
}

TEST(TopModelTest, FormatsBytesAndFits) {
  EXPECT_EQ(ShortBytes(0), "0B");
  EXPECT_EQ(ShortBytes(999), "999B");
  EXPECT_EQ(ShortBytes(1000), "0.98K");
  EXPECT_EQ(ShortBytes(16 * kMiB), "16.0M");
  EXPECT_EQ(ShortBytes(450 * kMiB), "450M");
  EXPECT_EQ(ShortBytes(1536 * kMiB), "1.50G");
  EXPECT_EQ(ShortBytes(1023 * kMiB), "1.00G");
  EXPECT_EQ(ShortBytes(1000 * kMiB), "0.98G");
  EXPECT_EQ(Fit("abc", 5), "abc  ");
  EXPECT_EQ(Fit("abc", 5, true), "  abc");
  EXPECT_EQ(Fit("abcdef", 3), "abc");
}

TEST(TopModelTest, TableLinesHaveTheWidthAsked) {
  TopModel model;
  model.Update(TwoProcesses(kSecond));
  for (std::size_t width : {80u, 100u, 132u}) {
    EXPECT_EQ(model.HeaderLine(width).size(), width);
    EXPECT_EQ(model.RowLine(model.rows()[0], width).size(), width);
  }
  EXPECT_EQ(model.HeaderLine(80),
            "    PID DEV  ALLOC PK-ALL RESERV PK-RES  FRAG ALLOC/s  OOM COMMAND              ");
  const std::string line = model.RowLine(model.rows()[0], 80);
  EXPECT_EQ(
      line.rfind("    100   0   250M   500M   300M   600M   25%     7.5    1 python train.py", 0),
      0u)
      << line;
}

TEST(TopModelTest, PlainLinesAreKeyValue) {
  TopModel model;
  model.Update(TwoProcesses(kSecond));
  EXPECT_EQ(model.PlainLine(model.rows()[0]),
            "time_ns=1000000000 host=node1 pid=100 device=0 allocated=262144000 "
            "peak_allocated=524288000 reserved=314572800 peak_reserved=629145600 "
            "fragmentation=0.250 allocs_per_s=7.5 ooms=1 finished=0 killed=0 signal=0 cmd=python "
            "train.py");
}

TEST(TopModelTest, UpdateFromReportsKeepsEveryProcessAndDevice) {
  v1::Report report;
  report.mutable_process()->set_pid(5);
  report.add_command_line("./app");
  report.set_finished(true);
  report.add_devices()->mutable_device()->set_ordinal(1);
  const v1::StatsUpdate update = UpdateFromReports({report}, 42);
  EXPECT_EQ(update.time_ns(), 42u);
  ASSERT_EQ(update.processes_size(), 1);
  EXPECT_TRUE(update.processes(0).finished());
  TopModel model;
  model.Update(update);
  ASSERT_EQ(model.rows().size(), 1u);
  EXPECT_THAT(model.RowLine(model.rows()[0], 80), HasSubstr(" [exited] app "));
}

TEST(TopModelTest, TableLeavesTheProgramsDirectoryOutPlainLinesKeepIt) {
  v1::StatsUpdate update;
  update.set_time_ns(kSecond);
  AddProcess(update, 9, "/opt/venv/bin/python", {{0, kMiB, kMiB}});
  update.mutable_processes(0)->add_command_line("train.py");
  TopModel model;
  model.Update(update);
  EXPECT_THAT(model.RowLine(model.rows()[0], 100), HasSubstr(" python train.py"));
  EXPECT_THAT(model.PlainLine(model.rows()[0]), HasSubstr(" cmd=/opt/venv/bin/python train.py"));
  model.SetFilter("venv");  // the filter sees the whole command line
  EXPECT_EQ(model.rows().size(), 1u);
}

TEST(TopModelTest, TheGraphWindowFitsHowLongTheRowHasBeenWatched) {
  TopModel model;
  for (std::uint64_t t = 1000; t <= 1020; t += 5) model.Update(TwoProcesses(t * kSecond));
  EXPECT_EQ(model.WindowNs(), 30 * kSecond);  // 20 s of history: the 30 s window
  EXPECT_THAT(model.GraphTitle(), HasSubstr("last 30 s"));
  // The whole history spans the graph: its first sample lands in the first third.
  const std::vector<GraphColumn> graph = model.Graph(30);
  EXPECT_FALSE(graph[0].has_data);
  EXPECT_TRUE(graph[10].has_data);
  model.Update(TwoProcesses(1200 * kSecond));  // 200 s: 5 min
  EXPECT_EQ(model.WindowNs(), 300 * kSecond);
  EXPECT_THAT(model.GraphTitle(), HasSubstr("last 5 min"));
  model.Update(TwoProcesses(4000 * kSecond));  // 50 min: 60 min
  EXPECT_EQ(model.WindowNs(), 3600 * kSecond);
  // A longer job: history is kept 60 min, the window stays at 60 min.
  for (std::uint64_t t = 4600; t <= 9400; t += 600) model.Update(TwoProcesses(t * kSecond));
  EXPECT_EQ(model.WindowNs(), 3600 * kSecond);
  EXPECT_THAT(model.GraphTitle(), HasSubstr("last 60 min"));
}

// Three GPUs as NVML lists them; node1's traced rows are pids 100 (cuda:0, cuda:1) and 200.
std::vector<GpuMemory> ThreeGpus(std::uint64_t untraced_bytes) {
  GpuMemory a{0, "GPU-aaaa", "H200", 150 * kMiB * 1024, 4096 * kMiB, {}};
  a.processes = {{100, 300 * kMiB}, {200, 200 * kMiB}, {300, untraced_bytes}, {301, 5 * kMiB}};
  GpuMemory b{1, "GPU-bbbb", "H200", 150 * kMiB * 1024, 100 * kMiB, {{100, 100 * kMiB}}};
  GpuMemory c{2, "GPU-cccc", "H200", 150 * kMiB * 1024, 0, {}};
  return {a, b, c};
}

TEST(TopModelTest, NvmlProcessesThatAreNotTracedMakeOneRowPerGpu) {
  TopModel model;
  model.Update(TwoProcesses(1000 * kSecond));
  model.SetGpus(ThreeGpus(1024 * kMiB), "node1", 1000 * kSecond);
  // Only GPU 0 has untraced processes: 300 and 301; 100 and 200 are node1's traced pids.
  ASSERT_EQ(model.rows().size(), 4u);
  const Row& untraced = model.rows()[0];  // the largest reserved
  EXPECT_TRUE(untraced.untraced);
  EXPECT_EQ(untraced.device, 0u);
  EXPECT_EQ(untraced.reserved, 1029 * kMiB);
  EXPECT_EQ(untraced.untraced_processes, 2u);
  EXPECT_THAT(model.RowLine(untraced, 100), HasSubstr("[untraced: 2 processes]"));
  EXPECT_THAT(model.PlainLine(untraced),
              HasSubstr("host=node1 untraced_processes=2 device=0 reserved=1078984704 "));
  const std::vector<std::string> lines = model.GpuLines(100);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines[0], HasSubstr("GPU 0 H200: 4.00G of 150G used, traced 500M, untraced 1.00G "
                                  "(2 processes)"));
  EXPECT_THAT(lines[1], HasSubstr("GPU 1 H200: 100M of 150G used, traced 100M, untraced 0B "
                                  "(0 processes)"));
  EXPECT_THAT(model.PlainGpuLines()[0],
              HasSubstr("gpu=0 uuid=GPU-aaaa total=161061273600 used=4294967296 traced=524288000 "
                        "untraced=1078984704 untraced_processes=2 name=H200"));
  // Its peak stays when the memory goes down; the graph can show it.
  model.SetGpus(ThreeGpus(24 * kMiB), "node1", 1001 * kSecond);
  const Row* row = nullptr;
  for (const Row& r : model.rows()) row = r.untraced ? &r : row;
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->reserved, 29 * kMiB);
  EXPECT_EQ(row->peak_reserved, 1029 * kMiB);
}

TEST(TopModelTest, TracedPidsCountOnlyOnThisHostAndGpusFollowUuids) {
  v1::StatsUpdate update = TwoProcesses(1000 * kSecond);
  // This process sees GPU-cccc as its cuda:0 (CUDA_VISIBLE_DEVICES=2).
  AddProcess(update, 400, "./other", {{0, kMiB, 2 * kMiB}});
  update.mutable_processes(2)->mutable_devices(0)->mutable_device()->set_uuid("GPU-cccc");
  TopModel model;
  model.Update(update);
  model.SetGpus(ThreeGpus(0), "node1", 1000 * kSecond);
  std::vector<std::string> lines = model.GpuLines(100);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines[0], HasSubstr("traced 500M"));  // 100's and 200's cuda:0, no UUID
  EXPECT_THAT(lines[2], HasSubstr("GPU 2 H200: 0B of 150G used, traced 2.00M"));  // pid 400
  // Another machine's view: node1's pids are not this host's, so every process is untraced.
  model.SetGpus(ThreeGpus(0), "node2", 1001 * kSecond);
  std::map<std::uint32_t, std::size_t> untraced;
  for (const Row& row : model.rows()) {
    if (row.untraced) untraced[row.device] = row.untraced_processes;
  }
  EXPECT_EQ(untraced, (std::map<std::uint32_t, std::size_t>{{0, 4}, {1, 1}}));
  EXPECT_THAT(model.GpuLines(100)[0], HasSubstr("traced 0B"));
  // No NVML: no untraced rows and no GPU lines.
  model.SetGpus({}, "node1", 1002 * kSecond);
  for (const Row& row : model.rows()) EXPECT_FALSE(row.untraced);
  EXPECT_TRUE(model.GpuLines(80).empty());
}

}  // namespace
}  // namespace vramscope::cli::top
