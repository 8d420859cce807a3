#include "drain/site_assembler.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <string.h>

#include "vramscope/utf8.h"

namespace vramscope::agent {
namespace {

absl::Status Invalid(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("ring ", what));
}

}  // namespace

absl::Status SiteAssembler::AddModule(const vramscope_ring_record& record) {
  const std::uint32_t id = record.aux;
  const std::uint32_t chunks = record.flags;
  const std::uint32_t index = record.sub;
  if (id == 0 || chunks == 0 || chunks > VRAMSCOPE_RING_MAX_MODULE_CHUNKS || index >= chunks) {
    return Invalid("MODULE record: id, chunk index or chunk count out of range");
  }
  auto it = modules_.find(id);
  if (it == modules_.end()) {
    if (modules_.size() >= kMaxModules) return Invalid("MODULE record: too many modules");
    it = modules_.try_emplace(id).first;
    it->second.chunks = chunks;
    it->second.have.assign(chunks, false);
    it->second.path.assign(VRAMSCOPE_RING_MODULE_INLINE_PATH +
                               (chunks - 1) * std::size_t{VRAMSCOPE_RING_TEXT_RECORD_BYTES},
                           '\0');
  }
  Module& module = it->second;
  if (module.chunks != chunks || module.complete || module.have[index]) {
    return Invalid("MODULE record: inconsistent with its earlier chunks");
  }
  module.have[index] = true;
  ++module.seen;
  if (index == 0) {
    module.load_bias = record.payload.module.load_bias;
    module.start = record.payload.module.start;
    module.end = record.payload.module.end;
    memcpy(module.path.data(), record.payload.module.path, VRAMSCOPE_RING_MODULE_INLINE_PATH);
  } else {
    memcpy(module.path.data() + VRAMSCOPE_RING_MODULE_INLINE_PATH +
               (index - 1) * std::size_t{VRAMSCOPE_RING_TEXT_RECORD_BYTES},
           record.payload.text, VRAMSCOPE_RING_TEXT_RECORD_BYTES);
  }
  if (module.seen == module.chunks) {
    module.complete = true;
    // Paths go into proto strings: bytes that are not UTF-8 are escaped (vramscope/utf8.h), so
    // the frame names the file exactly, even where it cannot be symbolised.
    module.path = ToValidUtf8(std::string_view(module.path.c_str()));
    module.have.clear();
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> SiteAssembler::AddSite(const vramscope_ring_record& record, v1::Event* event) {
  const vramscope_ring_site_payload& p = record.payload.site;
  const std::uint32_t frames = record.aux;
  const std::uint32_t chunks = record.flags;
  const std::uint32_t index = record.sub;
  if (p.site == 0 || frames == 0 || frames > VRAMSCOPE_RING_MAX_SITE_FRAMES ||
      chunks != (frames + VRAMSCOPE_RING_SITE_FRAMES_PER_RECORD - 1) /
                    VRAMSCOPE_RING_SITE_FRAMES_PER_RECORD ||
      index >= chunks) {
    return Invalid("SITE record: frame count, chunk index or chunk count out of range");
  }
  auto it = pending_.find(p.site);
  if (it == pending_.end()) {
    if (pending_.size() >= kMaxPending) return Invalid("SITE record: too many incomplete sites");
    it = pending_.try_emplace(p.site).first;
    it->second.frames = frames;
    it->second.chunks = chunks;
    it->second.addresses.assign(frames, 0);
  }
  PendingSite& site = it->second;
  if (site.frames != frames || (site.have & (1u << index)) != 0) {
    pending_.erase(it);
    return Invalid("SITE record: inconsistent with its earlier chunks");
  }
  site.have |= 1u << index;
  ++site.seen;
  for (std::uint32_t j = 0; j < VRAMSCOPE_RING_SITE_FRAMES_PER_RECORD; ++j) {
    const std::uint32_t f = index * VRAMSCOPE_RING_SITE_FRAMES_PER_RECORD + j;
    if (f < frames) site.addresses[f] = p.frames[j];
  }
  if (site.seen < site.chunks) return false;
  event->set_time_ns(record.time_ns);
  event->set_device(record.device);
  event->set_thread_id(record.tid);
  v1::SiteDefinition* definition = event->mutable_site_definition();
  definition->set_site(p.site);
  for (std::uint64_t address : site.addresses) definition->add_frames(FrameName(address));
  pending_.erase(it);
  return true;
}

std::string SiteAssembler::FrameName(std::uint64_t address) const {
  for (const auto& [id, module] : modules_) {
    if (module.complete && address >= module.start && address < module.end &&
        !module.path.empty()) {
      return absl::StrFormat("%s+0x%x", module.path, address - module.load_bias);
    }
  }
  return absl::StrFormat("0x%x", address);
}

}  // namespace vramscope::agent
