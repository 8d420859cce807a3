// The HTTP edge of the metrics: civetweb's C API (prometheus-cpp's Exposer is civetweb too, but
// serializes through TextSerializer, too slow at fleet size: README "Prometheus metrics"). Kept
// apart from the exposition (metrics.cc) so that the listening can be wrapped (TLS, auth) in one
// place.
#include <absl/status/status.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <civetweb.h>
#include <string.h>

#include <mutex>

#include "vramscope/collector/metrics.h"
#include "vramscope/log.h"

namespace vramscope::collector {

absl::StatusOr<std::string> MetricsListenAddress(absl::string_view flag) {
  const size_t colon = flag.rfind(':');
  const absl::string_view host =
      colon == absl::string_view::npos ? absl::string_view() : flag.substr(0, colon);
  const absl::string_view port = colon == absl::string_view::npos ? flag : flag.substr(colon + 1);
  uint32_t number = 0;
  if (!absl::SimpleAtoi(port, &number) || number > 65535 || port.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen=", flag, ": want HOST:PORT, :PORT or PORT"));
  }
  // A bare port is loopback: the exposition names hosts, programs and run labels.
  return absl::StrCat(host.empty() ? "127.0.0.1" : host, ":", number);
}

MetricsServer::~MetricsServer() {
  if (context_ != nullptr) mg_stop(context_);
}

int MetricsServer::Handle(mg_connection* connection, void* data) {
  const auto* server = static_cast<const MetricsServer*>(data);
  const mg_request_info* request = mg_get_request_info(connection);
  const bool head = strcmp(request->request_method, "HEAD") == 0;
  if (!head && strcmp(request->request_method, "GET") != 0) {
    mg_printf(connection,
              "HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\nContent-Length: 0\r\n"
              "Connection: close\r\n\r\n");
    return 405;
  }
  const std::string body = server->render_();
  mg_printf(connection,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            "Content-Length: %zu\r\nConnection: close\r\n\r\n",
            body.size());
  if (!head) mg_write(connection, body.data(), body.size());
  return 200;
}

absl::StatusOr<std::unique_ptr<MetricsServer>> ServeMetrics(const std::string& address,
                                                            std::function<std::string()> render) {
  static std::once_flag library;
  std::call_once(library, [] { mg_init_library(0); });
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->render_ = std::move(render);
  mg_callbacks callbacks{};
  // civetweb's own error lines (a port in use) go to our log.
  callbacks.log_message = [](const mg_connection*, const char* message) {
    Log(LogLevel::kWarning, absl::StrCat("metrics server: ", message));
    return 1;
  };
  // Two workers: scrapes come from a few Prometheus servers, seconds apart.
  const char* options[] = {"listening_ports", address.c_str(), "num_threads", "2", nullptr};
  server->context_ = mg_start(&callbacks, nullptr, options);
  if (server->context_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address,
                                               ": in use, or not an address of this host"));
  }
  mg_set_request_handler(server->context_, "/metrics$", &MetricsServer::Handle, server.get());
  mg_server_port ports[4] = {};
  if (mg_get_server_ports(server->context_, 4, ports) < 1) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address));
  }
  server->port_ = ports[0].port;
  return server;
}

}  // namespace vramscope::collector
