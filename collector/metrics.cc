#include "vramscope/collector/metrics.h"

#include <absl/strings/str_cat.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <utility>

namespace vramscope::collector {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

// One per-process-and-device family: its value from the device's gauges.
struct DeviceFamily {
  const char* name;
  const char* help;
  MetricType type;
  double (*value)(const DeviceGauges&);
  bool cupti;  // only for devices where CUPTI recorded something
};

double D(uint64_t v) { return static_cast<double>(v); }

constexpr DeviceFamily kDeviceFamilies[] = {
    {"vramscope_process_requested_bytes", "Bytes the process's live allocations requested.",
     MetricType::Gauge, [](const DeviceGauges& g) { return D(g.requested); }, false},
    {"vramscope_process_peak_requested_bytes", "Highest requested bytes so far.", MetricType::Gauge,
     [](const DeviceGauges& g) { return D(g.peak_requested); }, false},
    {"vramscope_process_allocated_bytes", "Bytes of live allocations after the pool's rounding.",
     MetricType::Gauge, [](const DeviceGauges& g) { return D(g.allocated); }, false},
    {"vramscope_process_peak_allocated_bytes", "Highest allocated bytes so far.", MetricType::Gauge,
     [](const DeviceGauges& g) { return D(g.peak_allocated); }, false},
    {"vramscope_process_reserved_bytes",
     "Bytes held from the driver (pool segments plus passed-through allocations).",
     MetricType::Gauge, [](const DeviceGauges& g) { return D(g.reserved); }, false},
    {"vramscope_process_peak_reserved_bytes", "Highest reserved bytes so far.", MetricType::Gauge,
     [](const DeviceGauges& g) { return D(g.peak_reserved); }, false},
    {"vramscope_process_external_fragmentation",
     "1 - largest free block / usable free bytes of the pool now (0 = one free block).",
     MetricType::Gauge, [](const DeviceGauges& g) { return g.external_fragmentation; }, false},
    {"vramscope_process_allocations_total", "Allocations made.", MetricType::Counter,
     [](const DeviceGauges& g) { return D(g.allocs); }, false},
    {"vramscope_process_frees_total", "Allocations freed.", MetricType::Counter,
     [](const DeviceGauges& g) { return D(g.frees); }, false},
    {"vramscope_process_ooms_total", "Out-of-memory failures.", MetricType::Counter,
     [](const DeviceGauges& g) { return D(g.ooms); }, false},
    {"vramscope_process_dropped_events_total",
     "Records the shim dropped because its ring was full (byte figures come from its counters).",
     MetricType::Counter, [](const DeviceGauges& g) { return D(g.dropped_records); }, false},
    {"vramscope_process_cupti_device_bytes", "CUPTI's driver view: device memory held now.",
     MetricType::Gauge, [](const DeviceGauges& g) { return D(g.cupti_bytes); }, true},
    {"vramscope_process_cupti_peak_device_bytes", "CUPTI's driver view: highest device memory.",
     MetricType::Gauge, [](const DeviceGauges& g) { return D(g.cupti_peak_bytes); }, true},
    {"vramscope_process_cupti_dropped_records_total",
     "Records CUPTI lost because its buffers were full.", MetricType::Counter,
     [](const DeviceGauges& g) { return D(g.cupti_dropped_records); }, true},
};
constexpr size_t kDeviceFamilyCount = std::size(kDeviceFamilies);

// Host sums of one (host, device).
struct HostSums {
  uint64_t requested = 0, allocated = 0, reserved = 0, processes = 0;
};

// host, pid, comm and the run's labels (renamed by RunLabelName; of two that rename alike, the
// first by name is kept: Prometheus refuses a sample with a label twice).
Labels ProcessLabels(const ProcessGaugeSnapshot& process) {
  Labels labels = {{"host", process.key.host()},
                   {"pid", absl::StrCat(process.key.pid())},
                   {"comm", process.comm}};
  std::set<std::string> taken;
  for (const auto& [name, value] : process.labels) {
    std::string renamed = RunLabelName(name);
    if (taken.insert(renamed).second) labels.push_back({std::move(renamed), value});
  }
  return labels;
}

// The processes to show, newest first among those with the same host and pid: a pid reused
// within the retention would otherwise give two series with the same labels.
std::vector<const ProcessGaugeSnapshot*> Shown(const MetricsSnapshot& snapshot) {
  std::vector<const ProcessGaugeSnapshot*> sorted;
  sorted.reserve(snapshot.processes.size());
  for (const ProcessGaugeSnapshot& process : snapshot.processes) sorted.push_back(&process);
  auto key = [](const ProcessGaugeSnapshot* p) {
    return std::make_tuple(std::cref(p->key.host()), p->key.pid(), ~p->key.start_time_ns());
  };
  std::sort(sorted.begin(), sorted.end(), [&](auto* a, auto* b) { return key(a) < key(b); });
  std::vector<const ProcessGaugeSnapshot*> shown;
  shown.reserve(sorted.size());
  for (const ProcessGaugeSnapshot* p : sorted) {
    if (!shown.empty() && shown.back()->key.host() == p->key.host() &&
        shown.back()->key.pid() == p->key.pid()) {
      continue;
    }
    shown.push_back(p);
  }
  return shown;
}

// The exposition, written into a Sink: FamilySink builds prometheus-cpp's MetricFamily objects,
// TextSink the text format directly. Both see the same families, samples and label order.
// A Sink has Family(name, help, type); Prepared Prepare(const Labels&) for a process's labels;
// Sample(const Prepared&, const std::string* device, double); Sample(const Labels&, double);
// Histogram(bounds, cumulative counts, count, sum).
template <typename Sink>
void EmitProcesses(const MetricsSnapshot& snapshot, Sink& sink) {
  const std::vector<const ProcessGaugeSnapshot*> shown = Shown(snapshot);
  std::vector<typename Sink::Prepared> prepared;
  prepared.reserve(shown.size());
  for (const ProcessGaugeSnapshot* process : shown) {
    prepared.push_back(sink.Prepare(ProcessLabels(*process)));
  }
  std::vector<std::string> devices;
  for (const DeviceFamily& f : kDeviceFamilies) {
    sink.Family(f.name, f.help, f.type);
    for (size_t i = 0; i < shown.size(); ++i) {
      for (const DeviceGauges& g : shown[i]->devices) {
        if (f.cupti && !g.has_cupti) continue;
        const std::string device = absl::StrCat(g.device);
        sink.Sample(prepared[i], &device, f.value(g));
      }
    }
  }
  sink.Family("vramscope_process_finished",
              "1 once the process exited (shown for --metrics-retention).", MetricType::Gauge);
  for (size_t i = 0; i < shown.size(); ++i) {
    sink.Sample(prepared[i], nullptr, shown[i]->finished ? 1 : 0);
  }
}

template <typename Sink>
void EmitHosts(const MetricsSnapshot& snapshot, Sink& sink) {
  std::map<std::pair<std::string, uint32_t>, HostSums> hosts;
  for (const ProcessGaugeSnapshot* process : Shown(snapshot)) {
    if (process->finished) continue;
    for (const DeviceGauges& g : process->devices) {
      HostSums& sums = hosts[{process->key.host(), g.device}];
      sums.requested += g.requested;
      sums.allocated += g.allocated;
      sums.reserved += g.reserved;
      ++sums.processes;
    }
  }
  const std::pair<const char*, uint64_t HostSums::*> host_families[] = {
      {"vramscope_host_requested_bytes", &HostSums::requested},
      {"vramscope_host_allocated_bytes", &HostSums::allocated},
      {"vramscope_host_reserved_bytes", &HostSums::reserved},
      {"vramscope_host_processes", &HostSums::processes},
  };
  for (const auto& [name, field] : host_families) {
    sink.Family(name, "Sum over the host's live traced processes on the device.",
                MetricType::Gauge);
    for (const auto& [where, sums] : hosts) {
      sink.Sample(Labels{{"host", where.first}, {"device", absl::StrCat(where.second)}},
                  D(sums.*field));
    }
  }
}

template <typename Sink>
void EmitHealth(const MetricsSnapshot& snapshot, Sink& sink) {
  const struct {
    const char* name;
    const char* help;
    MetricType type;
    uint64_t value;
  } health[] = {
      {"vramscope_collector_events_ingested_total", "Events in the batches stored.",
       MetricType::Counter, snapshot.events_stored},
      {"vramscope_collector_batches_ingested_total", "Batches stored.", MetricType::Counter,
       snapshot.batches_stored},
      {"vramscope_collector_batches_duplicate_total", "Resent batches acknowledged again.",
       MetricType::Counter, snapshot.batches_duplicate},
      {"vramscope_collector_batches_refused_total", "Invalid batches refused.", MetricType::Counter,
       snapshot.batches_refused},
      {"vramscope_collector_stored_bytes", "Bytes the process logs occupy.", MetricType::Gauge,
       snapshot.disk_bytes},
  };
  for (const auto& h : health) {
    sink.Family(h.name, h.help, h.type);
    sink.Sample(Labels{}, D(h.value));
  }
  sink.Family("vramscope_collector_processes", "Processes the collector tracks, by state.",
              MetricType::Gauge);
  sink.Sample(Labels{{"state", "live"}}, D(snapshot.processes_live));
  sink.Sample(Labels{{"state", "finished"}}, D(snapshot.processes_finished));
  sink.Family("vramscope_collector_ingest_lag_seconds",
              "When a batch was stored minus the wall-clock time of its latest event.",
              MetricType::Histogram);
  std::vector<uint64_t> cumulative;
  uint64_t total = 0;
  for (uint64_t count : snapshot.lag_buckets) cumulative.push_back(total += count);
  sink.Histogram(kIngestLagBounds, cumulative, total, snapshot.lag_sum_seconds);
}

template <typename Sink>
void Emit(const MetricsSnapshot& snapshot, Sink& sink) {
  EmitProcesses(snapshot, sink);
  EmitHosts(snapshot, sink);
  EmitHealth(snapshot, sink);
}

class FamilySink {
 public:
  using Prepared = Labels;
  explicit FamilySink(std::vector<MetricFamily>* out) : out_(out) {}
  void Family(const char* name, const char* help, MetricType type) {
    MetricFamily& family = out_->emplace_back();
    family.name = name;
    family.help = help;
    family.type = type;
  }
  Prepared Prepare(Labels labels) { return labels; }
  void Sample(const Prepared& labels, const std::string* device, double value) {
    Labels all = labels;
    if (device != nullptr) all.push_back({"device", *device});
    Sample(all, value);
  }
  void Sample(const Labels& labels, double value) {
    ClientMetric& metric = out_->back().metric.emplace_back();
    metric.label = labels;
    (out_->back().type == MetricType::Counter ? metric.counter.value : metric.gauge.value) = value;
  }
  void Histogram(const std::array<double, kIngestLagBounds.size()>& bounds,
                 const std::vector<uint64_t>& cumulative, uint64_t count, double sum) {
    ClientMetric& metric = out_->back().metric.emplace_back();
    for (size_t i = 0; i < cumulative.size(); ++i) {
      ClientMetric::Bucket& bucket = metric.histogram.bucket.emplace_back();
      bucket.cumulative_count = cumulative[i];
      bucket.upper_bound = i < bounds.size() ? bounds[i] : std::numeric_limits<double>::infinity();
    }
    metric.histogram.sample_count = count;
    metric.histogram.sample_sum = sum;
  }

