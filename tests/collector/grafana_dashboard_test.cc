// examples/grafana's dashboard asks only for metrics the collector exposes: every PromQL
// expression in it (panel targets, template queries) is read from the JSON, and each vramscope_
// metric name it uses must be a family of the exposition (a histogram's _bucket, _sum and _count
// count as their family). The queries themselves are run against a real Prometheus in
// tests/pipeline/prometheus_test.cc.
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <string>
#include <vector>

#include <google/protobuf/struct.pb.h>

#include "tests/collector/test_util.h"
#include "vramscope/collector/metrics.h"

namespace vramscope::collector {
namespace {

using google::protobuf::Value;

// Every string under a key named `expr`, `definition` or `query`, depth first.
void Expressions(const Value& value, const std::string& key, std::vector<std::string>* out) {
  if (value.has_struct_value()) {
    for (const auto& [name, field] : value.struct_value().fields()) Expressions(field, name, out);
  } else if (value.has_list_value()) {
    for (const Value& item : value.list_value().values()) Expressions(item, key, out);
  } else if (value.kind_case() == Value::kStringValue &&
             (key == "expr" || key == "definition" || key == "query")) {
    out->push_back(value.string_value());
  }
}

std::set<std::string> ExposedNames() {
  std::set<std::string> names;
  for (const prometheus::MetricFamily& family : BuildFamilies(MetricsSnapshot{})) {
    names.insert(family.name);
    if (family.type == prometheus::MetricType::Histogram) {
      for (const char* suffix : {"_bucket", "_sum", "_count"}) names.insert(family.name + suffix);
    }
  }
  return names;
}

TEST(GrafanaDashboardTest, EveryMetricItQueriesIsExposed) {
  const std::string path = testing::Env("VRAMSCOPE_DASHBOARD");
  ASSERT_FALSE(path.empty()) << "VRAMSCOPE_DASHBOARD is not set (meson sets it)";
  Value dashboard;
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(testing::ReadFile(path), &dashboard);
  ASSERT_TRUE(parsed.ok()) << parsed.ToString();
  std::vector<std::string> expressions;
  Expressions(dashboard, "", &expressions);
  const std::set<std::string> exposed = ExposedNames();
  std::set<std::string> used;
  const std::regex name(R"([a-zA-Z_:][a-zA-Z0-9_:]*)");
  int queries = 0;
  for (const std::string& expression : expressions) {
    if (expression == "prometheus") continue;  // the datasource variable's plugin type
    ++queries;
    int in_this = 0;
    for (auto it = std::sregex_iterator(expression.begin(), expression.end(), name);
         it != std::sregex_iterator(); ++it) {
      const std::string word = it->str();
      if (word.rfind("vramscope_", 0) != 0) continue;
      ++in_this;
      used.insert(word);
      EXPECT_TRUE(exposed.count(word)) << word << " in " << expression << " is not exposed";
    }
    EXPECT_GT(in_this, 0) << "no vramscope metric in: " << expression;
  }
  EXPECT_GE(queries, 20);
  // The dashboard covers the figures the issue names.
  for (const char* must :
       {"vramscope_process_peak_reserved_bytes", "vramscope_process_external_fragmentation",
        "vramscope_process_ooms_total", "vramscope_host_reserved_bytes",
        "vramscope_collector_ingest_lag_seconds_bucket"}) {
    EXPECT_TRUE(used.count(must)) << must;
  }
}

}  // namespace
}  // namespace vramscope::collector
