// libFuzzer target: the trace reader of `vramscope replay` (viewer-cli/replay): the same contract
// as tests/replay/trace_fuzz_test.cc (tests/replay/trace_fuzz_check.h), driven by coverage.
//
// Input: trace bytes, CSV or gzip (seeds: the heads of the bundled traces, make_seeds.sh).
// Calls: LoadTraceBytes; TraceParser::Feed/Finish with a TraceLoader, in chunks; ReplayTrace.
// Contracts: success or a located `NAME:LINE: message` error whose line exists; the same answer
// whole and in chunks; a replayed pool's peak equals the trace's peak live bytes.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tests/replay/trace_fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // The first byte picks the chunk size for the incremental parse.
  const std::size_t chunk = size > 0 ? 1 + data[0] % 64 : 1;
  const std::string problem =
      vramscope::cli::testing::CheckTraceInput(bytes, chunk, /*replay=*/size < 4096);
  if (!problem.empty()) {
    std::fprintf(stderr, "trace contract violated: %s\n", problem.c_str());
    std::abort();
  }
  return 0;
}
