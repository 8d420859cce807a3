// libFuzzer target: the PyTorch snapshot reader of `vramscope replay` (lib/pickle's ReadPickle and
// viewer-cli/replay/snapshot_loader.h): hostile pickles must be refused, never executed or crash.
//
// Input: pickle bytes (seeds: a snapshot `vramscope export` wrote, protocol 2, and one Python's
// pickle wrote from the head of a bundled trace, protocol 4).
// Calls: ReadPickle; LoadSnapshotBytes (every device, and the default); ReplayTrace when small.
// Contracts: a document's values only refer to values that exist; a loaded trace has one op per
// alloc or free_requested it counted; errors name the input; ReadPickle and LoadSnapshotBytes
// agree on whether the bytes are a pickle; a replay's pool peak covers the trace's peak live.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "replay/replay.h"
#include "replay/snapshot_loader.h"
#include "tests/fuzz/fuzz_check.h"
#include "vramscope/pickle/pickle_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace vramscope;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<pickle::PickleDocument> doc = pickle::ReadPickle(bytes);
  if (doc.ok()) {
    for (std::size_t i = 0; i < doc->size(); ++i) {
      for (pickle::ValueId id : doc->at(static_cast<pickle::ValueId>(i)).items) {
        FUZZ_CHECK(id < doc->size(), "a value refers past the document");
      }
    }
  }
  for (int device = -1; device < 3; ++device) {
    const std::optional<std::uint32_t> which =
        device < 0 ? std::nullopt : std::optional<std::uint32_t>(device);
    absl::StatusOr<cli::LoadedTrace> trace = cli::LoadSnapshotBytes("fuzz", bytes, which);
    if (!trace.ok()) {
      FUZZ_CHECK(trace.status().message().substr(0, 6) == "fuzz: ",
                 std::string(trace.status().message()));
      continue;
    }
    FUZZ_CHECK(doc.ok(), "a snapshot loaded from bytes ReadPickle refused");
    FUZZ_CHECK(trace->ops.size() == trace->alloc_events + trace->free_events, "op count");
    if (trace->ops.size() < 2048) {
      absl::StatusOr<cli::ReplayResult> result = cli::ReplayTrace(*trace, "");
      FUZZ_CHECK(result.ok(), std::string(result.status().message()));
      FUZZ_CHECK(
          result->stats.peak_requested_bytes >= trace->peak_live_bytes || result->failed_allocs > 0,
          "the pool's peak is below the trace's peak live");
    }
  }
  return 0;
}
