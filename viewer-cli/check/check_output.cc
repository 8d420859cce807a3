// Output forms of `vramscope check`: see check_output.h.
#include "check/check_output.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/size.h"
#include "vramscope/markup.h"

namespace vramscope::cli {
namespace {

std::string Bytes(const std::optional<std::uint64_t>& value) {
  return value ? FormatBytes(*value) : "-";
}

std::string SignedBytes(double delta) {
  const std::uint64_t magnitude = static_cast<std::uint64_t>(std::fabs(delta));
  return absl::StrCat(delta < 0 ? "-" : "+", FormatBytes(magnitude));
}

std::string Percent(const Figure& f) {
  if (!f.baseline || !f.now) return "";
  const std::optional<double> pct = f.DeltaPercent();
  if (!pct) return *f.now == 0 ? "0.00%" : "new";
  return absl::StrFormat("%+.2f%%", *pct);
}

std::string Tolerance(const CompareOptions& options) {
  return absl::StrFormat("%g%%", options.tolerance_percent);
}

const char* VerdictWord(Verdict verdict) {
  switch (verdict) {
    case Verdict::kRegression:
      return "REGRESSION";
    case Verdict::kImprovement:
      return "improvement";
    case Verdict::kAdded:
      return "added";
    case Verdict::kRemoved:
      return "removed";
    case Verdict::kWithin:
      return "ok";
  }
  return "?";
}

// "grew 20.00% (1.00 GiB -> 1.20 GiB, +209715200 bytes), tolerance 5%"
std::string Describe(const Figure& f, const CompareOptions& options) {
  if (!f.now) {
    return absl::StrCat("not in the report (baseline ", Bytes(f.baseline), ", ", *f.baseline,
                        " bytes)");
  }
  if (!f.baseline || *f.baseline == 0) {
    const std::string what = absl::StrCat(f.baseline ? "grew from 0 to " : "new: ", Bytes(f.now),
                                          " (", *f.now, " bytes)");
    if (f.nvtx_range && !f.baseline) return absl::StrCat(what, "; new NVTX ranges are not checked");
    return absl::StrCat(what, f.verdict == Verdict::kRegression ? ", at or above" : ", below",
                        " --new-floor ", FormatBytes(options.new_floor_bytes));
  }
  const double delta = f.DeltaBytes();
  return absl::StrFormat("%s %.2f%% (%s -> %s, %s%.0f bytes), tolerance %s",
                         delta >= 0 ? "grew" : "shrank", std::fabs(*f.DeltaPercent()),
                         Bytes(f.baseline), Bytes(f.now), delta >= 0 ? "+" : "-", std::fabs(delta),
                         Tolerance(options));
}

// GitHub workflow command escaping (actions/toolkit: escapeData, escapeProperty).
std::string GitHubData(std::string_view text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '%':
        out += "%25";
        break;
      case '\r':
        out += "%0D";
        break;
      case '\n':
        out += "%0A";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string GitHubProperty(std::string_view text) {
  std::string out;
  for (const char c : GitHubData(text)) {
    if (c == ':') {
      out += "%3A";
    } else if (c == ',') {
      out += "%2C";
    } else {
      out += c;
    }
  }
  return out;
}

bool MultiProcess(const Comparison& comparison) {
  for (const Figure& f : comparison.figures) {
    if (f.process != comparison.figures.front().process) return true;
  }
  return false;
}

std::string FigureTitle(const Figure& f, bool with_process) {
  return with_process ? absl::StrCat(f.process, ": ", f.name) : f.name;
}

}  // namespace

std::string FormatCheckTable(const Comparison& comparison, const CompareOptions& options) {
  const int regressions = comparison.Count(Verdict::kRegression);
  const int within = comparison.Count(Verdict::kWithin);
  const int total = static_cast<int>(comparison.figures.size());
  std::string out;
  if (total == 0) {
    return "no figures to compare: neither file has a process that used device memory\n";
  }
  const bool multi = MultiProcess(comparison);

  struct Row {
    const Figure* figure;
    std::string cells[5];
  };
  std::vector<Row> rows;
  for (const Figure& f : comparison.figures) {
    if (f.verdict == Verdict::kWithin) continue;
    rows.push_back({&f,
                    {f.name, Bytes(f.baseline), Bytes(f.now),
                     f.baseline && f.now ? SignedBytes(f.DeltaBytes()) : "", Percent(f)}});
  }
  if (!rows.empty()) {
    const std::string header[5] = {"figure", "baseline", "now", "delta", "delta %"};
    std::size_t width[5];
    for (int c = 0; c < 5; ++c) {
      width[c] = header[c].size();
      for (const Row& row : rows) width[c] = std::max(width[c], row.cells[c].size());
    }
    auto line = [&](const std::string(&cells)[5], const char* verdict) {
      std::string text = absl::StrFormat("  %-*s", static_cast<int>(width[0]), cells[0]);
      for (int c = 1; c < 5; ++c) {
        absl::StrAppendFormat(&text, "  %*s", static_cast<int>(width[c]), cells[c]);
      }
      if (verdict[0] != '\0') absl::StrAppend(&text, "  ", verdict);
      return absl::StrCat(text, "\n");
    };
    out += line(header, "");
    const std::string* process = nullptr;
    for (const Row& row : rows) {
      if (multi && (process == nullptr || *process != row.figure->process)) {
        process = &row.figure->process;
        absl::StrAppend(&out, "  process: ", *process, "\n");
      }
      out += line(row.cells, VerdictWord(row.figure->verdict));
    }
    out += "\n";
  }
  absl::StrAppend(&out, within, " of ", total, " figures within ", Tolerance(options),
                  " of the baseline");
  if (int n = comparison.Count(Verdict::kImprovement)) absl::StrAppend(&out, ", ", n, " improved");
  if (int n = comparison.Count(Verdict::kAdded)) absl::StrAppend(&out, ", ", n, " added");
  if (int n = comparison.Count(Verdict::kRemoved)) absl::StrAppend(&out, ", ", n, " removed");
  if (regressions > 0) {
    absl::StrAppend(&out, "; FAIL: ", regressions, " regression", regressions == 1 ? "" : "s",
                    "\n");
  } else {
    absl::StrAppend(&out, "; OK: no regression\n");
  }
  return out;
}

std::string FormatJUnit(const Comparison& comparison, const CompareOptions& options) {
  const int total = static_cast<int>(comparison.figures.size());
  const int failures = comparison.Count(Verdict::kRegression);
  const int skipped = comparison.Count(Verdict::kRemoved);
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  absl::StrAppendFormat(&out,
                        "<testsuites name=\"vramscope check\" tests=\"%d\" failures=\"%d\">\n",
                        total, failures);
  absl::StrAppendFormat(&out,
                        "  <testsuite name=\"vramscope check\" tests=\"%d\" failures=\"%d\" "
                        "errors=\"0\" skipped=\"%d\">\n",
                        total, failures, skipped);
  for (const Figure& f : comparison.figures) {
    absl::StrAppend(&out, "    <testcase classname=\"", MarkupEscape(f.process), "\" name=\"",
                    MarkupEscape(f.name), "\"");
    const std::string text = MarkupEscape(Describe(f, options));
    switch (f.verdict) {
      case Verdict::kRegression:
        absl::StrAppend(&out, ">\n      <failure type=\"regression\" message=\"", text, "\">", text,
                        "</failure>\n    </testcase>\n");
        break;
      case Verdict::kRemoved:
        absl::StrAppend(&out, ">\n      <skipped message=\"", text, "\"/>\n    </testcase>\n");
        break;
      default:
        absl::StrAppend(&out, ">\n      <system-out>", VerdictWord(f.verdict), ": ", text,
                        "</system-out>\n    </testcase>\n");
    }
  }
  out += "  </testsuite>\n</testsuites>\n";
  return out;
}

std::string FormatGitHubAnnotations(const Comparison& comparison, const CompareOptions& options) {
  const bool multi = MultiProcess(comparison);
  std::string out;
  for (const Figure& f : comparison.figures) {
    const char* command = f.verdict == Verdict::kRegression    ? "error"
                          : f.verdict == Verdict::kImprovement ? "notice"
                                                               : nullptr;
    if (command == nullptr) continue;
    absl::StrAppend(&out, "::", command,
                    " title=", GitHubProperty(absl::StrCat("vramscope: ", FigureTitle(f, multi))),
                    "::", GitHubData(Describe(f, options)), "\n");
  }
  return out;
}

}  // namespace vramscope::cli
