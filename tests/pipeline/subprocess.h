// Runs a daemon of ours (vramscope-collector, vramscope-agent) as a child process for fault tests:
// start, read its stderr as it goes, SIGKILL or SIGTERM it, collect the exit status.
// Thread safety: one test thread drives it; an internal thread drains stderr.
#ifndef VRAMSCOPE_TESTS_PIPELINE_SUBPROCESS_H_
#define VRAMSCOPE_TESTS_PIPELINE_SUBPROCESS_H_

#include <absl/strings/numbers.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace vramscope::testing {

class Subprocess {
 public:
  Subprocess() = default;
  ~Subprocess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Wait();
    }
  }
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  // Starts `argv`; false when fork/exec fails.
  bool Start(const std::vector<std::string>& argv) {
    // Built before fork: the child of a threaded process may only call async-signal-safe code.
    std::vector<char*> args;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return false;
    pid_ = ::fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      ::dup2(fds[1], 2);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    reader_ = std::thread([this, fd = fds[0]] {
      char buffer[4096];
      while (true) {
        ssize_t n = ::read(fd, buffer, sizeof(buffer));
        if (n <= 0) break;
        absl::MutexLock lock(&mu_);
        output_.append(buffer, static_cast<size_t>(n));
      }
      ::close(fd);
      absl::MutexLock lock(&mu_);
      eof_ = true;
    });
    return true;
  }

  // Waits until stderr contains `text` (true) or the child closed stderr / `timeout` passed.
  bool WaitForOutput(const std::string& text, absl::Duration timeout = absl::Seconds(20)) {
    absl::MutexLock lock(&mu_);
    auto seen = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return eof_ || output_.find(text) != std::string::npos;
    };
    mu_.AwaitWithTimeout(absl::Condition(&seen), timeout);
    return output_.find(text) != std::string::npos;
  }

  // The collector's "serving on ... (port N)" line: N, or 0.
  int WaitForPort() {
    if (!WaitForOutput("(port ")) return 0;
    absl::MutexLock lock(&mu_);
    size_t at = output_.find("(port ") + 6;
    size_t end = output_.find(')', at);
    int port = 0;
    return absl::SimpleAtoi(output_.substr(at, end - at), &port) ? port : 0;
  }

  // The child's pid (-1 when not running).
  pid_t pid() const { return pid_; }

  std::string output() {
    absl::MutexLock lock(&mu_);
    return output_;
  }

  void Kill(int signal) {
    if (pid_ > 0) ::kill(pid_, signal);
  }

  // Exit code, 128 + signal when killed, -1 when never started.
  int Wait() {
    if (pid_ <= 0) return -1;
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    if (reader_.joinable()) reader_.join();
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  std::thread reader_;
  absl::Mutex mu_;
  std::string output_ ABSL_GUARDED_BY(mu_);
  bool eof_ ABSL_GUARDED_BY(mu_) = false;
};

// Path of one of our binaries, passed by meson in the environment.
inline std::string BinaryFromEnv(const char* variable) {
  const char* value = ::getenv(variable);
  return value != nullptr ? value : "";
}

}  // namespace vramscope::testing

#endif  // VRAMSCOPE_TESTS_PIPELINE_SUBPROCESS_H_
