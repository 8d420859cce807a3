// `vramscope check` end to end: the real executable ($VRAMSCOPE_EXE) on crafted report files.
// Exit codes and output for a run within tolerance, regressions (device and NVTX range),
// improvements, several processes, corrupt and missing files, bad options; JUnit XML structure;
// GitHub annotations; --update-baseline round trip; reports that measured nothing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace {

// One device, peaks in MiB, optionally one NVTX range "train:step".
std::string Report(const std::string& command, int requested, int allocated, int reserved,
                   int step = -1) {
  auto mib = [](int n) { return "\"" + std::to_string(std::uint64_t(n) << 20) + "\""; };
  std::string out = "{\"command_line\": [\"" + command +
                    "\"], \"events\": \"1000\", \"devices\": [{\"device\": {\"ordinal\": 0}, "
                    "\"peak_requested_bytes\": " +
                    mib(requested) + ", \"peak_allocated_bytes\": " + mib(allocated) +
                    ", \"peak_reserved_bytes\": " + mib(reserved);
  if (step >= 0) {
    out +=
        ", \"nvtx_ranges\": [{\"domain\": \"train\", \"name\": \"step\", "
        "\"peak_allocated_bytes\": " +
        mib(step) + "}]";
  }
  return out + "}]}";
}

struct Result {
  int code = -1;
  std::string out, err;
};

class CheckCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* exe = getenv("VRAMSCOPE_EXE");
    ASSERT_NE(exe, nullptr) << "VRAMSCOPE_EXE is not set (meson sets it)";
    exe_ = exe;
    char pattern[] = "/tmp/vramscope-check-cli.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    for (const char* name : {"base.json", "now.json", "junit.xml", "out", "err"}) {
      unlink(Path(name).c_str());
    }
    EXPECT_EQ(rmdir(dir_.c_str()), 0) << "unexpected files left in " << dir_;
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  void Write(const std::string& name, const std::string& content) {
    std::ofstream(Path(name)) << content;
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Runs `vramscope check ARGS`; GITHUB_ACTIONS is removed unless `github` is set.
  Result Check(std::vector<std::string> args, bool github = false) {
    args.insert(args.begin(), {exe_, "check"});
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::string(*e).rfind("GITHUB_ACTIONS=", 0) != 0) env.push_back(*e);
    }
    if (github) env.push_back("GITHUB_ACTIONS=true");
    std::vector<char*> argv, envp;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      const int out = open(Path("out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      const int err = open(Path("err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(out, 1);
      dup2(err, 2);
      execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    Result r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = Read(Path("out"));
    r.err = Read(Path("err"));
    return r;
  }
  Result CheckFiles(std::vector<std::string> extra = {}, bool github = false) {
    std::vector<std::string> args = {"--baseline", Path("base.json"), "--report", Path("now.json")};
    args.insert(args.end(), extra.begin(), extra.end());
    return Check(args, github);
  }

  std::string exe_, dir_;
};

TEST_F(CheckCliTest, WithinToleranceExitsZero) {
  Write("base.json", Report("./app", 100, 200, 400, 150));
  Write("now.json", Report("./app", 104, 200, 390, 155));
  const Result r = CheckFiles();
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("4 of 4 figures within 5% of the baseline; OK: no regression"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("::"), std::string::npos);
}

TEST_F(CheckCliTest, RegressionExitsOneWithATable) {
  Write("base.json", Report("./app", 100, 200, 400));
  Write("now.json", Report("./app", 100, 200, 480));
  Result r = CheckFiles();
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("figure                baseline      now      delta  delta %"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("cuda:0 peak reserved   400 MiB  480 MiB  +80.0 MiB  +20.00%  REGRESSION"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("FAIL: 1 regression"), std::string::npos) << r.out;
  // A wider tolerance lets it pass; "25%" is accepted as well as "25".
  EXPECT_EQ(CheckFiles({"--tolerance", "25%"}).code, 0);
  EXPECT_EQ(CheckFiles({"--tolerance=19.5"}).code, 1);
}

TEST_F(CheckCliTest, ImprovementPassesAndIsListed) {
  Write("base.json", Report("./app", 100, 200, 400));
  Write("now.json", Report("./app", 100, 200, 200));
  const Result r = CheckFiles();
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("-50.00%  improvement"), std::string::npos) << r.out;
}

