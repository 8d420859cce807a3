// `vramscope top` end to end: the real executable in a detached tmux session of 80x24 (a private
// tmux server per test), against a collector served in process on port 0 and fed the recorded
// event stream testdata/two_processes.textproto. The screen is read with capture-pane and keys
// are sent with send-keys; every wait polls the screen until the expected text is there (30 s
// deadline), nothing depends on timing. Also: plain lines when stdout is not a terminal, exit 3
// with no collector, and `vramscope run --live` over the fake driver with the real shim.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <absl/time/clock.h>
#include <absl/time/time.h>
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/collector/test_util.h"
#include "vramscope/collector/collector.h"
#include "vramscope/collector/service.h"
#include "vramscope/log.h"

namespace vramscope::collector {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::vramscope::testing::ReadFile;
using ::vramscope::testing::TempDir;

constexpr absl::Duration kDeadline = absl::Seconds(30);

using vramscope::testing::Env;

// Runs `command` with /bin/sh; returns its exit status and stdout.
int Shell(const std::string& command, std::string* out = nullptr) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  std::string text;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) text.append(buffer, n);
  const int status = pclose(pipe);
  if (out != nullptr) *out = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string Quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// The recorded stream: EventBatch text protos separated by "---" lines.
std::vector<v1::EventBatch> LoadStream() {
  std::vector<v1::EventBatch> batches;
  const std::string text = ReadFile(Env("VRAMSCOPE_TOP_STREAM"));
  for (absl::string_view part : absl::StrSplit(text, "\n---\n")) {
    v1::EventBatch batch;
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(std::string(part), &batch)) << part;
    batches.push_back(std::move(batch));
  }
  return batches;
}

// A private tmux server (its socket in a temporary directory) with one session "t".
class Tmux {
 public:
  explicit Tmux(const std::string& dir) : socket_(dir + "/tmux.sock") {}
  ~Tmux() { Shell(Base() + " kill-server 2>/dev/null"); }

  bool Start(const std::string& command, int width = 80, int height = 24) {
    return Shell(absl::StrCat(Base(), " new-session -d -s t -x ", width, " -y ", height, " ",
                              Quote(command))) == 0;
  }
  std::string Screen() {
    std::string out;
    Shell(Base() + " capture-pane -p -t t 2>/dev/null", &out);
    return out;
  }
  void Keys(const std::string& keys) { Shell(Base() + " send-keys -t t " + keys); }
  bool Alive() { return Shell(Base() + " has-session -t t 2>/dev/null") == 0; }
  void Resize(int width, int height) {
    Shell(absl::StrCat(Base(), " resize-window -t t -x ", width, " -y ", height));
  }

  // Polls the screen until `done` holds; returns the last screen seen.
  std::string WaitFor(const std::function<bool(const std::string&)>& done) {
    const absl::Time deadline = absl::Now() + kDeadline;
    std::string screen;
    do {
      screen = Screen();
      if (done(screen)) return screen;
      absl::SleepFor(absl::Milliseconds(100));
    } while (absl::Now() < deadline);
    return screen;
  }
  std::string WaitForText(const std::string& text) {
    return WaitFor([&](const std::string& s) { return s.find(text) != std::string::npos; });
  }
  bool WaitForExit() {
    const absl::Time deadline = absl::Now() + kDeadline;
    while (absl::Now() < deadline) {
      if (!Alive()) return true;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  }

 private:
  std::string Base() const { return "tmux -f /dev/null -S " + Quote(socket_); }
  std::string socket_;
};

std::vector<std::string> Lines(const std::string& screen) { return absl::StrSplit(screen, '\n'); }

// Index of the first line containing `text`, or -1.
int LineWith(const std::string& screen, const std::string& text) {
  const std::vector<std::string> lines = Lines(screen);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find(text) != std::string::npos) return static_cast<int>(i);
  }
  return -1;
}

std::string Line(const std::string& screen, const std::string& text) {
  const int index = LineWith(screen, text);
  return index < 0 ? "" : Lines(screen)[static_cast<size_t>(index)];
}

// Rows are "    PID DEV ..." : pid right-aligned in 7 columns, then the device.
std::string RowPrefix(int pid, int device) {
  std::string pid_text = std::to_string(pid);
  std::string device_text = std::to_string(device);
  return std::string(7 - pid_text.size(), ' ') + pid_text +
         std::string(4 - device_text.size(), ' ') + device_text + " ";
}

class TopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(Env("VRAMSCOPE_EXE").empty()) << "VRAMSCOPE_EXE is not set (meson sets it)";
    SetMinLogLevel(LogLevel::kError);
    stream_ = LoadStream();
    ASSERT_EQ(stream_.size(), 3u);
    CollectorOptions options;
    options.data_dir = data_.path();
    collector_ = *Collector::Open(options);
    ServerOptions server_options;
    server_options.listen = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<CollectorServer>> server =
        CollectorServer::Start(collector_.get(), server_options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }
  // Stage 1: the first batch of each process; stage 2: the rest.
  void Feed(int stage) {
    for (const v1::EventBatch& batch : stream_) {
      if ((batch.sequence() == 1) == (stage == 1)) {
        ASSERT_TRUE(collector_->Ingest(batch).ok());
      }
    }
  }
  std::string Top(const std::string& args) {
    return absl::StrCat(Quote(Env("VRAMSCOPE_EXE")), " top --collector ", address_, " ", args);
  }

  TempDir data_;
  TempDir work_;
  std::vector<v1::EventBatch> stream_;
  std::unique_ptr<Collector> collector_;
  std::unique_ptr<CollectorServer> server_;
  std::string address_;
};

TEST_F(TopTest, DashboardShowsRowsAndFollowsKeys) {
  Feed(1);
  Tmux tmux(work_.path());
  ASSERT_TRUE(tmux.Start(Top("--interval 0.2")));
  // Rows: one per process and device, sorted by reserved bytes (largest first).
  std::string screen = tmux.WaitFor([](const std::string& s) {
    return s.find("bench_alloc --iters") != std::string::npos &&
           s.find("python train.py") != std::string::npos;
  });
  ASSERT_THAT(screen, HasSubstr("vramscope top  " + address_));
  EXPECT_THAT(screen, HasSubstr("2 proc"));
  EXPECT_THAT(screen, HasSubstr("sort: reserved (desc)"));
  const int a0 = LineWith(screen, RowPrefix(4242, 0));
  const int a1 = LineWith(screen, RowPrefix(4242, 1));
  const int b0 = LineWith(screen, RowPrefix(777, 0));
  ASSERT_GE(a0, 0) << screen;
  ASSERT_GE(a1, 0) << screen;
  ASSERT_GE(b0, 0) << screen;
  EXPECT_LT(a0, a1);
  EXPECT_LT(a1, b0);
  // cuda:0 of pid 4242: 450 MiB allocated of 512 MiB reserved, fragmentation 50%, no OOM.
  EXPECT_THAT(Line(screen, RowPrefix(4242, 0)), HasSubstr("450M   450M   512M   512M   50%"));
  // At 80 columns the command gets what the figures leave.
  EXPECT_THAT(Line(screen, RowPrefix(4242, 0)), HasSubstr(" python train.py --mod"));
  // cuda:1: 128 of 256 MiB, one OOM.
  EXPECT_THAT(Line(screen, RowPrefix(4242, 1)), HasSubstr("128M   128M   256M   256M"));
  EXPECT_THAT(Line(screen, RowPrefix(4242, 1)), HasSubstr("    1 python"));
  EXPECT_THAT(Line(screen, RowPrefix(777, 0)), HasSubstr("16.0M  16.0M  64.0M  64.0M"));
  // The selected row (the first) has its graph, NVTX ranges and (fetched by GetReport) sites.
  EXPECT_THAT(screen, HasSubstr("Memory: pid 4242 cuda:0"));
  EXPECT_THAT(screen, HasSubstr("NVTX ranges, pid 4242 cuda:0"));
  screen = tmux.WaitForText("forward_step (train.py:42)");
  EXPECT_THAT(screen, HasSubstr("forward_step (train.py:42)"));
  EXPECT_THAT(screen, HasSubstr("backward_step (train.py:57)"));
  // Ranges by their peak: all of cuda:0's 450 MiB was live inside "backward", 400 in "forward".
  EXPECT_THAT(Line(screen, " backward "), HasSubstr("450M x1"));
  EXPECT_THAT(Line(screen, " forward "), HasSubstr("400M x1"));
  EXPECT_LT(LineWith(screen, " backward "), LineWith(screen, " forward ")) << screen;
  EXPECT_THAT(screen, HasSubstr("q quit  s sort"));

  // `s` cycles the sort column: the 8th column is the pid, ascending.
  tmux.Keys("s s s s s s s");
  screen = tmux.WaitForText("sort: pid (asc)");
  ASSERT_THAT(screen, HasSubstr("sort: pid (asc)"));
  EXPECT_LT(LineWith(screen, RowPrefix(777, 0)), LineWith(screen, RowPrefix(4242, 0))) << screen;
  // `r` reverses it.
  tmux.Keys("r");
  screen = tmux.WaitForText("sort: pid (desc)");
  EXPECT_GT(LineWith(screen, RowPrefix(777, 0)), LineWith(screen, RowPrefix(4242, 1))) << screen;
  tmux.Keys("r");
  tmux.WaitForText("sort: pid (asc)");

  // `/` filters by command or pid; Esc clears.
  tmux.Keys("/ b e n c h Enter");
  screen = tmux.WaitFor([](const std::string& s) {
    return s.find("filter: bench") != std::string::npos && s.find("python") == std::string::npos;
  });
  EXPECT_THAT(screen, HasSubstr("filter: bench"));
  EXPECT_GE(LineWith(screen, RowPrefix(777, 0)), 0) << screen;
  EXPECT_LT(LineWith(screen, RowPrefix(4242, 0)), 0) << screen;
  tmux.Keys("/ 4 2 4 2 Enter");  // appends to "bench": nothing matches
  screen = tmux.WaitForText("no process matches the filter");
  EXPECT_THAT(screen, HasSubstr("no process matches the filter"));
  tmux.Keys("Escape");
  screen = tmux.WaitFor([](const std::string& s) {
    return s.find("filter:") == std::string::npos && s.find("python") != std::string::npos;
  });
  EXPECT_GE(LineWith(screen, RowPrefix(4242, 1)), 0) << screen;

  // j/k select: in pid order the rows are 777:0, 4242:0, 4242:1.
  tmux.Keys("g j j");
  screen = tmux.WaitForText("NVTX ranges, pid 4242 cuda:1");
  EXPECT_THAT(screen, HasSubstr("Memory: pid 4242 cuda:1"));
  tmux.Keys("k k");
  screen = tmux.WaitForText("NVTX ranges, pid 777 cuda:0");
  EXPECT_THAT(screen, HasSubstr("(none recorded)"));
  // `t`: the graph of the total.
  tmux.Keys("t");
  screen = tmux.WaitForText("Memory: total of all rows");
  EXPECT_THAT(screen, HasSubstr("Memory: total of all rows"));

  // New events reach the screen: pid 4242 cuda:0 now holds 1.50 GiB.
  Feed(2);
  screen = tmux.WaitForText("1.50G");
  EXPECT_THAT(Line(screen, RowPrefix(4242, 0)), HasSubstr("1.44G  1.44G  1.50G  1.50G"));

  // `?` shows the help, any key closes it.
  tmux.Keys("?");
  screen = tmux.WaitForText("vramscope top: keys");
  EXPECT_THAT(screen, HasSubstr("filter by command or pid"));
  tmux.Keys("x");
  screen = tmux.WaitFor(
      [](const std::string& s) { return s.find("vramscope top: keys") == std::string::npos; });
  EXPECT_THAT(screen, Not(HasSubstr("vramscope top: keys")));

  // A resize is followed: the key help stays on the last line.
  tmux.Resize(100, 30);
  screen = tmux.WaitFor([](const std::string& s) {
    const std::vector<std::string> lines = Lines(s);
    return lines.size() >= 30 && lines[29].rfind("q quit", 0) == 0;
  });
  EXPECT_EQ(Lines(screen)[29].rfind("q quit", 0), 0u) << screen;

  tmux.Keys("q");
  EXPECT_TRUE(tmux.WaitForExit()) << tmux.Screen();
}

