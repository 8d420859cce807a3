// Comparing reports: see compare.h.
#include "check/compare.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <map>
#include <utility>

namespace vramscope::cli {
namespace {

constexpr std::size_t kMaxProcessLabel = 100;

std::string ProcessLabel(const v1::Report& report) {
  if (report.command_line().empty()) return absl::StrCat("pid ", report.process().pid());
  std::string label = absl::StrJoin(report.command_line(), " ");
  if (label.size() > kMaxProcessLabel) label = label.substr(0, kMaxProcessLabel - 3) + "...";
  return label;
}

std::string RangeName(const v1::NvtxRangeStats& range) {
  return range.domain().empty() ? range.name() : absl::StrCat(range.domain(), ":", range.name());
}

class Comparer {
 public:
  Comparer(const CompareOptions& options, Comparison* out) : options_(options), out_(out) {}

  // Either side may be null (process only in the other file).
  void Process(const v1::Report* base, const v1::Report* now) {
    const std::string label = ProcessLabel(now != nullptr ? *now : *base);
    std::map<std::uint32_t, std::pair<const v1::DeviceReport*, const v1::DeviceReport*>> devices;
    if (base != nullptr) {
      for (const auto& d : base->devices()) devices[d.device().ordinal()].first = &d;
    }
    if (now != nullptr) {
      for (const auto& d : now->devices()) devices[d.device().ordinal()].second = &d;
    }
    for (const auto& [ordinal, pair] : devices) Device(label, ordinal, pair.first, pair.second);
  }

 private:
  void Device(const std::string& label, std::uint32_t ordinal, const v1::DeviceReport* base,
              const v1::DeviceReport* now) {
    const std::string device = absl::StrCat("cuda:", ordinal);
    auto add = [&](const char* metric, std::uint64_t (v1::DeviceReport::*get)() const) {
      Figure f;
      f.process = label;
      f.name = absl::StrCat(device, " ", metric);
      if (base != nullptr) f.baseline = (base->*get)();
      if (now != nullptr) f.now = (now->*get)();
      Judge(&f, /*new_can_regress=*/true);
      out_->figures.push_back(std::move(f));
    };
    add("peak requested", &v1::DeviceReport::peak_requested_bytes);
    add("peak allocated", &v1::DeviceReport::peak_allocated_bytes);
    add("peak reserved", &v1::DeviceReport::peak_reserved_bytes);

    // Ranges in the report's order, then those only in the baseline in the baseline's order.
    std::vector<std::pair<const v1::NvtxRangeStats*, const v1::NvtxRangeStats*>> ranges;
    std::map<std::pair<std::string, std::string>, std::size_t> index;
    auto collect = [&](const v1::DeviceReport* d, bool is_base) {
      if (d == nullptr) return;
      for (const auto& r : d->nvtx_ranges()) {
        auto [it, inserted] = index.try_emplace({r.domain(), r.name()}, ranges.size());
        if (inserted) ranges.emplace_back(nullptr, nullptr);
        (is_base ? ranges[it->second].first : ranges[it->second].second) = &r;
      }
    };
    collect(now, false);
    collect(base, true);
    for (const auto& [b, n] : ranges) {
      Figure f;
      f.process = label;
      f.nvtx_range = true;
      f.name =
          absl::StrCat(device, " range ", RangeName(n != nullptr ? *n : *b), " peak allocated");
      if (b != nullptr) f.baseline = b->peak_allocated_bytes();
      if (n != nullptr) f.now = n->peak_allocated_bytes();
      Judge(&f, /*new_can_regress=*/false);
      out_->figures.push_back(std::move(f));
    }
  }

  void Judge(Figure* f, bool new_can_regress) const {
    if (!f->now) {
      f->verdict = Verdict::kRemoved;
    } else if (!f->baseline) {
      f->verdict = new_can_regress && *f->now > 0 && *f->now >= options_.new_floor_bytes
                       ? Verdict::kRegression
                       : Verdict::kAdded;
    } else if (*f->baseline == 0) {
      f->verdict = *f->now >= options_.new_floor_bytes && *f->now > 0 ? Verdict::kRegression
                                                                      : Verdict::kWithin;
    } else {
      // Grew (or shrank) by more than tolerance% of the baseline; exactly at it is within.
      const double limit = static_cast<double>(*f->baseline) * options_.tolerance_percent / 100.0;
      const double delta = f->DeltaBytes();
      f->verdict = delta > limit    ? Verdict::kRegression
                   : -delta > limit ? Verdict::kImprovement
                                    : Verdict::kWithin;
    }
  }

  const CompareOptions& options_;
  Comparison* out_;
};

std::string CommandKey(const v1::Report& report) {
  return absl::StrJoin(report.command_line(), std::string(1, '\0'));
}

}  // namespace

double Figure::DeltaBytes() const {
  if (!baseline || !now) return 0;
  return *now >= *baseline ? static_cast<double>(*now - *baseline)
                           : -static_cast<double>(*baseline - *now);
}

std::optional<double> Figure::DeltaPercent() const {
  if (!baseline || !now || *baseline == 0) return std::nullopt;
  return DeltaBytes() * 100.0 / static_cast<double>(*baseline);
}

int Comparison::Count(Verdict verdict) const {
  return static_cast<int>(std::count_if(figures.begin(), figures.end(),
                                        [&](const Figure& f) { return f.verdict == verdict; }));
}

Comparison Compare(const std::vector<v1::Report>& baseline, const std::vector<v1::Report>& now,
                   const CompareOptions& options) {
  Comparison out;
  Comparer comparer(options, &out);
  if (baseline.size() == 1 && now.size() == 1) {
    comparer.Process(&baseline[0], &now[0]);
    return out;
  }
  // k-th occurrence of a command line matches the k-th occurrence on the other side.
  std::map<std::string, std::vector<const v1::Report*>> unmatched_base;
  for (const v1::Report& r : baseline) unmatched_base[CommandKey(r)].push_back(&r);
  std::map<std::string, std::size_t> taken;
  std::vector<bool> base_matched(baseline.size(), false);
  for (const v1::Report& r : now) {
    const std::string key = CommandKey(r);
    auto it = unmatched_base.find(key);
    std::size_t& k = taken[key];
    const v1::Report* base = nullptr;
    if (it != unmatched_base.end() && k < it->second.size()) base = it->second[k++];
    if (base != nullptr) base_matched[static_cast<std::size_t>(base - baseline.data())] = true;
    comparer.Process(base, &r);
  }
  for (std::size_t i = 0; i < baseline.size(); ++i) {
    if (!base_matched[i]) comparer.Process(&baseline[i], nullptr);
  }
  return out;
}

}  // namespace vramscope::cli
