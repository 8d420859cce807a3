// The `vramscope` command line: one entry per subcommand.
//
// A subcommand is a function taking the arguments after its name (argv[0] is the subcommand
// name) and returning the process exit code: 0 ok, 1 check failed, 2 usage or unreadable input,
// 3 cannot reach the collector (docs/style.md). Its flags are CLI11 definitions
// (vramscope/command_line.h): `define` adds them to an App and returns what they write into, so
// `vramscope --help`, the man page and the completions list the same flags the verb parses.
#pragma once

#include <memory>
#include <string_view>

namespace CLI {
class App;
}  // namespace CLI

namespace vramscope::cli {

struct Command {
  std::string_view name;
  std::string_view summary;  // one line for `vramscope --help`
  int (*run)(int argc, char** argv);
  // Adds the verb's flags to `app`; the result owns the variables they write into.
  std::shared_ptr<void> (*define)(CLI::App& app);
};

inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnreachable = 3;

}  // namespace vramscope::cli
