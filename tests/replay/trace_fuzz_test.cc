// A deterministic fuzzer for everything that reads trace bytes: windows of the real bundled traces,
// mutated (bit flips, truncation, random bytes, huge and malformed numbers, duplicated, dropped and
// swapped lines, line-ending changes), must each load and replay, or fail with a clean
// `FILE:LINE: message`; never crash or hang. The compressed path gets the same treatment on the
// gzip bytes. Seeds are fixed so a failure reproduces; the failing input is printed.
#include <absl/strings/escaping.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_replace.h>
#include <absl/strings/str_split.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "replay/trace_loader.h"
#include "trace_fuzz_check.h"
#include "trace_test_util.h"

namespace vramscope::cli {
namespace {

using testing::CheckTraceInput;

constexpr int kCases = 3000;
constexpr int kGzipCases = 300;
constexpr std::size_t kWindowLines = 120;

class Corpus {
 public:
  Corpus() {
    for (const char* name : {"gpt2_train", "resnet50_train", "mlp_dynamic_train"}) {
      std::string text = testing::ReadBundledTrace(name);
      std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
      if (!lines.empty()) lines.erase(lines.begin());  // the header
      traces_.push_back(std::move(lines));
    }
  }

  // A header and `kWindowLines` consecutive lines of a bundled trace from a random place, without
  // the frees whose alloc came before the window, so the unmutated window is a valid trace.
  std::vector<std::string> Window(std::mt19937_64& rng) const {
    const std::vector<std::string>& lines = traces_[rng() % traces_.size()];
    std::vector<std::string> window = {std::string(kTraceHeader)};
    if (lines.empty()) return window;
    std::size_t start = rng() % lines.size();
    std::vector<std::string> allocated;
    for (std::size_t i = start; i < lines.size() && window.size() <= kWindowLines; ++i) {
      std::vector<std::string> fields = absl::StrSplit(lines[i], ',');
      if (fields.size() < 2) continue;
      if (fields[0] == "alloc") allocated.push_back(fields[1]);
      if (fields[0] == "free_requested" &&
          std::find(allocated.begin(), allocated.end(), fields[1]) == allocated.end()) {
        continue;
      }
      window.push_back(lines[i]);
    }
    return window;
  }

  bool empty() const { return traces_.empty() || traces_[0].empty(); }

 private:
  std::vector<std::vector<std::string>> traces_;
};

const std::vector<std::string> kNastyNumbers = {"0",
                                                "1",
                                                "18446744073709551615",
                                                "18446744073709551616",
                                                "281474976710656",
                                                "281474976710657",
                                                "-1",
                                                "",
                                                "1e9",
                                                "99999999999999999999999999",
                                                "0x10",
                                                " 512",
                                                "512 ",
                                                "+512",
                                                "5,12",
                                                "\xff\xfe"};

const std::vector<std::string> kActions = {
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "foo", "ALLOC",
    "",      "alloc\r"};

std::string Mutate(std::vector<std::string> lines, std::mt19937_64& rng) {
  auto pick = [&rng](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
  const int line_mutations = 1 + static_cast<int>(rng() % 3);
  for (int m = 0; m < line_mutations && lines.size() > 1; ++m) {
    const std::size_t at = 1 + pick(lines.size() - 1);  // usually not the header
    switch (rng() % 7) {
      case 0: {  // a number column replaced by something nasty
        std::vector<std::string> fields = absl::StrSplit(lines[at], ',');
        if (fields.size() >= 5) fields[1 + pick(4)] = kNastyNumbers[pick(kNastyNumbers.size())];
        lines[at] = absl::StrJoin(fields, ",");
        break;
      }
      case 1: {  // another action
        std::vector<std::string> fields = absl::StrSplit(lines[at], ',');
        fields[0] = kActions[pick(kActions.size())];
        lines[at] = absl::StrJoin(fields, ",");
        break;
      }
      case 2:  // duplicated: a double alloc or a double free
        lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(at), lines[at]);
        break;
      case 3:  // dropped: a free of an unknown address, or a leak
        lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(at));
        break;
      case 4:  // swapped: a free before its alloc
        std::swap(lines[at], lines[1 + pick(lines.size() - 1)]);
        break;
      case 5:  // CRLF, or an empty line
        if (rng() % 2 != 0) {
          lines[at] += '\r';
        } else {
          lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(at), "");
        }
        break;
      default:  // the header damaged
        lines[0] = rng() % 2 != 0 ? lines[0].substr(0, pick(lines[0].size())) : "x" + lines[0];
        break;
    }
  }
  std::string bytes = absl::StrJoin(lines, "\n");
  if (rng() % 2 != 0) bytes += '\n';
  const int byte_mutations = static_cast<int>(rng() % 3);
  for (int m = 0; m < byte_mutations && !bytes.empty(); ++m) {
    switch (rng() % 4) {
      case 0:  // bit flips
        for (int flips = 1 + static_cast<int>(rng() % 8); flips > 0; --flips) {
          bytes[pick(bytes.size())] ^= static_cast<char>(1u << (rng() % 8));
        }
        break;
      case 1:  // truncation
        bytes.resize(pick(bytes.size() + 1));
        break;
      case 2: {  // random bytes inserted, NULs and newlines included
        std::string noise(1 + pick(16), '\0');
        for (char& c : noise) c = static_cast<char>(rng());
        bytes.insert(pick(bytes.size() + 1), noise);
        break;
      }
      default:  // every LF made CRLF
        bytes = absl::StrReplaceAll(bytes, {{"\n", "\r\n"}});
        break;
    }
  }
  return bytes;
}

