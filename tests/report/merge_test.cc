// report/merge.h: sequence-range sets, and several collectors' reports and listings merged with
// each sequence counted once.
#include "report/merge.h"

#include <absl/strings/str_cat.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace vramscope::cli {
namespace {

v1::SequenceRange Range(uint64_t first, uint64_t last) {
  v1::SequenceRange range;
  range.set_first(first);
  range.set_last(last);
  return range;
}

std::string Text(const SequenceSet& set) {
  std::string out;
  for (const auto& r : set) absl::StrAppend(&out, "[", r.first(), ",", r.last(), "]");
  return out;
}

TEST(SequenceSetTest, NormalizeIntersectUnion) {
  SequenceSet a = Normalize({Range(9, 12), Range(1, 4), Range(5, 6), Range(3, 3)});
  EXPECT_EQ(Text(a), "[1,6][9,12]");
  SequenceSet b = Normalize({Range(6, 10)});
  EXPECT_EQ(Text(Intersect(a, b)), "[6,6][9,10]");
  EXPECT_EQ(Text(Union(a, b)), "[1,12]");
  EXPECT_EQ(Count(a), 10u);
}

v1::Report Part(uint64_t first, uint64_t last, uint64_t events, uint64_t allocs, uint64_t peak,
                uint64_t current, bool finished) {
  v1::Report report;
  report.mutable_process()->set_pid(7);
  report.set_events(events);
  report.set_finished(finished);
  *report.add_held() = Range(first, last);
  v1::DeviceReport* device = report.add_devices();
  device->mutable_device()->set_ordinal(0);
  device->set_alloc_count(allocs);
  device->set_peak_allocated_bytes(peak);
  device->set_current_allocated_bytes(current);
  return report;
}

TEST(MergeTest, ReportsOfDisjointPartsAddUpAndTheLatestSaysWhatIsNow) {
  // The process at collector a for 1..10, at b for 11..15 (failover), at a again from 16.
  v1::Report a = Part(1, 10, 100, 90, 5000, 10, false);
  *a.add_held() = Range(16, 20);
  a.set_events(a.events() + 50);
  v1::Report b = Part(11, 15, 40, 30, 7000, 20, false);
  v1::Report merged = MergeReports({b, a});
  EXPECT_EQ(merged.events(), 190u);
  ASSERT_EQ(merged.devices_size(), 1);
  EXPECT_EQ(merged.devices(0).alloc_count(), 120u);
  EXPECT_EQ(merged.devices(0).peak_allocated_bytes(), 7000u);
  EXPECT_EQ(merged.devices(0).current_allocated_bytes(), 10u);  // a holds the latest sequence
  EXPECT_EQ(Text({merged.held().begin(), merged.held().end()}), "[1,20]");
}

TEST(MergeTest, ListingsNameAProcessOnceAndFlagOverlaps) {
  v1::ListProcessesResponse a;
  v1::ProcessSummary* p = a.add_processes();
  p->mutable_process()->set_pid(7);
  p->set_events(100);
  *p->add_held() = Range(1, 10);
  v1::ListProcessesResponse b;
  v1::ProcessSummary* q = b.add_processes();
  q->mutable_process()->set_pid(7);
  q->set_events(60);
  q->set_finished(true);
  *q->add_held() = Range(10, 15);  // sequence 10 at both: stored at a, its ack lost, resent to b
  v1::ProcessSummary* other = b.add_processes();
  other->mutable_process()->set_pid(8);
  *other->add_held() = Range(1, 1);
  std::vector<std::string> overlap;
  v1::ListProcessesResponse merged = MergeListings({a, b}, &overlap);
  ASSERT_EQ(merged.processes_size(), 2);
  EXPECT_EQ(merged.processes(0).events(), 160u);
  EXPECT_TRUE(merged.processes(0).finished());  // b holds its highest sequence
  EXPECT_EQ(Text({merged.processes(0).held().begin(), merged.processes(0).held().end()}), "[1,15]");
  ASSERT_EQ(overlap.size(), 1u);
  EXPECT_EQ(overlap[0], "/7/0");
}

}  // namespace
}  // namespace vramscope::cli
