// Record -> Event. The field-by-field mapping mirrors vramscope/ring.h; every enum taken from the
// ring is range-checked, because the ring is shared memory any process of the user can scribble.
#include "drain/ring_decoder.h"

#include <absl/strings/str_format.h>

#include <string>

#include "vramscope/utf8.h"

namespace vramscope::agent {
namespace {

absl::Status Invalid(const vramscope_ring_record& record, const char* what) {
  return absl::InvalidArgumentError(
      absl::StrFormat("ring record kind %d: %s", static_cast<int>(record.kind), what));
}

absl::Status DecodeNvtxPush(const vramscope_ring_record& record, std::string_view nvtx_text,
                            v1::Event* event) {
  const vramscope_ring_nvtx_push_payload& p = record.payload.nvtx_push;
  const std::size_t total = std::size_t{p.name_len} + p.domain_len;
  if (total > VRAMSCOPE_RING_MAX_NVTX_TEXT || total != nvtx_text.size()) {
    return Invalid(record, "NVTX name and domain lengths");
  }
  v1::NvtxPushEvent* push = event->mutable_nvtx_push();
  push->set_range_id(record.aux);
  // The application's text: bytes that are not UTF-8 are escaped (vramscope/utf8.h).
  push->set_name(ToValidUtf8(nvtx_text.substr(0, p.name_len)));
  push->set_domain(ToValidUtf8(nvtx_text.substr(p.name_len)));
  push->set_category(p.category);
  push->set_parent_range_id(p.parent_range_id);
  return absl::OkStatus();
}

absl::Status DecodePoolState(const vramscope_ring_record& record, v1::Event* event) {
  const vramscope_ring_pool_state_payload& p = record.payload.pool_state;
  v1::PoolStateEvent* state = event->mutable_pool_state();
  state->set_largest_free_block_bytes(p.largest_free_block_bytes);
  state->set_free_bytes(p.free_bytes);
  state->set_pending_bytes(p.pending_bytes);
  state->set_unreleasable_free_bytes(p.unreleasable_free_bytes);
  state->set_reserved_bytes(p.reserved_bytes);
  return absl::OkStatus();
}

absl::Status DecodeCupti(const vramscope_ring_record& record, v1::Event* event) {
  if (record.sub > v1::CuptiMemoryEvent::OPERATION_RECORDS_DROPPED) {
    return Invalid(record, "CUPTI operation");
  }
  const vramscope_ring_cupti_payload& p = record.payload.cupti;
  v1::CuptiMemoryEvent* cupti = event->mutable_cupti_memory();
  cupti->set_operation(static_cast<v1::CuptiMemoryEvent::Operation>(record.sub));
  if (record.sub == v1::CuptiMemoryEvent::OPERATION_RECORDS_DROPPED) {
    cupti->set_records_dropped(p.bytes);
    return absl::OkStatus();
  }
  cupti->set_address(p.address);
  cupti->set_bytes(p.bytes);
  cupti->set_memory_kind(p.memory_kind);
  cupti->set_pool_address(p.pool_address);
  cupti->set_pool_type(p.pool_type);
  cupti->set_stream(p.stream);
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeRecord(const vramscope_ring_record& record, std::string_view nvtx_text,
                          v1::Event* event) {
  event->set_time_ns(record.time_ns);
  event->set_device(record.device);
  event->set_thread_id(record.tid);
  switch (record.kind) {
    case VRAMSCOPE_RING_KIND_ALLOC: {
      if (record.sub >= VRAMSCOPE_RING_ALLOC_LIMIT) return Invalid(record, "allocation kind");
      v1::AllocEvent* alloc = event->mutable_alloc();
      alloc->set_address(record.payload.alloc.address);
      alloc->set_requested_bytes(record.payload.alloc.requested_bytes);
      alloc->set_allocated_bytes(record.payload.alloc.allocated_bytes);
      alloc->set_kind(static_cast<v1::AllocationKind>(record.sub));
      alloc->set_stream(record.payload.alloc.stream);
      alloc->set_nvtx_range(record.aux);
      alloc->set_site(record.payload.alloc.site);
      return absl::OkStatus();
    }
    case VRAMSCOPE_RING_KIND_FREE: {
      if (record.sub >= VRAMSCOPE_RING_ALLOC_LIMIT) return Invalid(record, "allocation kind");
      v1::FreeEvent* free = event->mutable_free();
      free->set_address(record.payload.free.address);
      free->set_requested_bytes(record.payload.free.requested_bytes);
      free->set_allocated_bytes(record.payload.free.allocated_bytes);
      free->set_kind(static_cast<v1::AllocationKind>(record.sub));
      free->set_stream(record.payload.free.stream);
      return absl::OkStatus();
    }
    case VRAMSCOPE_RING_KIND_POOL_RESERVE: {
      v1::PoolReserveEvent* reserve = event->mutable_pool_reserve();
      reserve->set_address(record.payload.pool.address);
      reserve->set_bytes(record.payload.pool.bytes);
      return absl::OkStatus();
    }
    case VRAMSCOPE_RING_KIND_POOL_RELEASE: {
      v1::PoolReleaseEvent* release = event->mutable_pool_release();
      release->set_address(record.payload.pool.address);
      release->set_bytes(record.payload.pool.bytes);
      return absl::OkStatus();
    }
    case VRAMSCOPE_RING_KIND_NVTX_PUSH:
      return DecodeNvtxPush(record, nvtx_text, event);
    case VRAMSCOPE_RING_KIND_NVTX_POP:
      event->mutable_nvtx_pop()->set_range_id(record.aux);
      return absl::OkStatus();
    case VRAMSCOPE_RING_KIND_OOM: {
      if (record.sub > v1::OOM_VERDICT_CAPACITY) return Invalid(record, "OOM verdict");
      v1::OomEvent* oom = event->mutable_oom();
      oom->set_requested_bytes(record.payload.oom.requested_bytes);
      oom->set_free_bytes(record.payload.oom.free_bytes);
      oom->set_largest_free_block_bytes(record.payload.oom.largest_free_block_bytes);
      oom->set_verdict(static_cast<v1::OomVerdict>(record.sub));
      return absl::OkStatus();
    }
    case VRAMSCOPE_RING_KIND_POOL_STATE:
      return DecodePoolState(record, event);
    case VRAMSCOPE_RING_KIND_CUPTI_MEMORY:
      return DecodeCupti(record, event);
    case VRAMSCOPE_RING_KIND_PROCESS_EXIT: {
      v1::ProcessExitEvent* exit = event->mutable_process_exit();
      exit->set_exit_code(static_cast<std::int32_t>(record.aux));
      exit->set_killed((record.flags & 1) != 0);
      return absl::OkStatus();
    }
    case VRAMSCOPE_RING_KIND_TEXT:
      return Invalid(record, "TEXT record without an NVTX push before it");
    case VRAMSCOPE_RING_KIND_SITE:
    case VRAMSCOPE_RING_KIND_MODULE:
      return Invalid(record, "SITE and MODULE records are assembled by the reader (SiteAssembler)");
    default:
      return Invalid(record, "unknown kind");
  }
}

}  // namespace vramscope::agent