TEST(TraceFuzz, UnmutatedWindowsLoad) {
  Corpus corpus;
  ASSERT_FALSE(corpus.empty());
  std::mt19937_64 rng(7);
  for (int i = 0; i < 50; ++i) {
    std::string bytes = absl::StrJoin(corpus.Window(rng), "\n");
    absl::StatusOr<LoadedTrace> trace = LoadTraceBytes(testing::kFuzzName, bytes);
    ASSERT_TRUE(trace.ok()) << trace.status();
    EXPECT_EQ(CheckTraceInput(bytes, 1 + i, /*replay=*/true), "");
  }
}

TEST(TraceFuzz, MutatedTextNeverCrashesAndFailsCleanly) {
  Corpus corpus;
  ASSERT_FALSE(corpus.empty());
  int loaded = 0;
  for (int i = 0; i < kCases; ++i) {
    std::mt19937_64 rng(1000 + i);  // one seed per case: a failure names it
    const std::string bytes = Mutate(corpus.Window(rng), rng);
    const std::size_t chunk = 1 + rng() % 300;
    absl::StatusOr<LoadedTrace> trace = LoadTraceBytes(testing::kFuzzName, bytes);
    loaded += trace.ok() ? 1 : 0;
    const std::string problem = CheckTraceInput(bytes, chunk, /*replay=*/i % 4 == 0);
    ASSERT_EQ(problem, "") << "seed " << 1000 + i << ", input:\n" << absl::CHexEscape(bytes);
  }
  // Both outcomes must be exercised, or the mutations are too weak or too strong.
  EXPECT_GT(loaded, kCases / 20);
  EXPECT_LT(loaded, kCases - kCases / 20);
}

TEST(TraceFuzz, RandomBytes) {
  for (int i = 0; i < 500; ++i) {
    std::mt19937_64 rng(50000 + i);
    std::string bytes(rng() % 400, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() % 4 == 0 ? ",\n0123"[rng() % 6] : rng());
    if (i % 2 == 0) bytes = std::string(kTraceHeader) + "\n" + bytes;
    ASSERT_EQ(CheckTraceInput(bytes, 1 + rng() % 64, /*replay=*/true), "")
        << "seed " << 50000 + i << ", input:\n"
        << absl::CHexEscape(bytes);
  }
}

TEST(TraceFuzz, MutatedGzipFailsWithThePath) {
  Corpus corpus;
  ASSERT_FALSE(corpus.empty());
  for (int i = 0; i < kGzipCases; ++i) {
    std::mt19937_64 rng(90000 + i);
    std::string gz = testing::Gzip(absl::StrJoin(corpus.Window(rng), "\n") + "\n");
    switch (rng() % 3) {
      case 0:
        for (int flips = 1 + static_cast<int>(rng() % 4); flips > 0; --flips) {
          gz[rng() % gz.size()] ^= static_cast<char>(1u << (rng() % 8));
        }
        break;
      case 1:
        gz.resize(rng() % gz.size());
        break;
      default:
        gz.insert(rng() % gz.size(), std::string(1 + rng() % 8, static_cast<char>(rng())));
        break;
    }
    testing::TempFile file("fuzz.csv.gz", gz);
    absl::StatusOr<LoadedTrace> trace = LoadTraceFile(file.path());
    if (!trace.ok()) {
      const std::string message(trace.status().message());
      ASSERT_EQ(message.rfind(file.path() + ":", 0), 0u) << "seed " << 90000 + i << ": " << message;
    }
  }
}

}  // namespace
}  // namespace vramscope::cli