TEST_F(TopTest, DashboardSaysReconnectingWhenTheCollectorGoes) {
  Feed(1);
  Tmux tmux(work_.path());
  ASSERT_TRUE(tmux.Start(Top("--interval 0.2")));
  std::string screen = tmux.WaitForText("bench_alloc");
  ASSERT_THAT(screen, HasSubstr("bench_alloc"));
  server_->Shutdown();
  screen = tmux.WaitForText("reconnecting to the collector at " + address_);
  EXPECT_THAT(screen, HasSubstr("reconnecting to the collector at " + address_));
  // The last figures stay on screen meanwhile.
  EXPECT_THAT(screen, HasSubstr("bench_alloc"));
  tmux.Keys("q");
  EXPECT_TRUE(tmux.WaitForExit()) << tmux.Screen();
}

TEST_F(TopTest, PlainLinesWhenNotATerminal) {
  Feed(1);
  std::string out;
  ASSERT_EQ(Shell(Top("--once"), &out), 0) << out;
  const std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << out;
  EXPECT_THAT(lines[0], HasSubstr(" host=node1 pid=4242 device=0 allocated=471859200 "
                                  "peak_allocated=471859200 reserved=536870912 "
                                  "peak_reserved=536870912 fragmentation=0.500 "));
  EXPECT_THAT(lines[0],
              HasSubstr(" ooms=0 finished=0 killed=0 signal=0 cmd=python train.py --model gpt2"));
  EXPECT_THAT(lines[1], HasSubstr(" pid=4242 device=1 allocated=134217728 "));
  EXPECT_THAT(lines[1], HasSubstr(" ooms=1 "));
  EXPECT_THAT(lines[2], HasSubstr(" pid=777 device=0 allocated=16777216 "));
  // --filter applies to plain lines too.
  ASSERT_EQ(Shell(Top("--once --filter bench"), &out), 0);
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(out, '\n', absl::SkipEmpty())).size(), 1u)
      << out;
  // Without --once: a block of lines per interval, as long as it runs.
  ASSERT_EQ(Shell(Top("--interval 50ms") + " | head -n 9", &out), 0);
  const std::vector<std::string> stream = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(stream.size(), 9u) << out;
  EXPECT_THAT(stream[3], HasSubstr(" pid=4242 device=0 "));
  EXPECT_THAT(stream[8], HasSubstr(" pid=777 device=0 "));
}

