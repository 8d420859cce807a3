// The contracts the ring reader and decoder (lib/drain) keep on any bytes, as checks a fuzzer
// can call: the deterministic gtest fuzzer (ring_fuzz_test.cc) and the libFuzzer target
// (tests/fuzz/ring_fuzzer.cc). Each returns what is wrong, or an empty string.
//   - CheckDecoder: a record that decodes gives an event of the record's kind and time, whose
//     NVTX name and domain are the text given, and that survives the wire (see CheckWire);
//   - CheckRing, for a region that opens: once the writer is gone one Drain consumes exactly the
//     records between tail and head and finishes, ProcessStart first and a ProcessExit in the
//     events; no Drain reports more events from records than records it consumed, nor more invalid
//     records than records; draining in pieces of k records takes at most ceil(records / k) + 1
//     calls and gives the same events (drop events aside, whose total is the same); with the
//     writer alive the events are a prefix of those with the writer gone;
//   - CheckWire: the events, in an EventBatch, serialize to bytes the collector parses back
//     (proto3 strings must be UTF-8, or the collector refuses the whole batch);
//   - the wire encoder (event_encoder.h, what the agent sends) takes exactly the records the
//     decoder takes and writes exactly the bytes protobuf writes for the decoded event, and a
//     Drain into wire bytes parses to the events a Drain into messages gives.
#pragma once

#include <google/protobuf/repeated_ptr_field.h>
#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "drain/event_encoder.h"
#include "drain/ring_decoder.h"
#include "drain/ring_reader.h"
#include "vramscope/ring.h"
#include "vramscope/utf8.h"
#include "vramscope/v1/events.pb.h"

namespace vramscope::agent::testing {

#define VRAMSCOPE_RING_CHECK(condition, message)   \
  do {                                             \
    if (!(condition)) return std::string(message); \
  } while (0)

using RingEvents = google::protobuf::RepeatedPtrField<v1::Event>;

inline std::uint64_t DroppedTotal(const RingEvents& events) {
  std::uint64_t total = 0;
  for (const v1::Event& event : events) {
    if (event.has_drop()) total += event.drop().dropped_records();
  }
  return total;
}

// The events other than drops, serialized (drop events depend on where a Drain call ended).
inline std::vector<std::string> KeptEvents(const RingEvents& events) {
  std::vector<std::string> kept;
  for (const v1::Event& event : events) {
    if (!event.has_drop()) kept.push_back(event.SerializeAsString());
  }
  return kept;
}

inline std::string CheckWire(const RingEvents& events) {
  v1::EventBatch batch;
  batch.mutable_process()->set_pid(1);
  batch.set_sequence(1);
  *batch.mutable_events() = events;
  const std::string wire = batch.SerializeAsString();
  v1::EventBatch parsed;
  VRAMSCOPE_RING_CHECK(parsed.ParseFromString(wire),
                       "the events do not parse back from an EventBatch (invalid UTF-8?)");
  VRAMSCOPE_RING_CHECK(parsed.SerializeAsString() == wire, "the batch re-serializes otherwise");
  return "";
}

// Decodes the first records of `data`, each with the bytes after it as its NVTX text.
inline std::string CheckDecoder(const std::uint8_t* data, std::size_t size) {
  for (std::size_t at = 0; at + sizeof(vramscope_ring_record) <= size && at < 16 * 64; at += 64) {
    vramscope_ring_record record;
    std::memcpy(&record, data + at, sizeof(record));
    const std::size_t text_at = at + sizeof(record);
    const std::size_t text_size =
        std::min<std::size_t>(size - text_at, record.payload.nvtx_push.name_len +
                                                  std::size_t{record.payload.nvtx_push.domain_len});
    const std::string_view text(reinterpret_cast<const char*>(data) + text_at, text_size);
    v1::Event event;
    const bool decoded = DecodeRecord(record, text, &event).ok();
    EncodedEvents encoded;
    const bool encoded_ok = encoded.AddRecord(record, text).ok();
    const std::string kind = "record kind " + std::to_string(record.kind) + ": ";
    VRAMSCOPE_RING_CHECK(decoded == encoded_ok,
                         kind + (decoded ? "the encoder refuses a record the decoder takes"
                                         : "the encoder takes a record the decoder refuses"));
    if (!decoded) continue;
    VRAMSCOPE_RING_CHECK(encoded.size() == 1 && encoded.first_time_ns() == record.time_ns,
                         kind + "the encoder did not write one event of its time");
    v1::EventBatch one_event;
    *one_event.add_events() = event;
    VRAMSCOPE_RING_CHECK(encoded.bytes() == one_event.SerializeAsString(),
                         kind + "the encoder's bytes are not protobuf's for the decoded event");
    VRAMSCOPE_RING_CHECK(event.payload_case() != v1::Event::PAYLOAD_NOT_SET, kind + "no event");
    VRAMSCOPE_RING_CHECK(event.time_ns() == record.time_ns, kind + "another time");
    VRAMSCOPE_RING_CHECK(
        record.kind != VRAMSCOPE_RING_KIND_INVALID && record.kind != VRAMSCOPE_RING_KIND_TEXT &&
            record.kind != VRAMSCOPE_RING_KIND_SITE && record.kind != VRAMSCOPE_RING_KIND_MODULE &&
            record.kind < VRAMSCOPE_RING_KIND_LIMIT,
        kind + "decoded");
    VRAMSCOPE_RING_CHECK(!event.has_alloc() || v1::AllocationKind_IsValid(event.alloc().kind()),
                         kind + "allocation kind out of range");
    // The name and the domain are the text, each made valid UTF-8 (vramscope/utf8.h).
    const std::size_t name_len = record.payload.nvtx_push.name_len;
    VRAMSCOPE_RING_CHECK(!event.has_nvtx_push() ||
                             (name_len <= text.size() &&
                              event.nvtx_push().name() == ToValidUtf8(text.substr(0, name_len)) &&
                              event.nvtx_push().domain() == ToValidUtf8(text.substr(name_len))),
                         kind + "NVTX name and domain are not the text");
    RingEvents one;
    *one.Add() = event;
    if (std::string wire = CheckWire(one); !wire.empty()) return kind + wire;
  }
  return "";
}

inline RingReader::Options WriterAlive(bool alive) {
  RingReader::Options options;
  options.writer_alive = [alive](const RingInfo&) { return alive; };
  return options;
}

// A private copy of the region (Drain stores the tail into it): new[] gives 16-byte alignment
// and exactly `size` bytes, so ASan sees a read past the end.
class RingRegion {
 public:
  RingRegion(const std::uint8_t* data, std::size_t size) : bytes_(new std::uint8_t[size]) {
    std::memcpy(bytes_.get(), data, size);
  }
  void* data() { return bytes_.get(); }