TEST_F(CheckCliTest, NvtxRangeRegression) {
  Write("base.json", Report("./app", 100, 200, 400, 100));
  Write("now.json", Report("./app", 100, 200, 400, 150));
  const Result r = CheckFiles();
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("cuda:0 range train:step peak allocated   100 MiB  150 MiB  +50.0 MiB  "
                       "+50.00%  REGRESSION"),
            std::string::npos)
      << r.out;
}

TEST_F(CheckCliTest, SeveralProcessesMatchByCommandLine) {
  Write("base.json", "{\"reports\": [" + Report("launcher", 0, 0, 0) + ", " +
                         Report("worker-a", 10, 10, 100) + ", " + Report("worker-b", 10, 10, 100) +
                         "]}");
  Write("now.json", "{\"reports\": [" + Report("launcher", 0, 0, 0) + ", " +
                        Report("worker-b", 10, 10, 100) + ", " + Report("worker-a", 10, 10, 150) +
                        "]}");
  const Result r = CheckFiles();
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("  process: worker-a\n  cuda:0 peak reserved"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("process: worker-b"), std::string::npos) << r.out;
}

TEST_F(CheckCliTest, CorruptOrMissingFilesExitTwoNamingTheFile) {
  Write("base.json", Report("./app", 1, 1, 1));
  Write("now.json", "{\"command_line\": [\"./app\"], \"devices\": [");
  Result r = CheckFiles({"--junit", Path("junit.xml")});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("report: " + Path("now.json") + " is not a JSON object"), std::string::npos)
      << r.err;
  EXPECT_NE(access(Path("junit.xml").c_str(), F_OK), 0) << "no verdict from corrupt input";

  Write("now.json", "{\"peak_reserved_bytes\": \"1\"}");  // a DeviceReport field, not a Report's
  r = CheckFiles();
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("is not a vramscope.v1.Report"), std::string::npos) << r.err;

  // 100 KB of `{"a":` nesting: refused before protobuf parses it (its time grows with the square
  // of the depth).
  std::string deep;
  while (deep.size() < 100000) deep += "{\"a\":";
  Write("now.json", deep);
  r = CheckFiles();
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(
      r.err.find("report: " + Path("now.json") + ": JSON nested deeper than 64 levels at byte 320"),
      std::string::npos)
      << r.err;

  unlink(Path("base.json").c_str());
  Write("now.json", Report("./app", 1, 1, 1));
  r = CheckFiles();
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("cannot read " + Path("base.json") + ": No such file or directory"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("--update-baseline"), std::string::npos) << r.err;
}

