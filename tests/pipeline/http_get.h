// A minimal HTTP/1.0 GET over loopback for tests (Prometheus's API, the collector's /metrics),
// and a free loopback port for servers that cannot report the one they bound.
// Thread safety: free functions, no shared state. Errors: status 0 when nothing answered.
#ifndef VRAMSCOPE_TESTS_PIPELINE_HTTP_GET_H_
#define VRAMSCOPE_TESTS_PIPELINE_HTTP_GET_H_

#include <absl/strings/numbers.h>
#include <absl/strings/str_format.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace vramscope::testing {

struct HttpResponse {
  int status = 0;  // 0: no connection or no valid answer
  std::string body;
};

// GET http://127.0.0.1:PORT/PATH (PATH already URL-encoded).
inline HttpResponse HttpGet(int port, const std::string& path) {
  HttpResponse response;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return response;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string raw;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    const std::string request =
        absl::StrFormat("GET %s HTTP/1.0\r\nHost: 127.0.0.1:%d\r\n\r\n", path, port);
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      char buffer[65536];
      ssize_t n;
      while ((n = ::read(fd, buffer, sizeof(buffer))) > 0) raw.append(buffer, n);
    }
  }
  ::close(fd);
  // "HTTP/1.x NNN ..." then headers, a blank line, the body.
  const size_t end_of_headers = raw.find("\r\n\r\n");
  if (raw.size() < 12 || end_of_headers == std::string::npos ||
      !absl::SimpleAtoi(raw.substr(9, 3), &response.status)) {
    return HttpResponse{};
  }
  response.body = raw.substr(end_of_headers + 4);
  return response;
}

// Percent-encodes a query parameter's value.
inline std::string UrlEncode(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

// A loopback port free right now (bound to port 0, then released): for a server that takes a
// port but cannot report the one it bound. Another process may take it first; callers retry.
inline int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

}  // namespace vramscope::testing

#endif  // VRAMSCOPE_TESTS_PIPELINE_HTTP_GET_H_
