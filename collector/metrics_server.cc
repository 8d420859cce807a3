// The HTTP edge of the metrics: prometheus-cpp's Exposer (civetweb). Kept apart from the
// exposition (metrics.cc) so that the listening can be wrapped (TLS, auth) in one place.
#include <absl/status/status.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <prometheus/exposer.h>

#include <exception>

#include "vramscope/collector/metrics.h"

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

MetricsServer::~MetricsServer() = default;

absl::StatusOr<std::unique_ptr<MetricsServer>> ServeMetrics(
    const std::string& address, std::shared_ptr<prometheus::Collectable> metrics) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  try {
    // One worker thread: scrapes come from a few Prometheus servers, seconds apart.
    server->exposer_ = std::make_unique<prometheus::Exposer>(address, 1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address));
  }
  server->port_ = ports.front();
  server->metrics_ = std::move(metrics);
  server->exposer_->RegisterCollectable(server->metrics_);
  return server;
}

}  // namespace vramscope::collector
