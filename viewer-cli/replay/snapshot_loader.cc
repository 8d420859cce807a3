#include "replay/snapshot_loader.h"

#include <absl/container/flat_hash_set.h>
#include <absl/strings/str_format.h>

#include <fstream>
#include <iterator>

#include "vramscope/pickle/pickle_reader.h"

namespace vramscope::cli {
namespace {

using pickle::Kind;
using pickle::PickleDocument;
using pickle::Value;

// PyTorch's trace entries have about ten keys. A larger dict is refused before any lookup, so a
// hostile file cannot make every entry one shared dict of a million keys (quadratic lookups).
constexpr std::size_t kMaxEntryKeys = 64;

bool SmallDict(const Value& v) {
  return v.kind == Kind::kDict && v.items.size() <= 2 * kMaxEntryKeys;
}

std::optional<TraceAction> ParseAction(std::string_view text, bool* skip) {
  *skip = false;
  if (text == "alloc") return TraceAction::kAlloc;
  if (text == "free_requested") return TraceAction::kFreeRequested;
  if (text == "free_completed") return TraceAction::kFreeCompleted;
  if (text == "segment_alloc") return TraceAction::kSegmentAlloc;
  if (text == "segment_free") return TraceAction::kSegmentFree;
  if (text == "oom" || text == "snapshot" || text == "segment_map" || text == "segment_unmap") {
    *skip = true;
    return TraceAction::kSegmentAlloc;
  }
  return std::nullopt;
}

// entry[key] as a non-negative integer.
absl::StatusOr<std::uint64_t> Number(const PickleDocument& doc, const Value& entry,
                                     std::string_view key, bool required) {
  const Value* v = doc.Find(entry, key);
  if (v == nullptr) {
    if (!required) return 0;
    return absl::InvalidArgumentError(absl::StrFormat("no '%s'", key));
  }
  if (v->kind != Kind::kInt || v->integer < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("'%s' is not a non-negative int", key));
  }
  return static_cast<std::uint64_t>(v->integer);
}

absl::StatusOr<TraceEvent> ToEvent(const PickleDocument& doc, const Value& entry, bool* skip) {
  if (!SmallDict(entry)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("not a dict of at most %d keys", kMaxEntryKeys));
  }
  const Value* action = doc.Find(entry, "action");
  if (action == nullptr || action->kind != Kind::kString) {
    return absl::InvalidArgumentError("no 'action' string");
  }
  std::optional<TraceAction> parsed = ParseAction(action->text, skip);
  if (!parsed) {
    return absl::InvalidArgumentError(
        absl::StrFormat("unknown action '%s'", std::string(action->text.substr(0, 64))));
  }
  TraceEvent event;
  event.action = *parsed;
  if (*skip) return event;
  absl::StatusOr<std::uint64_t> addr = Number(doc, entry, "addr", true);
  if (!addr.ok()) return addr.status();
  absl::StatusOr<std::uint64_t> size = Number(doc, entry, "size", true);
  if (!size.ok()) return size.status();
  absl::StatusOr<std::uint64_t> stream = Number(doc, entry, "stream", false);
  if (!stream.ok()) return stream.status();
  absl::StatusOr<std::uint64_t> time = Number(doc, entry, "time_us", false);
  if (!time.ok()) return time.status();
  event.addr = *addr;
  event.size = *size;
  event.stream = *stream;
  event.time_us = *time;
  const bool replayed = *parsed == TraceAction::kAlloc || *parsed == TraceAction::kFreeRequested;
  if (replayed && (event.size == 0 || event.size > kMaxTraceSize)) {
    return absl::InvalidArgumentError(absl::StrFormat("size %d is outside 1 .. 2^48", event.size));
  }
  return event;
}

