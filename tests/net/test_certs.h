// Certificates and token files made at test time with the openssl command (never checked in):
// a CA, a server certificate it signs for 127.0.0.1 and localhost, a client certificate it signs
// (CN node-a), and a second CA that signed nothing of ours. EC P-256 keys: fast to make.
//
// Thread safety: build one per test (or per suite) on the test thread. Errors: ok() false, with
// the openssl command's output in error().
#ifndef VRAMSCOPE_TESTS_NET_TEST_CERTS_H_
#define VRAMSCOPE_TESTS_NET_TEST_CERTS_H_

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace vramscope::testing {

class TestCerts {
 public:
  // Writes everything under `dir` (which must exist).
  explicit TestCerts(const std::string& dir) : dir_(dir) {
    ok_ = Ca("ca") && Ca("other-ca") &&
          Leaf("server", "ca", "localhost",
               "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth") &&
          Leaf("client", "ca", "node-a", "extendedKeyUsage=clientAuth") &&
          Leaf("other-client", "other-ca", "intruder", "extendedKeyUsage=clientAuth");
  }

  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string ca() const { return path("ca.pem"); }
  std::string other_ca() const { return path("other-ca.pem"); }
  std::string server_cert() const { return path("server.pem"); }
  std::string server_key() const { return path("server.key"); }
  std::string client_cert() const { return path("client.pem"); }
  std::string client_key() const { return path("client.key"); }
  std::string other_client_cert() const { return path("other-client.pem"); }
  std::string other_client_key() const { return path("other-client.key"); }

  // Writes `text` to DIR/name with `mode` (exactly, whatever the umask); returns the path.
  std::string WriteSecret(const std::string& name, const std::string& text,
                          mode_t mode = 0600) const {
    const std::string file = path(name);
    std::ofstream(file, std::ios::trunc) << text;
    ::chmod(file.c_str(), mode);
    return file;
  }

 private:
  bool Run(const std::string& command) {
    const std::string full = command + " >" + path("openssl.log") + " 2>&1";
    const int status = std::system(full.c_str());
    if (status == 0) return true;
    std::ifstream log(path("openssl.log"));
    error_ = "failed: " + command + "\n" +
             std::string(std::istreambuf_iterator<char>(log), std::istreambuf_iterator<char>());
    return false;
  }

  bool Ca(const std::string& name) {
    return Run(
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2"
        " -subj /CN=vramscope-test-" +
        name + " -keyout " + path(name + ".key") + " -out " + path(name + ".pem") +
        " -addext basicConstraints=critical,CA:TRUE"
        " -addext keyUsage=critical,keyCertSign,cRLSign");
  }

  bool Leaf(const std::string& name, const std::string& ca, const std::string& cn,
            const std::string& extensions) {
    std::ofstream(path(name + ".ext"), std::ios::trunc) << extensions << "\n";
    return Run("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=" +
               cn + " -keyout " + path(name + ".key") + " -out " + path(name + ".csr")) &&
           Run("openssl x509 -req -days 2 -in " + path(name + ".csr") + " -CA " +
               path(ca + ".pem") + " -CAkey " + path(ca + ".key") + " -CAcreateserial -out " +
               path(name + ".pem") + " -extfile " + path(name + ".ext")) &&
           ::chmod(path(name + ".key").c_str(), 0600) == 0;
  }

  std::string dir_;
  bool ok_ = false;
  std::string error_;
};

}  // namespace vramscope::testing

#endif  // VRAMSCOPE_TESTS_NET_TEST_CERTS_H_
