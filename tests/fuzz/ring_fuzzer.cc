// libFuzzer target: the ring reader and decoder (lib/drain) over a hostile ring region, with the
// contracts of tests/ring/ring_fuzz_check.h (shared with the deterministic ring_fuzz_test).
//
// Input: a ring image (header, then records), as a file under VRAMSCOPE_RING_DIR holds it; the
// seeds are rings the ring writer wrote (make_seeds.cc).
// Calls: DecodeRecord on the input's first records; RingReader::OpenMemory, Drain (whole, in
// pieces, and with the writer taken for alive) and Counters.
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_check.h"
#include "tests/ring/ring_fuzz_check.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Invalid UTF-8 in a proto string is refused, and logged each time: not news here.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string decoder = vramscope::agent::testing::CheckDecoder(data, size);
  FUZZ_CHECK(decoder.empty(), decoder);
  const std::string ring = vramscope::agent::testing::CheckRing(data, size);
  FUZZ_CHECK(ring.empty(), ring);
  return 0;
}
