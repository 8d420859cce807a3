// Crafted reports for the `vramscope report` tests: every table filled, two devices, and names
// that try to break out of HTML (a hostile NVTX range, frame and command line).
#ifndef VRAMSCOPE_TESTS_REPORT_SAMPLE_REPORTS_H_
#define VRAMSCOPE_TESTS_REPORT_SAMPLE_REPORTS_H_

#include <string>

#include "vramscope/v1/report.pb.h"

namespace vramscope::testing {

inline constexpr char kHostileName[] =
    "</script><img src=x onerror=\"document.title='pwned'\">&amp;<!--'\"";

inline v1::DeviceReport SampleDevice(std::uint32_t ordinal, std::uint64_t scale) {
  v1::DeviceReport d;
  d.mutable_device()->set_ordinal(ordinal);
  d.mutable_device()->set_name("NVIDIA H200 <test>");
  d.mutable_device()->set_uuid("GPU-0000-" + std::to_string(ordinal));
  d.mutable_device()->set_total_memory_bytes(150011330560ull);
  d.set_current_requested_bytes(1000 * scale);
  d.set_peak_requested_bytes(3000001 * scale);
  d.set_current_allocated_bytes(1024 * scale);
  d.set_peak_allocated_bytes(3145728 * scale);
  d.set_current_reserved_bytes(2097152 * scale);
  d.set_peak_reserved_bytes(4194304 * scale + 17);
  d.set_reserved_over_allocated(4.0 / 3.0);
  d.mutable_fragmentation()->set_external_fragmentation(0.1);
  d.mutable_fragmentation()->set_free_bytes(1073741824);
  d.mutable_fragmentation()->set_largest_free_block_bytes(966367641);
  d.mutable_fragmentation_at_peak()->set_external_fragmentation(0.333333333333333314829616256);
  d.mutable_fragmentation_at_peak()->set_free_bytes(3000);
  d.mutable_fragmentation_at_peak()->set_largest_free_block_bytes(2000);
  d.mutable_fragmentation_at_peak()->set_unreleasable_free_bytes(512);
  d.mutable_fragmentation_at_peak()->set_rounding_waste_bytes(145727 * scale);
  d.mutable_fragmentation_at_peak()->set_largest_allocatable_bytes(2000);
  d.set_alloc_count(1234567);
  d.set_free_count(1234000);
  d.set_allocs_per_second(98765.4321);
  d.set_pool_reserve_count(12);
  d.set_pool_release_count(3);
  d.set_dropped_records(7);
  v1::OomRecord* oom = d.add_ooms();
  oom->set_time_ns(5'000'000);
  oom->set_requested_bytes(8'000'000'000ull);
  oom->set_free_bytes(9'000'000'000ull);
  oom->set_largest_free_block_bytes(1 << 30);
  oom->set_verdict(v1::OOM_VERDICT_FRAGMENTATION);
  oom = d.add_ooms();
  oom->set_time_ns(6'000'000);
  oom->set_requested_bytes(1ull << 40);
  oom->set_verdict(v1::OOM_VERDICT_CAPACITY);
  v1::NvtxRangeStats* range = d.add_nvtx_ranges();
  range->set_name(kHostileName);
  range->set_domain("evil\"domain");
  range->set_count(2);
  range->set_peak_allocated_bytes(3145728 * scale);
  range->set_net_growth_bytes(-4096);
  range->set_alloc_count(30);
  range->set_total_time_ns(2'500'000);
  range = d.add_nvtx_ranges();
  range->set_name("forward");
  range->set_count(10);
  range->set_peak_allocated_bytes(1048576);
  range->set_net_growth_bytes(18446744073709);
  range->set_alloc_count(100);
  range->set_total_time_ns(9'000'000);
  v1::SiteStats* site = d.add_top_sites();
  site->set_site(0xdeadbeefcafeull);
  site->add_frames("train_step (model.py:42) <lambda>");
  site->add_frames("main & co");
  site->set_alloc_count(77);
  site->set_total_bytes(18446744073709551615ull);
  site->set_peak_live_bytes(3145728);
  v1::Leak* leak = d.add_leaks();
  leak->set_address(0x7f0000001000ull);
  leak->set_requested_bytes(4097);
  leak->set_kind(v1::ALLOCATION_KIND_POOLED);
  leak->set_site(0xdeadbeefcafeull);
  leak->set_time_ns(7'000'000);
  leak = d.add_leaks();
  leak->set_address(0x7f0000002000ull);
  leak->set_requested_bytes(1);
  leak->set_kind(v1::ALLOCATION_KIND_MANAGED);
  leak->set_time_ns(7'500'000);
  // Timeline: 5 points; ranges: the hostile one twice (nested in "forward") and "forward".
  const std::uint64_t times[] = {1'000'000, 2'000'000, 3'000'000, 8'000'000, 9'000'000};
  const std::uint64_t allocated[] = {0, 1048576, 3145728, 2097152, 1024};
  for (int i = 0; i < 5; ++i) {
    v1::TimelinePoint* point = d.add_timeline();
    point->set_time_ns(times[i] * scale);
    point->set_requested_bytes(allocated[i] / 2);
    point->set_allocated_bytes(allocated[i] * scale);
    point->set_reserved_bytes(4194304 * scale);
  }
  auto instance = [&](const std::string& name, const std::string& domain, std::uint64_t start,
                      std::uint64_t end, std::uint32_t depth) {
    v1::NvtxRangeInstance* i = d.add_nvtx_instances();
    i->set_name(name);
    i->set_domain(domain);
    i->set_start_ns(start * scale);
    i->set_end_ns(end * scale);
    i->set_depth(depth);
    i->set_thread_id(4242);
  };
  instance("forward", "", 1'500'000, 8'500'000, 0);
  instance(kHostileName, "evil\"domain", 2'000'000, 3'000'000, 1);
  instance(kHostileName, "evil\"domain", 4'000'000, 5'500'000, 1);
  // Allocations: three live at the peak (3 ms), one freed before it, one made after it.
  struct Allocation {
    std::uint64_t address, requested, allocated;
    v1::AllocationKind kind;
    std::uint64_t site, alloc, free;
    bool at_peak;
    const char* range;
  };
  const Allocation allocations[] = {
      {0x7f0000000000, 1048576, 1048576, v1::ALLOCATION_KIND_POOLED, 0xdeadbeefcafe, 1'200'000,
       8'200'000, true, "forward"},
      {0x7f0000100000, 1000000, 1048576, v1::ALLOCATION_KIND_POOLED, 0xabc, 2'500'000, 2'900'000,
       false, kHostileName},
      {0x7f0000200000, 2097152, 2097152, v1::ALLOCATION_KIND_POOLED, 0, 2'600'000, 8'100'000, true,
       ""},
      {0x7f0000500000, 512, 512, v1::ALLOCATION_KIND_POOLED, 0xabc, 2'950'000, 0, true, ""},
      {0x7f0000400000, 4097, 4608, v1::ALLOCATION_KIND_MANAGED, 0xabc, 7'000'000, 0, false, ""},
  };
  for (const Allocation& a : allocations) {
    v1::AllocationRecord* record = d.add_allocations();
    record->set_address(a.address);
    record->set_requested_bytes(a.requested);
    record->set_allocated_bytes(a.allocated);
    record->set_kind(a.kind);
    record->set_site(a.site);
    record->set_alloc_time_ns(a.alloc * scale);
    record->set_free_time_ns(a.free * scale);
    record->set_live_at_peak(a.at_peak);
    record->set_nvtx_name(a.range);
    if (a.range == std::string(kHostileName)) record->set_nvtx_domain("evil\"domain");
    record->set_thread_id(4242);
  }
  d.set_allocations_omitted(95);
  d.set_peak_time_ns(3'000'000 * scale);
  d.set_peak_live_count(4);
  d.set_peak_live_omitted(1);
  d.set_peak_live_omitted_bytes(256);
  v1::AllocationSite* where = d.add_allocation_sites();
  where->set_site(0xabc);
  where->add_frames("/usr/local/cuda/lib64/libcudart.so.13+0x4a10");
  where->add_frames("/opt/torch/lib/libc10_cuda.so+0x2200");
  where->set_library("libc10_cuda.so");
  where = d.add_allocation_sites();
  where->set_site(0xdeadbeefcafe);
  where->add_frames("train_step (model.py:42) <lambda>");
  where->add_frames("main & co");
  where->set_library("python3.12");
  (*d.mutable_peak_bytes_by_kind())["pooled"] = 3145728 * scale;
  (*d.mutable_peak_bytes_by_kind())["managed"] = 4097;
  (*d.mutable_peak_requested_bytes_by_library())["libc10_cuda.so"] = 2000000 * scale;
  (*d.mutable_peak_requested_bytes_by_library())["libcublas.so.13"] = 134217728;
  (*d.mutable_peak_requested_bytes_by_library())["(unresolved)"] = 512;
  d.set_unattributed_peak_requested_bytes(4096 * scale);
  if (scale == 1) {  // CUPTI's view on the first device only: the other shows none
    v1::CuptiStats* c = d.mutable_cupti();
    c->set_current_bytes(2097152);
    c->set_peak_bytes(6291456);
    c->set_alloc_count(7);
    c->set_free_count(5);
    c->set_dropped_records(1);
    (*c->mutable_peak_bytes_by_memory_kind())["device"] = 6291456;
    (*c->mutable_peak_bytes_by_memory_kind())["pinned"] = 8192;
    (*c->mutable_current_bytes_by_memory_kind())["device"] = 2097152;
    c->set_pool_operations(2);
    c->set_last_time_ns(9'000'000);
  }
  return d;
}

// Process 4242 on node-a: two devices, exited 3.
inline v1::Report SampleReport() {
  v1::Report report;
  report.mutable_process()->set_host("node-a");
  report.mutable_process()->set_pid(4242);
  report.mutable_process()->set_start_time_ns(1764400000123456789ull);
  report.add_command_line("python");
  report.add_command_line("train.py");
  report.add_command_line("--tag=<b>bold</b>&\"q\"");
  report.set_mode("pool");
  report.set_finished(true);
  report.set_exit_code(3);
  report.set_start_time_ns(1764400000123456789ull);
  report.set_end_time_ns(1764400010123456789ull);
  report.set_events(987654321);
  *report.add_devices() = SampleDevice(0, 1);
  *report.add_devices() = SampleDevice(3, 2);
  return report;
}

}  // namespace vramscope::testing

#endif  // VRAMSCOPE_TESTS_REPORT_SAMPLE_REPORTS_H_