// The device trace to load: `wanted`, else the first holding an alloc.
absl::StatusOr<std::uint32_t> PickDevice(const PickleDocument& doc, const Value& traces,
                                         std::optional<std::uint32_t> wanted) {
  if (wanted) {
    if (*wanted >= traces.items.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--device %d: the snapshot has %d device traces", *wanted, traces.items.size()));
    }
    return *wanted;
  }
  // A file's entries are each looked at once; more looks mean device traces sharing one list
  // through the memo, which only a crafted file does (and could make this loop quadratic).
  std::size_t looked = 0;
  for (std::size_t d = 0; d < traces.items.size(); ++d) {
    const Value& trace = doc.at(traces.items[d]);
    if (trace.kind != Kind::kList) continue;
    for (pickle::ValueId id : trace.items) {
      if (++looked > doc.size()) {
        return absl::InvalidArgumentError("device traces share their entries: not a snapshot");
      }
      if (!SmallDict(doc.at(id))) continue;
      const Value* action = doc.Find(doc.at(id), "action");
      if (action != nullptr && action->kind == Kind::kString && action->text == "alloc") {
        return static_cast<std::uint32_t>(d);
      }
    }
  }
  return absl::InvalidArgumentError("no device trace holds an alloc");
}

}  // namespace

bool LooksLikePickle(std::string_view head) {
  return head.size() >= 2 && static_cast<std::uint8_t>(head[0]) == 0x80 &&
         static_cast<std::uint8_t>(head[1]) >= 2 && static_cast<std::uint8_t>(head[1]) <= 5;
}

absl::StatusOr<LoadedTrace> LoadSnapshotBytes(std::string_view name, std::string_view bytes,
                                              std::optional<std::uint32_t> device,
                                              SnapshotLoadInfo* info) {
  auto fail = [name](std::string_view where, const absl::Status& status) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s%s", name, where, status.message()));
  };
  absl::StatusOr<PickleDocument> doc = pickle::ReadPickle(bytes);
  if (!doc.ok()) return fail("not a readable snapshot pickle: ", doc.status());
  const Value* traces = doc->Find(doc->root(), "device_traces");
  if (traces == nullptr || traces->kind != Kind::kList) {
    return fail("", absl::InvalidArgumentError(
                        "no 'device_traces' list: not a memory snapshot with history (record it "
                        "with torch.cuda.memory._record_memory_history())"));
  }
  absl::StatusOr<std::uint32_t> chosen = PickDevice(*doc, *traces, device);
  if (!chosen.ok()) return fail("", chosen.status());
  const Value& trace = doc->at(traces->items[*chosen]);
  if (trace.kind != Kind::kList) {
    return fail("", absl::InvalidArgumentError(
                        absl::StrFormat("device_traces[%d] is not a list", *chosen)));
  }
  TraceLoader loader;
  absl::flat_hash_set<std::uint64_t> allocated;  // addresses allocated within the trace
  std::uint64_t skipped = 0, early_frees = 0;
  for (std::size_t i = 0; i < trace.items.size(); ++i) {
    const std::string where = absl::StrFormat("device_traces[%d][%d]: ", *chosen, i);
    bool skip = false;
    absl::StatusOr<TraceEvent> event = ToEvent(*doc, doc->at(trace.items[i]), &skip);
    if (!event.ok()) return fail(where, event.status());
    if (skip) {
      ++skipped;
      continue;
    }
    if (event->action == TraceAction::kAlloc) allocated.insert(event->addr);
    const bool is_free = event->action == TraceAction::kFreeRequested ||
                         event->action == TraceAction::kFreeCompleted;
    if (is_free && !allocated.contains(event->addr)) {
      early_frees += event->action == TraceAction::kFreeRequested;
      ++skipped;
      continue;
    }
    if (absl::Status s = loader.Add(*event, i + 1); !s.ok()) return fail(where, s);
  }
  LoadedTrace loaded = loader.Finish(std::string(name), trace.items.size());
  loaded.skipped_events += skipped;
  if (info != nullptr) {
    *info =
        SnapshotLoadInfo{*chosen, static_cast<std::uint32_t>(traces->items.size()), early_frees};
  }
  return loaded;
}

absl::StatusOr<LoadedTrace> LoadAnyTrace(const std::string& path,
                                         std::optional<std::uint32_t> device,
                                         const LoadProgress& progress, SnapshotLoadInfo* info) {
  std::ifstream in(path, std::ios::binary);
  char head[2] = {0, 0};
  in.read(head, 2);
  if (!in || !LooksLikePickle(std::string_view(head, 2))) {
    if (device) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: --device applies to snapshot pickles only", path));
    }
    return LoadTraceFile(path, progress);
  }
  in.seekg(0);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::InvalidArgumentError(absl::StrFormat("%s: cannot read", path));
  return LoadSnapshotBytes(path, bytes, device, info);
}

}  // namespace vramscope::cli
