// Builds vramscope.v1 event streams for the stats tests and bench.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vramscope/v1/events.pb.h"

namespace vramscope::testing {

class EventStream {
 public:
  // Every event gets the next time (1 us apart) unless `at` is given.
  EventStream& Start(std::uint32_t pid = 100) {
    v1::Event& e = Next(0);
    e.mutable_process_start()->set_pid(pid);
    e.mutable_process_start()->add_command_line("app");
    e.mutable_process_start()->set_mode("pool");
    return *this;
  }
  EventStream& Alloc(std::uint64_t address, std::uint64_t requested, std::uint64_t allocated,
                     std::uint32_t device = 0, v1::AllocationKind kind = v1::ALLOCATION_KIND_POOLED,
                     std::uint32_t tid = 1, std::uint64_t site = 0) {
    v1::Event& e = Next(device, tid);
    v1::AllocEvent* a = e.mutable_alloc();
    a->set_address(address);
    a->set_requested_bytes(requested);
    a->set_allocated_bytes(allocated);
    a->set_kind(kind);
    a->set_site(site);
    return *this;
  }
  EventStream& Free(std::uint64_t address, std::uint32_t device = 0, std::uint32_t tid = 1) {
    Next(device, tid).mutable_free()->set_address(address);
    return *this;
  }
  EventStream& Reserve(std::uint64_t bytes, std::uint32_t device = 0) {
    Next(device).mutable_pool_reserve()->set_bytes(bytes);
    return *this;
  }
  EventStream& Release(std::uint64_t bytes, std::uint32_t device = 0) {
    Next(device).mutable_pool_release()->set_bytes(bytes);
    return *this;
  }
  EventStream& Push(std::uint32_t id, const std::string& name, std::uint32_t tid = 1) {
    v1::Event& e = Next(0, tid);
    e.mutable_nvtx_push()->set_range_id(id);
    e.mutable_nvtx_push()->set_name(name);
    return *this;
  }
  EventStream& Pop(std::uint32_t id, std::uint32_t tid = 1) {
    Next(0, tid).mutable_nvtx_pop()->set_range_id(id);
    return *this;
  }
  EventStream& PoolState(std::uint64_t free, std::uint64_t largest, std::uint64_t unreleasable,
                         std::uint32_t device = 0, std::uint64_t pending = 0) {
    v1::PoolStateEvent* s = Next(device).mutable_pool_state();
    s->set_free_bytes(free);
    s->set_largest_free_block_bytes(largest);
    s->set_unreleasable_free_bytes(unreleasable);
    s->set_pending_bytes(pending);
    return *this;
  }
  EventStream& Oom(std::uint64_t requested, std::uint64_t free, std::uint64_t largest,
                   v1::OomVerdict verdict = v1::OOM_VERDICT_UNSPECIFIED) {
    v1::OomEvent* o = Next(0).mutable_oom();
    o->set_requested_bytes(requested);
    o->set_free_bytes(free);
    o->set_largest_free_block_bytes(largest);
    o->set_verdict(verdict);
    return *this;
  }
  EventStream& Drop(std::uint64_t records) {
    Next(0).mutable_drop()->set_dropped_records(records);
    return *this;
  }
  // A SiteDefinition (frames innermost first, e.g. "/lib/libx.so+0x10" or "0x1234").
  EventStream& Site(std::uint64_t site, const std::vector<std::string>& frames,
                    std::uint32_t tid = 1) {
    v1::SiteDefinition* d = Next(0, tid).mutable_site_definition();
    d->set_site(site);
    for (const std::string& frame : frames) d->add_frames(frame);
    return *this;
  }
  EventStream& Exit(int code = 0) {
    Next(0).mutable_process_exit()->set_exit_code(code);
    return *this;
  }
  const std::vector<v1::Event>& events() const { return events_; }

 private:
  v1::Event& Next(std::uint32_t device, std::uint32_t tid = 1) {
    v1::Event& e = events_.emplace_back();
    time_ns_ += 1000;
    e.set_time_ns(time_ns_);
    e.set_device(device);
    e.set_thread_id(tid);
    return e;
  }
  std::uint64_t time_ns_ = 1000000;
  std::vector<v1::Event> events_;
};

}  // namespace vramscope::testing
