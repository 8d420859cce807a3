// Merging what several collectors hold of one fleet (an agent given `--collector a,b,c` sends a
// process to one collector at a time; after a failover its batches are split over two or more).
// Each collector reports the sequence ranges it holds (`held`); these functions count each
// sequence once.
//
// Pure functions over messages, thread-safe. No errors: parts that do not fit (another process)
// are the caller's to avoid.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vramscope/v1/collector.pb.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {

// Sequence ranges, kept sorted and disjoint.
using SequenceSet = std::vector<v1::SequenceRange>;

// `ranges` sorted, overlapping and adjacent ones joined.
SequenceSet Normalize(std::vector<v1::SequenceRange> ranges);
// The sequences of `a` that are also in `b`.
SequenceSet Intersect(const SequenceSet& a, const SequenceSet& b);
SequenceSet Union(const SequenceSet& a, const SequenceSet& b);
uint64_t Count(const SequenceSet& set);

// One process's reports from several collectors, each computed from sequences no other part
// holds (GetReportRequest.skip), into one. Sums: events, saturated events, and per device the
// allocation, free, pool and dropped-record counts and OOMs; maxima: peaks; the part holding the
// highest sequence gives what is "now" (current bytes, fragmentation, finished and how it ended,
// leaks); the timeline and top sites are joined. Approximate where a figure depends on events of
// other parts (a leak allocated in one part and freed in the next shows as a leak).
v1::Report MergeReports(const std::vector<v1::Report>& parts);

// Listings of several collectors into one: a process held by several appears once, its events
// summed (`overlap` gets the processes of which two collectors hold some same sequence: their
// event counts include those batches twice; `vramscope report --pid` counts them once), peak the
// highest, finished state from the part holding its highest sequence. Sorted like ListProcesses.
v1::ListProcessesResponse MergeListings(const std::vector<v1::ListProcessesResponse>& lists,
                                        std::vector<std::string>* overlap = nullptr);

}  // namespace vramscope::cli
