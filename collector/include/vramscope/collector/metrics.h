// Prometheus exposition of the collector (`--metrics-listen`): per traced process and device,
// per host and device, and the collector's own health. The metric names and labels are listed in
// collector/README.md ("Prometheus metrics").
//
// Each scrape takes Collector::Metrics (a brief copy per process under its lock) and formats it
// with no lock held, so ingest is not blocked by a scrape. CollectorMetrics gives the snapshot as
// prometheus-cpp metric families (a prometheus::Collectable) and as text (what is served: written
// directly, byte for byte as prometheus-cpp's TextSerializer would, several times faster).
//
// Thread safety: CollectorMetrics::Collect and Render may be called from several threads at once
// (the HTTP server's); the free functions are pure; MetricsServer is created and destroyed by one
// thread. Errors: absl::Status (MetricsListenAddress, ServeMetrics).
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

struct mg_connection;
struct mg_context;

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

// The exposition of `snapshot`: every metric family, in a fixed order, as prometheus-cpp's
// objects (for a prometheus::Registry or Exposer) ...
std::vector<prometheus::MetricFamily> BuildFamilies(const MetricsSnapshot& snapshot);
// ... and as the text format 0.0.4, byte for byte what prometheus::TextSerializer makes of
// BuildFamilies(snapshot), written directly (what the collector serves; ~4-5x less CPU).
std::string RenderText(const MetricsSnapshot& snapshot);

class CollectorMetrics : public prometheus::Collectable {
 public:
  // `collector` must outlive this object.
  CollectorMetrics(const Collector* collector, MetricsOptions options);
  std::vector<prometheus::MetricFamily> Collect() const override;
  // The text exposition (RenderText) of the same snapshot Collect() would use.
  std::string Render() const;

 private:
  MetricsSnapshot Snapshot() const;

  const Collector* collector_;
  MetricsOptions options_;
};

// "HOST:PORT" as given; ":PORT" or "PORT" -> "127.0.0.1:PORT". INVALID_ARGUMENT when the port
// is not a number in 0..65535 or the host is empty in a form that needs one.
absl::StatusOr<std::string> MetricsListenAddress(absl::string_view flag);

// An HTTP server (civetweb, the server prometheus-cpp's pull library uses) answering GET
// /metrics with the text `render` returns, computed per request. Destroying it stops the server
// and waits for the requests in progress.
class MetricsServer {
 public:
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  int port() const { return port_; }

 private:
  friend absl::StatusOr<std::unique_ptr<MetricsServer>> ServeMetrics(const std::string&,
                                                                     std::function<std::string()>);
  MetricsServer() = default;
  static int Handle(mg_connection* connection, void* server);
  std::function<std::string()> render_;
  mg_context* context_ = nullptr;
  int port_ = 0;
};

// Listens on `address` (MetricsListenAddress's form; port 0 picks a free one) and serves
// `render`'s text at /metrics. The one place the metrics endpoint is created: wrap it to add TLS
// or auth. UNAVAILABLE when the address cannot be bound.
absl::StatusOr<std::unique_ptr<MetricsServer>> ServeMetrics(const std::string& address,
                                                            std::function<std::string()> render);

}  // namespace vramscope::collector

#endif  // VRAMSCOPE_COLLECTOR_METRICS_H_
