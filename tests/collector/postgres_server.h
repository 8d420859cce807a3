// A real PostgreSQL server for tests (Debian postgresql, /usr/lib/postgresql/15/bin or
// $VRAMSCOPE_PG_BIN): initdb into a fresh temporary directory, listening only on a unix socket in
// that directory (no TCP port to collide with). PostgreSQL refuses to run as root, so as root
// the directory is given to `nobody` and the server runs as nobody (runuser). pg_ctl -w waits for
// the server to accept connections, on start as on stop. Not thread-safe.
#ifndef VRAMSCOPE_TESTS_COLLECTOR_POSTGRES_SERVER_H_
#define VRAMSCOPE_TESTS_COLLECTOR_POSTGRES_SERVER_H_

#include <pwd.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "tests/collector/test_util.h"

namespace vramscope::testing {

class PostgresServer {
 public:
  // Empty on success, else why the server could not be made (a test skips or fails on it).
  std::string Init() {
    const std::string bin =
        Env("VRAMSCOPE_PG_BIN").empty() ? "/usr/lib/postgresql/15/bin" : Env("VRAMSCOPE_PG_BIN");
    if (access((bin + "/initdb").c_str(), X_OK) != 0) return "no initdb in " + bin;
    bin_ = bin;
    if (geteuid() == 0) {
      const passwd* nobody = getpwnam("nobody");
      if (nobody == nullptr) return "running as root and there is no user nobody to run it as";
      if (chown(dir_.path().c_str(), nobody->pw_uid, nobody->pw_gid) != 0) return "chown failed";
      as_user_ = "runuser -u nobody -- ";
    }
    if (!Shell(bin_ + "/initdb -D " + Data() + " -A trust -U vramscope --no-sync -E UTF8")) {
      return "initdb failed: " + ReadFile(dir_.path() + "/out.txt");
    }
    return "";
  }
  bool Start() {
    return Shell(bin_ + "/pg_ctl -D " + Data() + " -l " + dir_.path() + "/server.log -w -t 60" +
                 " -o \"-k " + dir_.path() + " -c listen_addresses='' -p 5432 -F\" start");
  }
  bool Stop() { return Shell(bin_ + "/pg_ctl -D " + Data() + " -m fast -w -t 60 stop"); }
  ~PostgresServer() {
    if (!bin_.empty()) Stop();
  }
  std::string Uri() const {
    return "postgresql://vramscope@/postgres?host=" + dir_.path() + "&port=5432";
  }
  std::string Log() const { return ReadFile(dir_.path() + "/server.log"); }

 private:
  std::string Data() const { return dir_.path() + "/data"; }
  bool Shell(const std::string& command) {
    const std::string line = as_user_ + command + " >" + dir_.path() + "/out.txt 2>&1";
    const int status = system(line.c_str());
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

  TempDir dir_;
  std::string bin_;
  std::string as_user_;
};

}  // namespace vramscope::testing

#endif  // VRAMSCOPE_TESTS_COLLECTOR_POSTGRES_SERVER_H_
