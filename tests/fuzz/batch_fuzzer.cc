// libFuzzer target: what the collector does with one raw Ingest message from the network, as the
// service does it (collector/service.cc): CheckIngestMessage decides (store, refuse the batch
// alone, or malformed), then Collector::Ingest stores or Collector::Refuse consumes its sequence.
//
// Input: the bytes of one Ingest message (seeds: serialized batches, tests/fuzz/make_seeds.cc).
// Calls: CheckIngestMessage (protobuf's parse, and the service's decoder), ValidateBatch,
// Collector::Open (a fresh temporary data directory), Ingest or Refuse, GetReport, ListProcesses,
// Snapshot; Collector::Open again over the directory. Contracts, beyond "no crash, no sanitizer
// finding":
//   - the decoder (CheckIngestMessage with an IngestScratch) gives protobuf's verdict and, for a
//     batch to store, the same report;
//   - the verdict's reason is valid UTF-8 (it travels in IngestAck.reject_reason); a batch to
//     store passes ValidateBatch; a refused batch with a usable key has its sequence consumed
//     (acknowledged, and the reopened collector continues after it);
//   - an accepted batch is acknowledged with its own sequence (a probe with 0), a second copy is
//     a duplicate, and the next sequence is accepted too;
//   - what was accepted re-serializes: a collector reopened over the directory loads every stored
//     batch without a warning or error and reports exactly what the first one reported;
//   - a refused batch leaves nothing behind: errors are InvalidArgument, FailedPrecondition or
//     ResourceExhausted, and a reopened collector knows no process.
#include <absl/strings/string_view.h>
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/util/message_differencer.h>
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "tests/fuzz/fuzz_check.h"
#include "vramscope/collector/batch_check.h"
#include "vramscope/collector/collector.h"
#include "vramscope/log.h"
#include "vramscope/utf8.h"