// NVML present (the fake library): a line per GPU, then one untraced row per GPU with processes
// that are not traced on this machine (the stream's processes are node1's, not this host's).
TEST_F(TopTest, PlainLinesWithNvmlNameEveryGpuAndTheUntracedMemory) {
  Feed(1);
  const std::string nvml =
      absl::StrCat("VRAMSCOPE_NVML_LIBRARY=", Quote(Env("VRAMSCOPE_TEST_FAKE_NVML")),
                   " VRAMSCOPE_FAKE_NVML='GPU-fake-0|Fake H200|150000000000|20000000000|"
                   "4242:536870912,31337:1073741824;GPU-fake-1|Fake H200|150000000000|0|' ");
  std::string out;
  ASSERT_EQ(Shell(nvml + Top("--once"), &out), 0) << out;
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 6u) << out;
  EXPECT_THAT(lines[0], HasSubstr(" gpu=0 uuid=GPU-fake-0 total=150000000000 used=20000000000 "
                                  "traced=0 untraced=1610612736 untraced_processes=2 "
                                  "name=Fake H200"));
  EXPECT_THAT(lines[1], HasSubstr(" gpu=1 uuid=GPU-fake-1 total=150000000000 used=0 "));
  EXPECT_THAT(lines[2], HasSubstr(" untraced_processes=2 device=0 reserved=1610612736 "));
  // --no-gpus: NVML left alone.
  ASSERT_EQ(Shell(nvml + Top("--once --no-gpus"), &out), 0) << out;
  lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  EXPECT_EQ(lines.size(), 3u) << out;
}

TEST_F(TopTest, ExitThreeWithoutACollectorAndTwoForUsage) {
  // A port nothing listens on: bind one, note it, close it.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  const std::string closed = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  std::string out;
  EXPECT_EQ(
      Shell(absl::StrCat(Quote(Env("VRAMSCOPE_EXE")), " top --once --collector ", closed, " 2>&1"),
            &out),
      3);
  EXPECT_THAT(out, HasSubstr("cannot reach the collector at " + closed));
  EXPECT_EQ(Shell(Top("--interval 0 2>&1"), &out), 2);
  EXPECT_THAT(out, HasSubstr("--interval '0' is not a positive duration"));
  EXPECT_EQ(Shell(Top("--bogus 2>&1"), &out), 2);
  EXPECT_EQ(Shell(absl::StrCat(Quote(Env("VRAMSCOPE_EXE")), " top --help"), &out), 0);
  EXPECT_THAT(out, HasSubstr("usage: vramscope top"));
}