TEST_F(CheckCliTest, UsageErrorsExitTwo) {
  Write("base.json", Report("./app", 1, 1, 1));
  Write("now.json", Report("./app", 1, 1, 1));
  for (const char* bad : {"-1", "abc", "", "nan", "inf", "1e3", "5%%"}) {
    const Result r = CheckFiles({"--tolerance", bad});
    EXPECT_EQ(r.code, 2) << bad;
    EXPECT_NE(r.err.find("is not a percentage"), std::string::npos) << r.err;
  }
  EXPECT_EQ(CheckFiles({"--tolerance"}).code, 2);
  EXPECT_EQ(CheckFiles({"--frobnicate"}).code, 2);
  EXPECT_EQ(CheckFiles({"--new-floor", "lots"}).code, 2);
  EXPECT_EQ(Check({"--report", Path("now.json")}).code, 2);
  EXPECT_EQ(CheckFiles({"--update-baseline", "--junit", Path("junit.xml")}).code, 2);
  const Result help = Check({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("usage: vramscope check --baseline FILE --report FILE"),
            std::string::npos);
}

// Checks that `xml` is well formed enough for a JUnit reader: declaration, balanced elements,
// quoted attributes, only the five entities and numeric references. Returns the element names
// in document order.
std::vector<std::string> XmlElements(const std::string& xml) {
  std::vector<std::string> names, stack;
  std::size_t i = 0;
  EXPECT_EQ(xml.rfind("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n", 0), 0u);
  i = xml.find("?>") + 2;
  auto check_text = [&](const std::string& text) {
    EXPECT_EQ(text.find('<'), std::string::npos) << text;
    for (std::size_t a = text.find('&'); a != std::string::npos; a = text.find('&', a + 1)) {
      const std::string rest = text.substr(a, 7);
      const bool ok = rest.rfind("&amp;", 0) == 0 || rest.rfind("&lt;", 0) == 0 ||
                      rest.rfind("&gt;", 0) == 0 || rest.rfind("&quot;", 0) == 0 ||
                      rest.rfind("&apos;", 0) == 0 || rest.rfind("&#", 0) == 0;
      EXPECT_TRUE(ok) << text;
    }
  };
  while (i < xml.size()) {
    const std::size_t open = xml.find('<', i);
    if (open == std::string::npos) {
      check_text(xml.substr(i));
      break;
    }
    check_text(xml.substr(i, open - i));
    // Attribute values are quoted and may not contain '<' or '"'.
    std::size_t close = open + 1;
    bool quoted = false;
    for (; close < xml.size() && (quoted || xml[close] != '>'); ++close) {
      if (xml[close] == '"') quoted = !quoted;
      if (quoted) {
        EXPECT_NE(xml[close], '<');
      }
    }
    EXPECT_LT(close, xml.size()) << "unterminated tag";
    const std::string tag = xml.substr(open + 1, close - open - 1);
    check_text(tag);  // attribute values: same escaping rules (quotes balanced above)
    if (tag[0] == '/') {
      EXPECT_FALSE(stack.empty());
      if (!stack.empty()) {
        EXPECT_EQ(stack.back(), tag.substr(1));
        stack.pop_back();
      }
    } else {
      const std::string name = tag.substr(0, tag.find_first_of(" /"));
      names.push_back(name);
      if (tag.back() != '/') stack.push_back(name);
    }
    i = close + 1;
  }
  EXPECT_TRUE(stack.empty()) << "unclosed " << (stack.empty() ? "" : stack.back());
  return names;
}

TEST_F(CheckCliTest, JUnitHasATestcasePerFigureAndFailuresForRegressions) {
  Write("base.json", Report("./app <&> \\\"q\\\"", 100, 200, 400, 100));
  Write("now.json", Report("./app <&> \\\"q\\\"", 100, 300, 400, 100));
  const Result r = CheckFiles({"--junit", Path("junit.xml")});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  const std::string xml = Read(Path("junit.xml"));
  const std::vector<std::string> names = XmlElements(xml);
  ASSERT_GE(names.size(), 2u) << xml;
  EXPECT_EQ(names[0], "testsuites");
  EXPECT_EQ(names[1], "testsuite");
  EXPECT_EQ(std::count(names.begin(), names.end(), "testcase"), 4);
  EXPECT_EQ(std::count(names.begin(), names.end(), "failure"), 1);
  EXPECT_NE(xml.find("tests=\"4\" failures=\"1\""), std::string::npos) << xml;
  EXPECT_NE(xml.find("classname=\"./app &lt;&amp;&gt; &quot;q&quot;\" name=\"cuda:0 peak "
                     "allocated\">\n      <failure type=\"regression\""),
            std::string::npos)
      << xml;
}

TEST_F(CheckCliTest, GitHubAnnotationsWhenInActions) {
  Write("base.json", Report("./app", 100, 200, 400));
  Write("now.json", Report("./app", 50, 300, 400));
  const Result r = CheckFiles({}, /*github=*/true);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("::error title=vramscope%3A cuda%3A0 peak allocated::grew 50.00%25 (200 "
                       "MiB -> 300 MiB, +104857600 bytes), tolerance 5%25\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("::notice title=vramscope%3A cuda%3A0 peak requested::shrank 50.00%25"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(CheckFiles().out.find("::error"), std::string::npos);
}

TEST_F(CheckCliTest, UpdateBaselineRoundTrip) {
  Write("now.json", Report("./app", 100, 200, 480));
  // No baseline yet: created.
  Result r = CheckFiles({"--update-baseline"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(Read(Path("base.json")), Read(Path("now.json")));
  EXPECT_EQ(CheckFiles().code, 0);

  // A regression, accepted: the next check passes.
  Write("now.json", Report("./app", 100, 200, 960));
  EXPECT_EQ(CheckFiles().code, 1);
  r = CheckFiles({"--update-baseline"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("+100.00%  REGRESSION"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("updated from"), std::string::npos) << r.out;
  EXPECT_EQ(CheckFiles().code, 0);

  // An invalid report never becomes the baseline.
  const std::string before = Read(Path("base.json"));
  Write("now.json", "{\"oops\": true}");
  r = CheckFiles({"--update-baseline"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("left unchanged"), std::string::npos) << r.err;
  EXPECT_EQ(Read(Path("base.json")), before);
}

// A run whose shim did not attach writes a report with no process (or a process with no event, or
// no device): comparing it would list every figure as removed and pass. It is refused on either
// side, before any output is written, unless --allow-empty.
TEST_F(CheckCliTest, ReportsThatMeasuredNothingAreRefusedUnlessAllowed) {
  const std::string good = Report("./app", 100, 200, 400, 150);
  const std::string no_device = "{\"command_line\": [\"./app\"], \"events\": \"12\"}";
  struct Case {
    std::string json, why;
  };
  for (const Case& c : std::vector<Case>{
           {"{\"reports\": []}", "holds no process"},
           {"{}", "holds a process with no event"},
           {"{\"reports\": [{}, {}]}", "holds processes with no event"},
           {no_device, "holds no device"},
           {"{\"reports\": [" + no_device + ", " + no_device + "]}", "holds no device"},
       }) {
    SCOPED_TRACE(c.json);
    Write("base.json", good);
    Write("now.json", c.json);
    Result r = CheckFiles({"--junit", Path("junit.xml")});
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("report " + Path("now.json") + " " + c.why + ": nothing was measured"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("the shim did not attach"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--allow-empty"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_NE(access(Path("junit.xml").c_str(), F_OK), 0) << "no JUnit file for a refused input";
    // Accepted on request: every figure is removed, nothing regressed.
    r = CheckFiles({"--allow-empty"});
    EXPECT_EQ(r.code, 0) << r.out << r.err;

    // The same on the baseline side.
    Write("base.json", c.json);
    Write("now.json", good);
    r = CheckFiles();
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("baseline " + Path("base.json") + " " + c.why), std::string::npos)
        << r.err;
    EXPECT_LE(CheckFiles({"--allow-empty"}).code, 1);

    // An empty report never becomes the baseline unless allowed.
    Write("base.json", good);
    Write("now.json", c.json);
    r = CheckFiles({"--update-baseline"});
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("left unchanged"), std::string::npos) << r.err;
    EXPECT_EQ(Read(Path("base.json")), good);
    r = CheckFiles({"--update-baseline", "--allow-empty"});
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_EQ(Read(Path("base.json")), c.json);
  }
  // A launcher that used no device beside a worker that did is a real run.
  Write("base.json", "{\"reports\": [" + no_device + ", " + good + "]}");
  Write("now.json", "{\"reports\": [" + no_device + ", " + good + "]}");
  const Result r = CheckFiles();
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

}  // namespace