namespace vramscope::collector {
namespace {

CollectorOptions CollectorIn(const std::string& dir) {
  CollectorOptions options;
  options.data_dir = dir;
  return options;
}

std::string Reports(const Collector& collector) {
  std::string all;
  const v1::ListProcessesResponse listed = collector.ListProcesses(true);
  for (const v1::ProcessSummary& summary : listed.processes()) {
    all += summary.ShortDebugString() + "\n";
    absl::StatusOr<v1::Report> report = collector.GetReport(summary.process());
    FUZZ_CHECK(report.ok(), "a listed process has no report: " + report.status().ToString());
    all += report->ShortDebugString() + "\n";
  }
  return all;
}

// A refused batch: its sequence is consumed where the key can be filed, and that survives a
// restart; nothing is stored where it cannot.
void CheckRefusal(const IngestMessage& message) {
  FUZZ_CHECK(!message.reason.empty(), "a refusal without a reason");
  char pattern[] = "/tmp/vramscope-batch-fuzz.XXXXXX";
  if (mkdtemp(pattern) == nullptr) return;
  const std::string dir = pattern;
  uint64_t consumed = 0;
  {
    auto collector = Collector::Open(CollectorIn(dir));
    FUZZ_CHECK(collector.ok(), collector.status().ToString());
    absl::StatusOr<uint64_t> acked = (*collector)->Refuse(message);
    if (acked.ok()) consumed = *acked;
    FUZZ_CHECK(message.key_usable || consumed == 0, "a refused key that cannot be filed was");
  }
  {
    auto reopened = Collector::Open(CollectorIn(dir));
    FUZZ_CHECK(reopened.ok(), reopened.status().ToString());
    if (message.key_usable) {
      FUZZ_CHECK((*reopened)->StoredSequence(message.process) == consumed,
                 "the refused sequence is not consumed after a restart");
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// The service's decoder (allocations and frees decoded from the wire) against protobuf's parse:
// the same verdict, and for a batch to store the same report from the stats engine.
void CheckDecoder(absl::string_view wire, const IngestMessage& parsed) {
  google::protobuf::Arena arena;
  IngestScratch scratch;
  const IngestMessage decoded = CheckIngestMessage(wire, &arena, &scratch);
  FUZZ_CHECK(decoded.kind == parsed.kind && decoded.reason == parsed.reason &&
                 decoded.sequence == parsed.sequence && decoded.events == parsed.events,
             "the decoder's verdict differs from protobuf's: " + decoded.reason);
  if (parsed.kind != IngestMessage::Kind::kBatch) return;
  ProcessStatsEngine from_parsed;
  ProcessStatsEngine from_decoded;
  from_parsed.AddBatch(*parsed.batch);
  if (decoded.decoded != nullptr) {
    from_decoded.AddBatch(*decoded.batch, *decoded.decoded);
  } else {
    from_decoded.AddBatch(*decoded.batch);
  }
  FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equals(from_decoded.Report(),
                                                                from_parsed.Report()),
             "the decoded batch reports otherwise than the parsed one");
}

void Check(absl::string_view wire) {
  google::protobuf::Arena arena;
  const IngestMessage message = CheckIngestMessage(wire, &arena);
  FUZZ_CHECK(IsValidUtf8(message.reason), "the verdict's reason is not UTF-8");
  CheckDecoder(wire, message);
  if (message.kind == IngestMessage::Kind::kMalformed) return;  // the stream ends there
  if (message.kind == IngestMessage::Kind::kRejected) {
    CheckRefusal(message);
    return;
  }
  const v1::EventBatch& batch = *message.batch;
  FUZZ_CHECK(ValidateBatch(batch).ok(), "a batch to store fails ValidateBatch");

  char pattern[] = "/tmp/vramscope-batch-fuzz.XXXXXX";
  if (mkdtemp(pattern) == nullptr) return;
  const std::string dir = pattern;
  std::string reports;
  bool stored = false;
  {
    auto collector = Collector::Open(CollectorIn(dir));
    FUZZ_CHECK(collector.ok(), collector.status().ToString());
    absl::StatusOr<uint64_t> acked = (*collector)->Ingest(batch, wire);
    const bool probe =
        batch.sequence() == 0 && batch.events_size() == 0 && batch.counters_size() == 0;
    if (acked.ok()) {
      FUZZ_CHECK(*acked == (probe ? 0 : batch.sequence()),
                 "acknowledged " + std::to_string(*acked) + " for sequence " +
                     std::to_string(batch.sequence()));
      stored = !probe;
    } else {
      const absl::StatusCode code = acked.status().code();
      FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument ||
                     code == absl::StatusCode::kFailedPrecondition ||
                     code == absl::StatusCode::kResourceExhausted,
                 "unexpected refusal: " + acked.status().ToString());
    }
    if (stored) {
      absl::StatusOr<uint64_t> again = (*collector)->Ingest(batch, wire);
      FUZZ_CHECK(again.ok() && *again == batch.sequence() && (*collector)->batches_duplicate() == 1,
                 "a second copy is not a duplicate");
      // The same events once more, as the next batch (no wire: the collector serializes it).
      v1::EventBatch next = batch;
      next.set_sequence(batch.sequence() + 1);
      absl::StatusOr<uint64_t> next_acked = (*collector)->Ingest(next);
      FUZZ_CHECK(next_acked.ok() && *next_acked == next.sequence(),
                 "the next sequence is refused: " + next_acked.status().ToString());
    }
    reports = Reports(**collector);
    v1::WatchRequest all;
    (void)(*collector)->Snapshot(all);
  }
  {
    LoadReport load;
    auto reopened = Collector::Open(CollectorIn(dir), &load);
    FUZZ_CHECK(reopened.ok(), reopened.status().ToString());
    FUZZ_CHECK(load.errors.empty() && load.warnings.empty() && load.files_skipped == 0,
               "the stored log does not load cleanly: " +
                   (load.errors.empty()
                        ? (load.warnings.empty() ? std::string("skipped") : load.warnings[0])
                        : load.errors[0]));
    FUZZ_CHECK(load.batches == (stored ? 2u : 0u),
               "reloaded " + std::to_string(load.batches) + " batches");
    FUZZ_CHECK(Reports(**reopened) == reports, "the reopened collector reports otherwise:\n" +
                                                   Reports(**reopened) + "instead of\n" + reports);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace vramscope::collector

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Invalid UTF-8 in a proto string is refused, and logged each time: not news here.
  google::protobuf::SetLogHandler(nullptr);
  // Above kError: each Open would log a line per input.
  vramscope::SetMinLogLevel(static_cast<vramscope::LogLevel>(3));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  vramscope::collector::Check(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
