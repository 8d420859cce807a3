// The one command-line grammar (lib/cli, vramscope/command_line.h) as users meet it: every
// program answers --version; every size flag takes the one size grammar and refuses garbage with
// exit 2; unknown flags exit 2 with one line; the generated man pages are well-formed roff and
// list every flag --help lists; the bash completion completes verbs and flags; the zsh one names
// them.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/report/run_exe.h"

namespace vramscope {
namespace {

using testing::ExeResult;
using testing::RunExe;

std::string Env(const char* name) {
  const char* value = getenv(name);
  return value != nullptr ? value : "";
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool OnPath(const std::string& program) {
  return system(("command -v " + program + " >/dev/null 2>&1").c_str()) == 0;
}

// A temporary directory for the captured streams, removed with the test.
class TempDir {
 public:
  TempDir() {
    const char* base = getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/vramscope-cli-XXXXXX";
    path_ = mkdtemp(pattern.data()) != nullptr ? pattern : "/tmp";
  }
  ~TempDir() {
    std::error_code ec;
    if (path_ != "/tmp") std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class CliTest : public ::testing::Test {
 protected:
  ExeResult Run(std::vector<std::string> argv) { return RunExe(argv, dir_.path()); }
  std::string Doc(const std::string& name) { return Env("VRAMSCOPE_DOCS_DIR") + "/" + name; }

  const std::string vramscope_ = Env("VRAMSCOPE_EXE");
  const std::string agent_ = Env("VRAMSCOPE_AGENT");
  const std::string collector_ = Env("VRAMSCOPE_COLLECTOR");
  TempDir dir_;
};

TEST_F(CliTest, EveryProgramAnswersVersion) {
  for (const auto& [exe, name] :
       std::vector<std::pair<std::string, std::string>>{{vramscope_, "vramscope"},
                                                        {agent_, "vramscope-agent"},
                                                        {collector_, "vramscope-collector"}}) {
    const ExeResult r = Run({exe, "--version"});
    EXPECT_EQ(r.code, 0) << name << ": " << r.err;
    EXPECT_EQ(r.out, name + " " VRAMSCOPE_VERSION "\n");
  }
}

// Each size flag of each program, before an unknown flag: an accepted size leaves only the
// unknown flag to complain about; a refused one is named first.
TEST_F(CliTest, OneSizeGrammarEverywhere) {
  const std::vector<std::vector<std::string>> flags = {
      {agent_, "--max-memory-bytes"},    {agent_, "--max-spool-bytes"},
      {collector_, "--max-disk-bytes"},  {collector_, "--max-message-bytes"},
      {vramscope_, "run", "--max-peak"}, {vramscope_, "check", "--new-floor"}};
  for (const std::vector<std::string>& flag : flags) {
    for (const char* size : {"512MiB", "512M", "512m", "0.5GiB", "1G", "1GB", "1gb", "4096"}) {
      std::vector<std::string> argv = flag;
      argv.back() += std::string("=") + size;
      argv.push_back("--no-such-flag");
      const ExeResult r = Run(argv);
      EXPECT_EQ(r.code, 2) << flag.back() << " " << size;
      EXPECT_NE(r.err.find("unknown flag --no-such-flag"), std::string::npos)
          << flag.back() << " " << size << ": " << r.err;
    }
    for (const char* garbage : {"12XB", "-1", "1e9", "0x10", "18446744073709551616", " 4", "G"}) {
      std::vector<std::string> argv = flag;
      argv.push_back(garbage);  // the "--flag VALUE" form
      const ExeResult r = Run(argv);
      EXPECT_EQ(r.code, 2) << flag.back() << " " << garbage;
      EXPECT_NE(r.err.find("is not a size"), std::string::npos)
          << flag.back() << " '" << garbage << "': " << r.err;
    }
  }
}

TEST_F(CliTest, BadUsageExitsTwoEverywhere) {
  std::vector<std::vector<std::string>> cases = {
      {agent_, "--bogus"},     {agent_, "--collector"},           {agent_, "stray"},
      {collector_, "--bogus"}, {collector_, "--fsync=sometimes"}, {vramscope_},
      {vramscope_, "--bogus"}, {vramscope_, "frobnicate"}};
  for (const char* verb : {"run", "replay", "export", "check", "report", "history", "top"}) {
    cases.push_back({vramscope_, verb, "--bogus"});
  }
  for (const std::vector<std::string>& argv : cases) {
    const ExeResult r = Run(argv);
    const std::string what = argv.size() > 1 ? argv[1] + " " + argv.back() : argv[0];
    EXPECT_EQ(r.code, 2) << what << ": " << r.err;
    EXPECT_FALSE(r.err.empty()) << what;
  }
}

// Every --flag the program's help lists (the top level's and each verb's).
std::set<std::string> HelpFlags(const std::string& help) {
  std::set<std::string> flags;
  const std::regex flag(R"((^|[\s,\[(])(--[a-z][a-z0-9-]*))");
  for (auto it = std::sregex_iterator(help.begin(), help.end(), flag); it != std::sregex_iterator();
       ++it) {
    flags.insert((*it)[2]);
  }
  return flags;
}

std::string RoffFlag(const std::string& flag) {
  std::string out;
  for (char c : flag) out += c == '-' ? std::string("\\-") : std::string(1, c);
  return out;
}

TEST_F(CliTest, ManPagesAreWellFormedAndListEveryFlag) {
  const std::vector<std::pair<std::string, std::vector<std::vector<std::string>>>> programs = {
      {"vramscope",
       {{vramscope_, "--help"},
        {vramscope_, "run", "--help"},
        {vramscope_, "replay", "--help"},
        {vramscope_, "export", "--help"},
        {vramscope_, "check", "--help"},
        {vramscope_, "report", "--help"},
        {vramscope_, "history", "--help"},
        {vramscope_, "top", "--help"}}},
      {"vramscope-agent", {{agent_, "--help"}}},
      {"vramscope-collector", {{collector_, "--help"}}}};
  const bool groff = OnPath("groff");
  for (const auto& [name, helps] : programs) {
    const std::string page = Doc(name + ".1");
    const std::string text = Slurp(page);
    ASSERT_FALSE(text.empty()) << page;
    EXPECT_EQ(text.rfind(".TH ", 0), 0u) << page;
    for (const char* section : {"\n.SH NAME\n", "\n.SH SYNOPSIS\n", "\n.SH OPTIONS\n"}) {
      EXPECT_NE(text.find(section), std::string::npos) << page << " lacks " << section;
    }
    if (groff) {
      // -ww: every warning; -z: no output. Any word on stderr is a defect of the page.
      const ExeResult r = Run({"groff", "-man", "-z", "-ww", page});
      EXPECT_EQ(r.code, 0) << page;
      EXPECT_EQ(r.err, "") << page;
    }
    std::size_t flags = 0;
    for (const std::vector<std::string>& argv : helps) {
      const ExeResult help = Run(argv);
      ASSERT_EQ(help.code, 0) << argv.back();
      for (const std::string& flag : HelpFlags(help.out)) {
        ++flags;
        EXPECT_NE(text.find(RoffFlag(flag)), std::string::npos) << name << " man page: " << flag;
      }
    }
    EXPECT_GT(flags, 5u) << name;
  }
}

std::string Complete(const std::string& file, const std::string& function, const std::string& words,
                     int cword, const std::string& dir) {
  const std::string script = "source '" + file + "'; COMP_WORDS=(" + words +
                             "); COMP_CWORD=" + std::to_string(cword) + "; " + function +
                             "; echo \"${COMPREPLY[*]}\"";
  return RunExe({"bash", "-c", script}, dir).out;
}

TEST_F(CliTest, BashCompletionCompletesVerbsAndFlags) {
  const std::string vramscope = Doc("vramscope"), agent = Doc("vramscope-agent");
  EXPECT_EQ(Complete(vramscope, "_vramscope", "vramscope re", 1, dir_.path()), "replay report\n");
  EXPECT_EQ(Complete(vramscope, "_vramscope", "vramscope run --max-p", 2, dir_.path()),
            "--max-peak\n");
  EXPECT_EQ(Complete(vramscope, "_vramscope", "vramscope check --new-f", 2, dir_.path()),
            "--new-floor\n");
  EXPECT_EQ(Complete(vramscope, "_vramscope", "vramscope --vers", 1, dir_.path()), "--version\n");
  EXPECT_EQ(Complete(agent, "_vramscope_agent", "vramscope-agent --spo", 1, dir_.path()),
            "--spool-dir\n");
  EXPECT_EQ(Complete(Doc("vramscope-collector"), "_vramscope_collector",
                     "vramscope-collector --max-d", 1, dir_.path()),
            "--max-disk-bytes\n");
  // A flag's value: no flags offered (bash falls back to file names).
  EXPECT_EQ(Complete(agent, "_vramscope_agent", "vramscope-agent --spool-dir ''", 2, dir_.path()),
            "\n");
}

TEST_F(CliTest, ZshCompletionNamesVerbsAndFlags) {
  const std::string text = Slurp(Doc("_vramscope"));
  EXPECT_EQ(text.rfind("#compdef vramscope\n", 0), 0u);
  for (const char* word : {"'run[", "'report[", "'--max-peak=[", "'--new-floor=[", "_files"}) {
    EXPECT_NE(text.find(word), std::string::npos) << word;
  }
  EXPECT_EQ(Slurp(Doc("_vramscope-agent")).rfind("#compdef vramscope-agent\n", 0), 0u);
  if (OnPath("zsh")) {
    for (const char* name : {"_vramscope", "_vramscope-agent", "_vramscope-collector"}) {
      EXPECT_EQ(Run({"zsh", "-n", Doc(name)}).code, 0) << name;
    }
  }
}

}  // namespace
}  // namespace vramscope
