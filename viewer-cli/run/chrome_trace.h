// ChromeTrace: Chrome Trace Event JSON for ui.perfetto.dev and chrome://tracing.
//
// Per traced process (pid): a process_name metadata record; per device counter tracks
// "cuda:N allocated", "cuda:N reserved" and "cuda:N requested" (bytes) from the report's
// downsampled timeline; every device allocation (not pinned host memory or IPC imports) as a
// nestable async slice ("b"/"e", cat "alloc", one id per allocation, named by its requested size,
// args requested/allocated bytes, address, stream, kind) from its alloc to its free or the last
// event; NVTX ranges as complete ("X") slices on the thread that pushed them; OOMs as
// process-scoped instants; CUPTI's driver view (when recorded) as a counter track "cuda:N CUPTI
// device bytes" (one point per CUPTI record, capped with the slices) and pool operations / CUPTI's
// dropped records as instants. Times are microseconds on CLOCK_MONOTONIC, shared by every process,
// so their tracks line up.
//
// Slices are kept in memory up to max_slices (further ones are counted, not kept).
// Thread safety: none.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "vramscope/v1/events.pb.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {

class ChromeTrace {
 public:
  explicit ChromeTrace(std::size_t max_slices = 200000) : max_slices_(max_slices) {}

  // Events of process `pid`, in order.
  void Add(std::uint32_t pid, const v1::Event& event);
  // The whole trace; `reports` give process names and the counter timelines.
  std::string Json(const std::vector<v1::Report>& reports) const;
  std::uint64_t slices_dropped() const { return slices_dropped_; }

 private:
  struct Slice {
    std::uint32_t pid;
    std::uint32_t tid;
    std::uint64_t start_ns;
    std::uint64_t end_ns;
    std::string name;
    std::string domain;
  };
  // One allocation, from its alloc to its free (end_ns 0: still live).
  struct AllocSlice {
    std::uint32_t pid;
    std::uint32_t device;
    std::uint64_t address;
    std::uint64_t start_ns;
    std::uint64_t end_ns;
    std::uint64_t requested;
    std::uint64_t allocated;
    std::uint64_t stream;
    v1::AllocationKind kind;
  };
  struct Open {
    std::uint32_t tid;
    std::uint64_t start_ns;
    std::string name;
    std::string domain;
  };
  struct Instant {
    std::uint32_t pid;
    std::uint32_t tid;
    std::uint64_t time_ns;
    std::string name;
    std::string args;  // JSON object body
    std::string cat = "oom";
  };

  // CUPTI's device bytes of (pid, device) after one CUPTI record.
  struct CuptiPoint {
    std::uint32_t pid;
    std::uint32_t device;
    std::uint64_t time_ns;
    std::uint64_t bytes;
  };
  void AddCupti(std::uint32_t pid, const v1::Event& event);
  void AddAlloc(std::uint32_t pid, const v1::Event& event);
  void EmitAllocs(const std::function<void(const std::string&)>& emit) const;

  std::size_t max_slices_;
  std::vector<CuptiPoint> cupti_points_;
  absl::flat_hash_map<std::uint64_t, std::uint64_t> cupti_bytes_;  // (pid << 32 | device)
  // (pid, address) -> bytes
  absl::flat_hash_map<std::pair<std::uint32_t, std::uint64_t>, std::uint64_t> cupti_live_;
  std::vector<Slice> slices_;
  std::vector<AllocSlice> allocs_;
  // (pid, address) -> index in allocs_ of the live allocation
  absl::flat_hash_map<std::pair<std::uint32_t, std::uint64_t>, std::size_t> live_allocs_;
  std::vector<Instant> instants_;
  // (pid << 32 | range id) -> the open range
  absl::flat_hash_map<std::uint64_t, Open> open_;
  std::uint64_t last_time_ns_ = 0;
  std::uint64_t slices_dropped_ = 0;
};

}  // namespace vramscope::cli