 private:
  std::unique_ptr<std::uint8_t[]> bytes_;
};

inline std::string CheckDrainStats(const DrainStats& stats, std::uint64_t cursor_before,
                                   const RingReader& reader, int events_added,
                                   std::size_t max_records) {
  VRAMSCOPE_RING_CHECK(reader.cursor() - cursor_before == stats.records,
                       "the cursor moved by another count than records");
  VRAMSCOPE_RING_CHECK(stats.events == static_cast<std::uint64_t>(events_added),
                       "events miscounted");
  VRAMSCOPE_RING_CHECK(stats.invalid <= stats.records, "more invalid records than records");
  VRAMSCOPE_RING_CHECK(stats.dropped >= stats.invalid, "invalid records not counted as dropped");
  // An NVTX push is consumed with its TEXT records: at most that many past the limit.
  VRAMSCOPE_RING_CHECK(
      max_records == SIZE_MAX || stats.records <= max_records + VRAMSCOPE_RING_MAX_TEXT_RECORDS,
      "read " + std::to_string(stats.records) + " records, limit " + std::to_string(max_records));
  return "";
}

// Events made from records: all but ProcessStart, drops and one synthesised ProcessExit.
inline std::string CheckEventsFromRecords(const RingEvents& events, std::uint64_t records) {
  std::uint64_t from_records = 0;
  for (const v1::Event& event : events) {
    if (!event.has_process_start() && !event.has_drop()) ++from_records;
  }
  VRAMSCOPE_RING_CHECK(from_records <= records + 1, std::to_string(from_records) + " events from " +
                                                        std::to_string(records) + " records");
  return "";
}

inline std::string CheckRing(const std::uint8_t* data, std::size_t size) {
  RingRegion whole_region(data, size);
  auto whole = RingReader::OpenMemory(whole_region.data(), size, WriterAlive(false));
  if (!whole.ok()) return "";
  RingReader& reader = **whole;
  const std::uint64_t tail = reader.cursor();
  const std::uint64_t head = reader.head();
  VRAMSCOPE_RING_CHECK(head >= tail && head - tail <= reader.info().capacity,
                       "opened with bad indices");

  RingEvents all;
  auto stats = reader.Drain(&all);
  VRAMSCOPE_RING_CHECK(stats.ok(), "an opened ring failed to drain: " + stats.status().ToString());
  if (std::string s = CheckDrainStats(*stats, tail, reader, all.size(), SIZE_MAX); !s.empty()) {
    return s;
  }
  VRAMSCOPE_RING_CHECK(stats->finished, "a ring whose writer is gone did not finish in one Drain");
  VRAMSCOPE_RING_CHECK(
      stats->records == head - tail,
      "consumed " + std::to_string(stats->records) + " records of " + std::to_string(head - tail));
  VRAMSCOPE_RING_CHECK(all.size() > 0 && all[0].has_process_start(), "ProcessStart is not first");
  VRAMSCOPE_RING_CHECK(
      std::any_of(all.begin(), all.end(), [](const v1::Event& e) { return e.has_process_exit(); }),
      "finished without a ProcessExit");
  if (std::string s = CheckEventsFromRecords(all, stats->records); !s.empty()) return s;
  if (std::string s = CheckWire(all); !s.empty()) return s;
  (void)reader.Counters();
  auto again = reader.Drain(&all);
  VRAMSCOPE_RING_CHECK(again.ok() && again->finished && again->events == 0,
                       "a finished reader read more");

  // The same drain into wire bytes (what the agent sends) parses to the same events.
  RingRegion bytes_region(data, size);
  auto bytes_reader = RingReader::OpenMemory(bytes_region.data(), size, WriterAlive(false));
  VRAMSCOPE_RING_CHECK(bytes_reader.ok(), "the same region opened once, not twice");
  EncodedEvents encoded;
  auto bytes_stats = (*bytes_reader)->Drain(&encoded);
  VRAMSCOPE_RING_CHECK(bytes_stats.ok() && bytes_stats->records == stats->records &&
                           bytes_stats->events == stats->events &&
                           bytes_stats->dropped == stats->dropped &&
                           bytes_stats->invalid == stats->invalid && bytes_stats->finished,
                       "a drain into wire bytes counted otherwise");
  v1::EventBatch from_bytes;
  VRAMSCOPE_RING_CHECK(from_bytes.ParseFromString(encoded.bytes()),
                       "a drain's wire bytes do not parse as an EventBatch");
  VRAMSCOPE_RING_CHECK(from_bytes.events_size() == encoded.size() &&
                           from_bytes.events_size() == static_cast<int>(stats->events),
                       "a drain's wire bytes hold another number of events");
  for (int i = 0; i < from_bytes.events_size(); ++i) {
    VRAMSCOPE_RING_CHECK(
        google::protobuf::util::MessageDifferencer::Equals(from_bytes.events(i), all[i]),
        "event " + std::to_string(i) + " of the wire bytes differs from the message drain's");
  }

  // In pieces of 1..16 records (the header's first reserved byte picks the size).
  const std::size_t piece = 1 + data[offsetof(vramscope_ring_header, reserved1)] % 16;
  RingRegion pieces_region(data, size);
  auto pieces = RingReader::OpenMemory(pieces_region.data(), size, WriterAlive(false));
  VRAMSCOPE_RING_CHECK(pieces.ok(), "the same region opened once, not twice");
  RingEvents in_pieces;
  const std::uint64_t max_calls = (head - tail + piece - 1) / piece + 1;
  std::uint64_t records = 0;
  for (std::uint64_t calls = 0;; ++calls) {
    VRAMSCOPE_RING_CHECK(calls < max_calls, "not finished after " + std::to_string(calls) +
                                                " calls of " + std::to_string(piece) + " records");
    const std::uint64_t cursor = (*pieces)->cursor();
    const int before = in_pieces.size();
    auto step = (*pieces)->Drain(&in_pieces, piece);
    VRAMSCOPE_RING_CHECK(step.ok(), "a drain in pieces failed: " + step.status().ToString());
    if (std::string s = CheckDrainStats(*step, cursor, **pieces, in_pieces.size() - before, piece);
        !s.empty()) {
      return s;
    }
    records += step->records;
    if (step->finished) break;
  }
  VRAMSCOPE_RING_CHECK(records == stats->records, "pieces consumed another number of records");
  VRAMSCOPE_RING_CHECK(KeptEvents(in_pieces) == KeptEvents(all),
                       "draining in pieces of " + std::to_string(piece) + " gave other events");
  VRAMSCOPE_RING_CHECK(DroppedTotal(in_pieces) == DroppedTotal(all),
                       "draining in pieces dropped another number of records");

  // A live writer: the reader waits at the first unpublished slot instead of skipping it.
  RingRegion alive_region(data, size);
  auto alive = RingReader::OpenMemory(alive_region.data(), size, WriterAlive(true));
  VRAMSCOPE_RING_CHECK(alive.ok(), "the same region opened once, not twice");
  RingEvents live;
  auto live_stats = (*alive)->Drain(&live);
  VRAMSCOPE_RING_CHECK(live_stats.ok(),
                       "a drain with a live writer failed: " + live_stats.status().ToString());
  VRAMSCOPE_RING_CHECK(!live_stats->finished, "finished while the writer lives");
  const std::vector<std::string> live_kept = KeptEvents(live);
  const std::vector<std::string> all_kept = KeptEvents(all);
  VRAMSCOPE_RING_CHECK(live_kept.size() <= all_kept.size() &&
                           std::equal(live_kept.begin(), live_kept.end(), all_kept.begin()),
                       "the events with a live writer are not a prefix of those without");
  return "";
}

#undef VRAMSCOPE_RING_CHECK

}  // namespace vramscope::agent::testing
