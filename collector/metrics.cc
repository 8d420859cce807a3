#include "vramscope/collector/metrics.h"

#include <absl/strings/str_cat.h>
#include <time.h>

#include <algorithm>
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

ClientMetric Metric(const Labels& labels, MetricType type, double value) {
  ClientMetric metric;
  metric.label = labels;
  if (type == MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  return metric;
}

MetricFamily Family(const char* name, const char* help, MetricType type) {
  MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  return family;
}

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

struct HostSums {
  uint64_t requested = 0, allocated = 0, reserved = 0, processes = 0;
};

void AddProcessFamilies(const MetricsSnapshot& snapshot, std::vector<MetricFamily>* out) {
  const size_t first = out->size();
  for (const DeviceFamily& f : kDeviceFamilies) out->push_back(Family(f.name, f.help, f.type));
  MetricFamily finished =
      Family("vramscope_process_finished",
             "1 once the process exited (shown for --metrics-retention).", MetricType::Gauge);
  std::map<std::pair<std::string, uint32_t>, HostSums> hosts;
  const std::vector<const ProcessGaugeSnapshot*> shown = Shown(snapshot);
  for (size_t i = 0; i < kDeviceFamilyCount; ++i) {
    (*out)[first + i].metric.reserve(kDeviceFamilies[i].cupti ? 0 : shown.size());
  }
  for (const ProcessGaugeSnapshot* process : shown) {
    Labels labels = ProcessLabels(*process);
    finished.metric.push_back(Metric(labels, MetricType::Gauge, process->finished ? 1 : 0));
    labels.push_back({"device", ""});
    for (const DeviceGauges& g : process->devices) {
      labels.back().value = absl::StrCat(g.device);
      for (size_t i = 0; i < kDeviceFamilyCount; ++i) {
        const DeviceFamily& f = kDeviceFamilies[i];
        if (f.cupti && !g.has_cupti) continue;
        (*out)[first + i].metric.push_back(Metric(labels, f.type, f.value(g)));
      }
      if (process->finished) continue;
      HostSums& sums = hosts[{process->key.host(), g.device}];
      sums.requested += g.requested;
      sums.allocated += g.allocated;
      sums.reserved += g.reserved;
      ++sums.processes;
    }
  }
  out->push_back(std::move(finished));
  const std::pair<const char*, uint64_t HostSums::*> host_families[] = {
      {"vramscope_host_requested_bytes", &HostSums::requested},
      {"vramscope_host_allocated_bytes", &HostSums::allocated},
      {"vramscope_host_reserved_bytes", &HostSums::reserved},
      {"vramscope_host_processes", &HostSums::processes},
  };
  for (const auto& [name, field] : host_families) {
    MetricFamily family =
        Family(name, "Sum over the host's live traced processes on the device.", MetricType::Gauge);
    for (const auto& [where, sums] : hosts) {
      const Labels labels = {{"host", where.first}, {"device", absl::StrCat(where.second)}};
      family.metric.push_back(Metric(labels, MetricType::Gauge, D(sums.*field)));
    }
    out->push_back(std::move(family));
  }
}

MetricFamily LagHistogram(const MetricsSnapshot& snapshot) {
  MetricFamily family =
      Family("vramscope_collector_ingest_lag_seconds",
             "When a batch was stored minus the wall-clock time of its latest event.",
             MetricType::Histogram);
  ClientMetric metric;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < snapshot.lag_buckets.size(); ++i) {
    cumulative += snapshot.lag_buckets[i];
    ClientMetric::Bucket& bucket = metric.histogram.bucket.emplace_back();
    bucket.cumulative_count = cumulative;
    bucket.upper_bound =
        i < kIngestLagBounds.size() ? kIngestLagBounds[i] : std::numeric_limits<double>::infinity();
  }
  metric.histogram.sample_count = cumulative;
  metric.histogram.sample_sum = snapshot.lag_sum_seconds;
  family.metric.push_back(std::move(metric));
  return family;
}

void AddHealthFamilies(const MetricsSnapshot& snapshot, std::vector<MetricFamily>* out) {
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
    MetricFamily family = Family(h.name, h.help, h.type);
    family.metric.push_back(Metric({}, h.type, D(h.value)));
    out->push_back(std::move(family));
  }
  MetricFamily processes = Family("vramscope_collector_processes",
                                  "Processes the collector tracks, by state.", MetricType::Gauge);
  processes.metric.push_back(
      Metric({{"state", "live"}}, MetricType::Gauge, D(snapshot.processes_live)));
  processes.metric.push_back(
      Metric({{"state", "finished"}}, MetricType::Gauge, D(snapshot.processes_finished)));
  out->push_back(std::move(processes));
  out->push_back(LagHistogram(snapshot));
}

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
  AddProcessFamilies(snapshot, &families);
  AddHealthFamilies(snapshot, &families);
  return families;
}

CollectorMetrics::CollectorMetrics(const Collector* collector, MetricsOptions options)
    : collector_(collector), options_(std::move(options)) {}

std::vector<MetricFamily> CollectorMetrics::Collect() const {
  const uint64_t now = options_.now_ns ? options_.now_ns() : RealtimeNs();
  const int64_t retention = absl::ToInt64Nanoseconds(options_.retention);
  const uint64_t since =
      retention <= 0 ? now : (now > static_cast<uint64_t>(retention) ? now - retention : 0);
  return BuildFamilies(collector_->Metrics(since));
}

}  // namespace vramscope::collector
