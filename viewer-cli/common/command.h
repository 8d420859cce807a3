// The `vramscope` command line: one entry per subcommand.
//
// A subcommand is a function taking the arguments after its name (argv[0] is the subcommand
// name) and returning the process exit code: 0 ok, 1 check failed, 2 usage or unreadable input,
// 3 cannot reach the collector (docs/style.md).
#pragma once

#include <string_view>

namespace vramscope::cli {

struct Command {
  std::string_view name;
  std::string_view summary;  // one line for `vramscope --help`
  int (*run)(int argc, char** argv);
};

inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnreachable = 3;

}  // namespace vramscope::cli
