// libFuzzer target: the agent's spool files read back (agent/outbox.cc), as a restarted agent
// replays an earlier run's --spool-dir.
//
// Input: a file name, '\n', then the file's bytes (seeds: files an Outbox spooled,
// tests/fuzz/make_seeds.cc).
// Calls: ParseSpoolFile, EncodeSpoolFile, SpoolFileName; an Outbox over a directory holding the
// file (its replay), NextToSend.
// Contracts, beyond "no crash, no sanitizer finding":
//   - an accepted file's batch matches its name (sequence, process, event count) and encodes
//     again, under its canonical name, into a file that parses back to the same batch and
//     ring_end;
//   - the Outbox's replay takes exactly the files ParseSpoolFile accepts: an accepted file is
//     queued and sent as it is; a rejected one is counted, moved aside, and (its name being
//     valid) sent as a DropEvent in its sequence's place.
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/unknown_field_set.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "tests/fuzz/fuzz_check.h"
#include "vramscope/agent/outbox.h"
#include "vramscope/log.h"

namespace vramscope::agent {
namespace {

// True if the serialized batch holds exactly one event, a DropEvent. Its events are read without
// the rest: the process key comes from the file's name, whose host need not be UTF-8, and a
// proto3 parse of the whole batch refuses such a string (the collector refuses the batch too,
// and files it under the escaped name).
bool IsOneDropEvent(const std::string& batch) {
  google::protobuf::UnknownFieldSet fields;
  if (!fields.ParseFromString(batch)) return false;
  int events = 0;
  bool drop = false;
  for (int i = 0; i < fields.field_count(); ++i) {
    const google::protobuf::UnknownField& field = fields.field(i);
    if (field.number() != vramscope::v1::EventBatch::kEventsFieldNumber) continue;
    if (field.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) return false;
    vramscope::v1::Event event;
    if (!event.ParseFromString(field.length_delimited())) return false;
    ++events;
    drop = event.has_drop();
  }
  return events == 1 && drop;
}

// Runs an Outbox over a fresh directory holding the one file; checks the replay agrees with
// `parsed`.
void CheckReplay(std::string_view name, std::string_view bytes,
                 const absl::StatusOr<SpoolFile>& parsed) {
  char pattern[] = "/tmp/vramscope-spool-fuzz.XXXXXX";
  if (mkdtemp(pattern) == nullptr) return;
  const std::filesystem::path dir = pattern;
  {
    std::ofstream out(dir / std::string(name), std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  {
    OutboxOptions options;
    options.spool_dir = dir.string();
    Outbox outbox(options);
    const AgentCounters counters = outbox.counters();
    FUZZ_CHECK(outbox.spool_error().empty(), outbox.spool_error());
    if (parsed.ok()) {
      FUZZ_CHECK(counters.batches_replayed == 1 && counters.spool_files_rejected == 0,
                 "ParseSpoolFile accepts a file the replay does not take");
      auto sent = outbox.NextToSend(absl::ZeroDuration());
      FUZZ_CHECK(sent != nullptr, "a replayed batch is not sent");
      FUZZ_CHECK(sent->SerializeAsString() == parsed->batch.SerializeAsString(),
                 "the replay sends another batch than the file holds");
      FUZZ_CHECK(outbox.replayed(parsed->batch.process()).has_value(),
                 "the replayed process is not known");
      FUZZ_CHECK(outbox.replayed(parsed->batch.process())->ring_end == parsed->ring_end,
                 "the replay lost ring_end");
    } else if (parsed.status().code() == absl::StatusCode::kDataLoss) {
      // A valid name over damaged contents.
      FUZZ_CHECK(counters.batches_replayed == 0 && counters.spool_files_rejected == 1,
                 "the replay takes a file ParseSpoolFile rejects: " + parsed.status().ToString());
      FUZZ_CHECK(std::filesystem::exists(dir / (std::string(name) + ".corrupt")),
                 "a rejected file was not moved aside");
      auto sent = outbox.NextToSendBytes(absl::ZeroDuration());
      FUZZ_CHECK(sent != nullptr && IsOneDropEvent(*sent),
                 "a rejected file's sequence is not sent as a DropEvent");
    } else {
      FUZZ_CHECK(counters.batches_replayed == 0, "the replay takes a file with a bad name");
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace vramscope::agent

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Invalid UTF-8 in a proto string is refused, and logged each time: not news here.
  google::protobuf::SetLogHandler(nullptr);
  // Above kError: every rejected file would log a warning per input.
  vramscope::SetMinLogLevel(static_cast<vramscope::LogLevel>(3));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace vramscope::agent;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t newline = input.find('\n');
  if (newline == std::string_view::npos) return 0;
  const std::string_view name = input.substr(0, newline);
  const std::string_view bytes = input.substr(newline + 1);

  const absl::StatusOr<SpoolFile> parsed = ParseSpoolFile(
      absl::string_view(name.data(), name.size()), absl::string_view(bytes.data(), bytes.size()));
  if (parsed.ok()) {
    const vramscope::v1::EventBatch& batch = parsed->batch;
    FUZZ_CHECK(parsed->payload_bytes + 40 == bytes.size(), "payload length disagrees");
    const std::string canonical =
        SpoolFileName(batch.process(), batch.sequence(), batch.events_size());
    absl::StatusOr<std::string> encoded = EncodeSpoolFile(batch, parsed->ring_end);
    FUZZ_CHECK(encoded.ok(), "an accepted batch does not encode: " + encoded.status().ToString());
    absl::StatusOr<SpoolFile> again = ParseSpoolFile(canonical, *encoded);
    FUZZ_CHECK(again.ok(),
               "the re-encoded file " + canonical + " is rejected: " + again.status().ToString());
    FUZZ_CHECK(again->batch.SerializeAsString() == batch.SerializeAsString(),
               "the re-encoded file holds another batch");
    FUZZ_CHECK(again->ring_end == parsed->ring_end, "ring_end lost in the round trip");
    FUZZ_CHECK(batch.sequence() > 0 && batch.process().pid() > 0,
               "accepted a batch without a sequence or process");
  } else {
    FUZZ_CHECK(parsed.status().code() == absl::StatusCode::kDataLoss ||
                   parsed.status().code() == absl::StatusCode::kInvalidArgument,
               "unexpected error: " + parsed.status().ToString());
  }

  // The replay, for names a directory can hold.
  if (name.empty() || name.size() > 200 || name.find('/') != std::string_view::npos ||
      name.find('\0') != std::string_view::npos || name == "." || name == ".." ||
      name.substr(name.size() > 6 ? name.size() - 6 : 0) != ".batch") {
    return 0;
  }
  CheckReplay(name, bytes, parsed);
  return 0;
}
