#include "drain/ring_labels.h"

#include <string.h>

#include <string_view>

#include "vramscope/ring/labels.h"

namespace vramscope::agent {
namespace {

void AddLabel(void* context, std::string_view key, std::string_view value) {
  (*static_cast<std::map<std::string, std::string>*>(context))[std::string(key)] =
      std::string(value);
}

}  // namespace

LabelsRead ReadLabelsRecords(const vramscope_ring_record* records, std::uint64_t capacity,
                             std::uint64_t position, std::uint64_t available,
                             std::map<std::string, std::string>* labels, std::uint64_t* consumed) {
  *consumed = 1;
  vramscope_ring_record first;
  memcpy(&first, &records[position & (capacity - 1)], sizeof(first));
  const std::uint32_t length = first.aux;
  const std::uint32_t chunks = first.flags;
  const std::uint32_t expected =
      (length + VRAMSCOPE_RING_TEXT_RECORD_BYTES - 1) / VRAMSCOPE_RING_TEXT_RECORD_BYTES;
  // The group was claimed by one CAS: chunks beyond the head seen mean a corrupt record.
  if (first.sub != 0 || length == 0 || length > VRAMSCOPE_RING_MAX_LABELS_BYTES ||
      chunks != expected || chunks > available) {
    return LabelsRead::kInvalid;
  }
  std::string text;
  for (std::uint32_t k = 0; k < chunks; ++k) {
    const vramscope_ring_record& slot = records[(position + k) & (capacity - 1)];
    if (__atomic_load_n(&slot.seq, __ATOMIC_ACQUIRE) !=
        static_cast<std::uint32_t>(position + k + 1)) {
      return LabelsRead::kIncomplete;
    }
    vramscope_ring_record chunk;
    memcpy(&chunk, &slot, sizeof(chunk));
    if (chunk.kind != VRAMSCOPE_RING_KIND_LABELS || chunk.sub != k || chunk.aux != length) {
      *consumed = k + 1;
      return LabelsRead::kInvalid;
    }
    text.append(chunk.payload.text,
                std::min<std::size_t>(length - text.size(), VRAMSCOPE_RING_TEXT_RECORD_BYTES));
  }
  *consumed = chunks;
  std::map<std::string, std::string> parsed;
  if (!interposer::ParseLabels(text, &AddLabel, &parsed, nullptr, 0)) return LabelsRead::kInvalid;
  *labels = std::move(parsed);
  return LabelsRead::kTaken;
}

}  // namespace vramscope::agent
