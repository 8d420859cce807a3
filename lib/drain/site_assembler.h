// SiteAssembler: turns the shim's SITE and MODULE records (vramscope/ring.h) into
// vramscope.v1.SiteDefinition events, one per ring.
//
// MODULE records build the ring's module map (path, load bias, address range); SITE records,
// which a writer sends in chunks of four addresses that other records may separate, are
// gathered by site id. A complete site becomes a SiteDefinition whose frames name each return
// address as "PATH+0xOFFSET" (OFFSET = address - the module's load bias: what `addr2line -e
// PATH` takes) or "0xADDRESS" when no module holds it. Resolving those to function, file and line
// happens later, where the files are (`vramscope run`, viewer-cli/common/symbolize.h).
//
// Bounded: at most kMaxModules modules and kMaxPending incomplete sites (further ones are
// refused as invalid). Thread safety: none (one per RingReader). Error convention:
// InvalidArgument for a record no writer produces; the assembler's state stays consistent.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "vramscope/ring.h"
#include "vramscope/v1/events.pb.h"

namespace vramscope::agent {

class SiteAssembler {
 public:
  static constexpr std::size_t kMaxModules = 8192;
  static constexpr std::size_t kMaxPending = 4096;

  absl::Status AddModule(const vramscope_ring_record& record);
  // True when `record` completed a site: `event` then holds its SiteDefinition (time, thread
  // and device of the last chunk).
  absl::StatusOr<bool> AddSite(const vramscope_ring_record& record, v1::Event* event);

  // "PATH+0xOFFSET" or "0xADDRESS" (see above).
  std::string FrameName(std::uint64_t address) const;

 private:
  struct Module {
    std::uint64_t load_bias = 0;
    std::uint64_t start = 0;
    std::uint64_t end = 0;
    std::uint32_t chunks = 0;
    std::uint32_t seen = 0;  // distinct chunks received
    std::vector<bool> have;
    std::string path;  // chunks concatenated, NUL padding removed when complete
    bool complete = false;
  };
  struct PendingSite {
    std::uint32_t frames = 0;
    std::uint32_t chunks = 0;
    std::uint32_t seen = 0;
    std::uint32_t have = 0;  // bit per chunk (at most 16)
    std::vector<std::uint64_t> addresses;
  };
  absl::flat_hash_map<std::uint32_t, Module> modules_;
  absl::flat_hash_map<std::uint64_t, PendingSite> pending_;
};

}  // namespace vramscope::agent
