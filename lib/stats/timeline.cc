#include "stats/timeline.h"

#include <algorithm>

namespace vramscope::collector {

void Timeline::Add(std::uint64_t time_ns, std::uint64_t requested, std::uint64_t allocated,
                   std::uint64_t reserved) {
  if (points_.empty()) {
    origin_ns_ = time_ns;
    SetLastBucket(0);
    points_.push_back({time_ns, requested, allocated, reserved});
    return;
  }
  // Out-of-order times (several threads, clock mapping) fold into the newest bucket.
  if (time_ns < points_.back().time_ns) time_ns = points_.back().time_ns;
  // The newest point is in last_bucket_ and time_ns is not before it, so its bucket is
  // last_bucket_ exactly when it is before that bucket's end.
  const std::uint64_t bucket =
      time_ns - origin_ns_ < last_bucket_end_ ? last_bucket_ : Bucket(time_ns);
  if (bucket == last_bucket_) {
    Point& p = points_.back();
    p.requested = std::max(p.requested, requested);
    p.allocated = std::max(p.allocated, allocated);
    p.reserved = std::max(p.reserved, reserved);
    return;
  }
  points_.push_back({time_ns, requested, allocated, reserved});
  SetLastBucket(bucket);
  while (points_.size() > max_points_) Coarsen();
}

void Timeline::SetLastBucket(std::uint64_t bucket) {
  last_bucket_ = bucket;
  std::uint64_t end;
  if (__builtin_mul_overflow(bucket + 1, bucket_ns_, &end)) end = UINT64_MAX;
  last_bucket_end_ = end;
}

void Timeline::Coarsen() {
  bucket_ns_ *= 2;
  std::size_t out = 0;
  std::uint64_t out_bucket = Bucket(points_[0].time_ns);
  for (std::size_t i = 1; i < points_.size(); ++i) {
    const Point& p = points_[i];
    const std::uint64_t bucket = Bucket(p.time_ns);
    if (bucket == out_bucket) {
      Point& q = points_[out];
      q.requested = std::max(q.requested, p.requested);
      q.allocated = std::max(q.allocated, p.allocated);
      q.reserved = std::max(q.reserved, p.reserved);
    } else {
      points_[++out] = p;
      out_bucket = bucket;
    }
  }
  points_.resize(out + 1);
  SetLastBucket(out_bucket);
}

void Timeline::AppendTo(google::protobuf::RepeatedPtrField<v1::TimelinePoint>* out) const {
  out->Reserve(out->size() + static_cast<int>(points_.size()));
  for (const Point& p : points_) {
    v1::TimelinePoint* point = out->Add();
    point->set_time_ns(p.time_ns);
    point->set_requested_bytes(p.requested);
    point->set_allocated_bytes(p.allocated);
    point->set_reserved_bytes(p.reserved);
  }
}

}  // namespace vramscope::collector
