// Prometheus exposition of the collector (`--metrics-listen`): per traced process and device,
// per host and device, and the collector's own health. The metric names and labels are listed in
// collector/README.md ("Prometheus metrics").
//
// CollectorMetrics is a prometheus::Collectable that builds its metric families on demand, at
// each scrape, from Collector::Metrics (a brief copy per process under its lock), so a scrape
// never holds a lock while it formats text and ingest is not blocked by it.
//
// Thread safety: CollectorMetrics::Collect may be called from several threads at once (the HTTP
// server's); MetricsServer is used from one thread. Errors: absl::Status (ServeMetrics).
#ifndef VRAMSCOPE_COLLECTOR_METRICS_H_
#define VRAMSCOPE_COLLECTOR_METRICS_H_

#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <absl/time/time.h>
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "vramscope/collector/collector.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace vramscope::collector {

struct MetricsOptions {
  // How long a finished process stays in the exposition after the collector stored its exit.
  absl::Duration retention = absl::Minutes(5);
  // The wall clock in ns (tests move it); empty = CLOCK_REALTIME.
  std::function<uint64_t()> now_ns;
};

// The Prometheus label name for run label `name`: "label_" + name with every byte outside
// [A-Za-z0-9_] replaced by '_' (so it can clash neither with the fixed labels nor with the
// reserved "__" prefix).
std::string RunLabelName(absl::string_view name);

// The exposition of `snapshot`: every metric family, in a fixed order.
std::vector<prometheus::MetricFamily> BuildFamilies(const MetricsSnapshot& snapshot);

class CollectorMetrics : public prometheus::Collectable {
 public:
  // `collector` must outlive this object.
  CollectorMetrics(const Collector* collector, MetricsOptions options);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const Collector* collector_;
  MetricsOptions options_;
};

// "HOST:PORT" as given; ":PORT" or "PORT" -> "127.0.0.1:PORT". INVALID_ARGUMENT when the port
// is not a number in 0..65535 or the host is empty in a form that needs one.
absl::StatusOr<std::string> MetricsListenAddress(absl::string_view flag);

// An HTTP server answering GET /metrics with `metrics`' exposition (text format 0.0.4).
class MetricsServer {
 public:
  ~MetricsServer();
  int port() const { return port_; }

 private:
  friend absl::StatusOr<std::unique_ptr<MetricsServer>> ServeMetrics(
      const std::string&, std::shared_ptr<prometheus::Collectable>);
  MetricsServer() = default;
  std::shared_ptr<prometheus::Collectable> metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

// Listens on `address` (MetricsListenAddress's form; port 0 picks a free one) and serves
// `metrics`. The one place the metrics endpoint is created: wrap it to add TLS or auth.
// UNAVAILABLE when the address cannot be bound.
absl::StatusOr<std::unique_ptr<MetricsServer>> ServeMetrics(
    const std::string& address, std::shared_ptr<prometheus::Collectable> metrics);

}  // namespace vramscope::collector

#endif  // VRAMSCOPE_COLLECTOR_METRICS_H_
