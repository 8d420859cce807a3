// libFuzzer entry point for the trace reader: the same contract as trace_fuzz_test.cc, driven by
// coverage. Built only when the compiler supports -fsanitize=fuzzer (clang; not g++):
//   CXX=clang++ meson setup build-fuzz && ninja -C build-fuzz tests/replay/trace_fuzzer
//   build-fuzz/tests/replay/trace_fuzzer -max_len=4096 CORPUS_DIR
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "trace_fuzz_check.h"

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
