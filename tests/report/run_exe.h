// Runs a program (the `vramscope` executable, Chromium) to completion with its stdout and stderr
// captured into strings. For the `vramscope report` integration tests.
#ifndef VRAMSCOPE_TESTS_REPORT_RUN_EXE_H_
#define VRAMSCOPE_TESTS_REPORT_RUN_EXE_H_

#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace vramscope::testing {

struct ExeResult {
  int code = -1;  // exit code, 128 + signal when killed, -1 when it could not start
  std::string out;
  std::string err;
};

// `dir` holds the captured streams (a test's temporary directory).
inline ExeResult RunExe(const std::vector<std::string>& argv, const std::string& dir) {
  ExeResult result;
  const std::string out_path = dir + "/run_exe.stdout", err_path = dir + "/run_exe.stderr";
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return result;
  if (pid == 0) {
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int in = open("/dev/null", O_RDONLY);
    if (out < 0 || err < 0 || in < 0) _exit(126);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    execvp(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  auto slurp = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  result.out = slurp(out_path);
  result.err = slurp(err_path);
  return result;
}

}  // namespace vramscope::testing

#endif  // VRAMSCOPE_TESTS_REPORT_RUN_EXE_H_
