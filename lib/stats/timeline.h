// Timeline: a bounded, downsampled series of (time, requested, allocated, reserved) points.
//
// Points are kept in buckets of a width that doubles whenever the series would exceed its bound;
// a bucket holds the maximum of each series over its span (so peaks survive downsampling) and the
// time of the first sample in it. Add is O(1) amortised. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "vramscope/v1/report.pb.h"

namespace vramscope::collector {

class Timeline {
 public:
  explicit Timeline(std::size_t max_points = 2000) : max_points_(max_points < 2 ? 2 : max_points) {}

  void Add(std::uint64_t time_ns, std::uint64_t requested, std::uint64_t allocated,
           std::uint64_t reserved);
  std::size_t size() const { return points_.size(); }
  std::uint64_t bucket_ns() const { return bucket_ns_; }
  void AppendTo(google::protobuf::RepeatedPtrField<v1::TimelinePoint>* out) const;

 private:
  struct Point {
    std::uint64_t time_ns;
    std::uint64_t requested;
    std::uint64_t allocated;
    std::uint64_t reserved;
  };
  std::uint64_t Bucket(std::uint64_t time_ns) const { return (time_ns - origin_ns_) / bucket_ns_; }
  void Coarsen();
  void SetLastBucket(std::uint64_t bucket);

  std::size_t max_points_;
  std::uint64_t origin_ns_ = 0;
  std::uint64_t bucket_ns_ = 1000;  // 1 us to start; doubles as needed
  std::uint64_t last_bucket_ = 0;
  // time - origin_ns_ below this is in last_bucket_ (its end, (last_bucket_ + 1) * bucket_ns_,
  // held at 2^64-1): most samples land in the newest bucket, without a division.
  std::uint64_t last_bucket_end_ = 0;
  std::vector<Point> points_;
};

}  // namespace vramscope::collector