 private:
  std::vector<MetricFamily>* out_;
};

// The text format (0.0.4), written straight into one string: byte for byte what prometheus-cpp's
// TextSerializer writes for FamilySink's families (tests/collector/metrics_test.cc checks it),
// at a fifth of the CPU: no ClientMetric per sample, a process's labels escaped once, not once
// per sample, and no ostream.
class TextSink {
 public:
  using Prepared = std::string;  // `name="value",...` of a process, escaped
  explicit TextSink(std::string* out) : out_(out) {}
  void Family(const char* name, const char* help, MetricType type) {
    name_ = name;
    absl::StrAppend(out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", TypeName(type), "\n");
  }
  Prepared Prepare(const Labels& labels) {
    std::string text;
    for (const ClientMetric::Label& label : labels) AppendLabel(&text, label.name, label.value);
    return text;
  }
  void Sample(const Prepared& labels, const std::string* device, double value) {
    out_->append(name_);
    out_->push_back('{');
    out_->append(labels);
    if (device != nullptr) AppendLabel(out_, "device", *device);
    out_->back() = '}';  // the last label's ','
    out_->push_back(' ');
    AppendValue(value);
  }
  void Sample(const Labels& labels, double value) {
    if (labels.empty()) {
      absl::StrAppend(out_, name_, " ");
      AppendValue(value);
      return;
    }
    Sample(Prepare(labels), nullptr, value);
  }
  void Histogram(const std::array<double, kIngestLagBounds.size()>& bounds,
                 const std::vector<uint64_t>& cumulative, uint64_t count, double sum) {
    absl::StrAppend(out_, name_, "_count ");
    AppendValue(D(count));
    absl::StrAppend(out_, name_, "_sum ");
    AppendValue(sum);
    for (size_t i = 0; i < cumulative.size(); ++i) {
      absl::StrAppend(out_, name_, "_bucket{le=\"");
      if (i < bounds.size()) {
        AppendNumber(bounds[i]);
      } else {
        out_->append("+Inf");
      }
      out_->append("\"} ");
      AppendValue(D(cumulative[i]));
    }
  }

 private:
  static const char* TypeName(MetricType type) {
    switch (type) {
      case MetricType::Counter:
        return "counter";
      case MetricType::Gauge:
        return "gauge";
      case MetricType::Histogram:
        return "histogram";
      default:
        return "untyped";
    }
  }
  // name="value", with the value escaped as the text format wants (\\, \", \n).
  static void AppendLabel(std::string* out, absl::string_view name, absl::string_view value) {
    out->append(name.data(), name.size());
    out->append("=\"");
    for (char c : value) {
      if (c == '\\' || c == '"') {
        out->push_back('\\');
        out->push_back(c);
      } else if (c == '\n') {
        out->append("\\n");
      } else {
        out->push_back(c);
      }
    }
    out->append("\",");
  }
  // As an ostream with precision 16 writes it (TextSerializer), integers the fast way.
  void AppendNumber(double value) {
    if (std::isnan(value)) {
      out_->append("Nan");
    } else if (std::isinf(value)) {
      out_->append(value < 0 ? "-Inf" : "+Inf");
    } else if (value == std::floor(value) && std::fabs(value) < 1e15) {
      absl::StrAppend(out_, static_cast<int64_t>(value));
    } else {
      char buffer[32];
      const int n = std::snprintf(buffer, sizeof(buffer), "%.16g", value);
      out_->append(buffer, static_cast<size_t>(n));
    }
  }
  void AppendValue(double value) {
    AppendNumber(value);
    out_->push_back('\n');
  }

  std::string* out_;
  const char* name_ = "";
};

uint64_t RealtimeNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

std::string RunLabelName(absl::string_view name) {
  std::string out = absl::StrCat("label_", name);
  for (size_t i = 6; i < out.size(); ++i) {
    const char c = out[i];
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) out[i] = '_';
  }
  return out;
}

std::vector<MetricFamily> BuildFamilies(const MetricsSnapshot& snapshot) {
  std::vector<MetricFamily> families;
  families.reserve(kDeviceFamilyCount + 16);
  FamilySink sink(&families);
  Emit(snapshot, sink);
  return families;
}

std::string RenderText(const MetricsSnapshot& snapshot) {
  std::string text;
  // About 160 bytes a sample, a dozen samples a process.
  text.reserve(4096 + snapshot.processes.size() * 2048);
  TextSink sink(&text);
  Emit(snapshot, sink);
  return text;
}

CollectorMetrics::CollectorMetrics(const Collector* collector, MetricsOptions options)
    : collector_(collector), options_(std::move(options)) {}

std::vector<MetricFamily> CollectorMetrics::Collect() const { return BuildFamilies(Snapshot()); }

MetricsSnapshot CollectorMetrics::Snapshot() const {
  const uint64_t now = options_.now_ns ? options_.now_ns() : RealtimeNs();
  const int64_t retention = absl::ToInt64Nanoseconds(options_.retention);
  const uint64_t since =
      retention <= 0 ? now : (now > static_cast<uint64_t>(retention) ? now - retention : 0);
  return collector_->Metrics(since);
}

std::string CollectorMetrics::Render() const { return RenderText(Snapshot()); }

}  // namespace vramscope::collector
