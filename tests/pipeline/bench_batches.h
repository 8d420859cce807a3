// The event batches the ingest benchmarks (ingest_bench, ingest_history_bench) stream: a training
// loop's alternating allocations and frees of a working set of 512 blocks of 4 KiB to 53 KiB.
#pragma once

#include <cstdint>

#include "vramscope/v1/events.pb.h"

namespace vramscope::testing {

inline constexpr int kBenchEventsPerBatch = 4096;

// Appends `count` events to `batch`, numbered from `first` (event n at 1 ms + n us, thread 4242;
// even n allocate, odd n free the block the one before allocated), and the device counters.
inline void AppendChurn(v1::EventBatch* batch, std::uint64_t first, int count) {
  for (int i = 0; i < count; ++i) {
    v1::Event* event = batch->add_events();
    const std::uint64_t n = first + static_cast<std::uint64_t>(i);
    event->set_time_ns(1000000 + n * 1000);
    event->set_thread_id(4242);
    const std::uint64_t address = 0x7f0000000000 + (n / 2 % 512) * 0x100000;
    const std::uint64_t bytes = 4096 + (n / 2 % 97) * 512;
    if (n % 2 == 0) {
      v1::AllocEvent* alloc = event->mutable_alloc();
      alloc->set_address(address);
      alloc->set_requested_bytes(bytes - 100);
      alloc->set_allocated_bytes(bytes);
      alloc->set_kind(v1::ALLOCATION_KIND_POOLED);
    } else {
      v1::FreeEvent* free = event->mutable_free();
      free->set_address(address);
      free->set_requested_bytes(bytes - 100);
      free->set_allocated_bytes(bytes);
      free->set_kind(v1::ALLOCATION_KIND_POOLED);
    }
  }
  v1::DeviceCounters* counters = batch->add_counters();
  counters->set_device(0);
  counters->set_peak_reserved_bytes(512u << 20);
}

}  // namespace vramscope::testing