// `vramscope run --live`: the real shim over the fake driver, no collector.
class LiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Env("VRAMSCOPE_TOP_LIVE_APP").empty()) {
      GTEST_SKIP() << "built without the CUDA headers: no shim, no fake driver";
    }
    stop_ = work_.path() + "/stop";
  }
  std::string Run(const std::string& redirections) {
    return absl::StrCat("env LD_LIBRARY_PATH=", Quote(Env("VRAMSCOPE_TOP_FAKE_CUDA_DIR")),
                        " VRAMSCOPE_SHIM=", Quote(Env("VRAMSCOPE_TOP_SHIM")),
                        " VRAMSCOPE_FAKE_CAPACITY=1073741824 VRAMSCOPE_FAKE_DEVICES=2 ",
                        Quote(Env("VRAMSCOPE_EXE")), " run --live -- ",
                        Quote(Env("VRAMSCOPE_TOP_LIVE_APP")), " ", Quote(stop_), " ", redirections);
  }
  void Stop() { testing::WriteFile(stop_, "stop\n"); }

  TempDir work_;
  std::string stop_;
};

TEST_F(LiveTest, DashboardWhileTheCommandRunsThenTheReport) {
  const std::string err = work_.path() + "/stderr";
  const std::string rc = work_.path() + "/rc";
  Tmux tmux(work_.path());
  ASSERT_TRUE(tmux.Start(absl::StrCat(
      "sh -c ", Quote(Run("2>" + Quote(err)) + "; echo $? >" + Quote(rc) + "; sleep 60"))));
  std::string screen = tmux.WaitFor([](const std::string& s) {
    return s.find("top_live_app") != std::string::npos && s.find("56.0M") != std::string::npos;
  });
  ASSERT_THAT(screen, HasSubstr("vramscope top  run --live"));
  EXPECT_THAT(screen, HasSubstr("1 proc"));
  const std::string row = Line(screen, "top_live_app");
  EXPECT_THAT(row, HasSubstr(" 0 ")) << screen;
  EXPECT_THAT(row, HasSubstr("56.0M")) << screen;
  // The program's own output is held back while the dashboard is up.
  EXPECT_THAT(screen, Not(HasSubstr("live app: allocated")));
  // Keys work here too.
  tmux.Keys("?");
  EXPECT_THAT(tmux.WaitForText("vramscope top: keys"), HasSubstr("vramscope top: keys"));
  tmux.Keys("x");
  // `q` closes the dashboard; the run goes on until the program ends.
  tmux.Keys("q");
  const absl::Time closed_by = absl::Now() + kDeadline;
  while (ReadFile(err).find("dashboard closed") == std::string::npos && absl::Now() < closed_by) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_THAT(ReadFile(err), HasSubstr("vramscope run: dashboard closed; the report follows"));
  EXPECT_TRUE(ReadFile(rc).empty());
  Stop();
  const absl::Time deadline = absl::Now() + kDeadline;
  while (ReadFile(rc).empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(ReadFile(rc), "0\n");
  const std::string report = ReadFile(err);
  EXPECT_THAT(report, HasSubstr("CMD's output while the dashboard was shown:\n"));
  EXPECT_THAT(report, HasSubstr("live app: allocated 56 MiB\n"));
  EXPECT_THAT(report, HasSubstr("cuda:0"));
}

TEST_F(LiveTest, PlainLinesWhenNotATerminal) {
  // The first line seen, then the program is told to stop; the last lines show it finished.
  FILE* pipe = popen(Run("2>/dev/null").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string text;
  char line[4096];
  bool stopped = false;
  while (fgets(line, sizeof(line), pipe) != nullptr) {
    text += line;
    if (!stopped && std::string(line).find("allocated=58720256") != std::string::npos) {
      Stop();
      stopped = true;
    }
  }
  const int status = pclose(pipe);
  EXPECT_TRUE(stopped) << text;
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0);
  const std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  ASSERT_FALSE(lines.empty());
  EXPECT_THAT(lines.back(), HasSubstr(" device=0 allocated=0 peak_allocated=58720256 "));
  EXPECT_THAT(lines.back(), HasSubstr(" finished=1 killed=0 signal=0 cmd="));
}

}  // namespace
}  // namespace vramscope::collector
