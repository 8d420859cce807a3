// Reading a ring's LABELS records (vramscope/ring.h) back into the run's labels.
//
// The records come from a file any process of the ring's user can write: the text is checked
// again with the shim's own rules (vramscope/ring/labels.h), and anything that does not hold
// (chunk numbering, length, a malformed label) makes the whole group invalid, counted as lost
// records by the caller like any other invalid record.
//
// Thread safety: a pure function of the slots it reads. Error convention: the enum below.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "vramscope/ring.h"

namespace vramscope::agent {

enum class LabelsRead {
  kTaken,       // *labels holds the labels (replacing what it held)
  kInvalid,     // a corrupt group: skip *consumed records
  kIncomplete,  // a chunk is claimed but not yet published: read again later
};

// `records`/`capacity`: the ring's slots. `position` holds a published LABELS record, the
// group's first; `available` = head - position. Sets *consumed to the records the group takes.
LabelsRead ReadLabelsRecords(const vramscope_ring_record* records, std::uint64_t capacity,
                             std::uint64_t position, std::uint64_t available,
                             std::map<std::string, std::string>* labels, std::uint64_t* consumed);

}  // namespace vramscope::agent
