#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <bit>

#include "log.h"
#include "vramscope/pool/upstream.h"
#include "vramscope/size_parse.h"

static_assert(vramscope::interposer::Config{}.vmm_piece_bytes ==
                  vramscope::pool::kDefaultMapPieceBytes,
              "the shim's default piece is the one `vramscope replay` models");

namespace vramscope::interposer {
namespace {

// A count or switch: decimal digits only.
bool ReadU64(const char* name, std::uint64_t* out) {
  const char* value = getenv(name);
  if (value == nullptr || value[0] == '\0') return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long parsed = strtoull(value, &end, 10);
  if (value[0] < '0' || value[0] > '9' || *end != '\0' || errno == ERANGE) {
    VRAMSCOPE_LOG(kWarn, "%s=%s is not a number; ignored", name, value);
    return false;
  }
  *out = parsed;
  return true;
}

// A byte size: the grammar every vramscope program shares (vramscope/size_parse.h).
bool ReadSize(const char* name, std::uint64_t* out) {
  const char* value = getenv(name);
  if (value == nullptr || value[0] == '\0') return false;
  const SizeParse parsed = ParseSizeText(value);
  if (!parsed.ok()) {
    VRAMSCOPE_LOG(kWarn, "%s=%s is not a size (%s; %s); ignored", name, value,
                  SizeErrorText(parsed.error), kSizeGrammarHelp);
    return false;
  }
  *out = parsed.bytes;
  return true;
}

}  // namespace

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kPool:
      return "pool";
    case Mode::kPassthrough:
      return "passthrough";
    case Mode::kStrict:
      return "strict";
  }
  return "unknown";
}

Config ReadConfig() {
  Config config;
  if (const char* mode = getenv("VRAMSCOPE_MODE"); mode != nullptr && mode[0] != '\0') {
    if (strcmp(mode, "pool") == 0) {
      config.mode = Mode::kPool;
    } else if (strcmp(mode, "passthrough") == 0) {
      config.mode = Mode::kPassthrough;
    } else if (strcmp(mode, "strict") == 0) {
      config.mode = Mode::kStrict;
    } else {
      // Unknown: behave as if the shim were absent (passthrough still records).
      VRAMSCOPE_LOG(
          kWarn, "VRAMSCOPE_MODE=%s is not pool, passthrough or strict; using passthrough", mode);
      config.mode = Mode::kPassthrough;
    }
  }
  if (const char* summary = getenv("VRAMSCOPE_SUMMARY"); summary != nullptr) {
    config.summary = summary[0] != '\0' && strcmp(summary, "0") != 0;
  }
  if (const char* policy = getenv("VRAMSCOPE_POOL_POLICY"); policy != nullptr) {
    strncpy(config.policy, policy, sizeof(config.policy) - 1);
  }
  std::uint64_t value = 0;
  if (ReadSize("VRAMSCOPE_POOL_CAPACITY", &value)) config.capacity_bytes = value;
  if (ReadU64("VRAMSCOPE_FENCE_BATCH_FREES", &value)) {
    config.fence_batch_frees = value == 0 ? 1 : value;
  }
  if (ReadSize("VRAMSCOPE_FENCE_BATCH_BYTES", &value)) config.fence_batch_bytes = value;
  if (ReadU64("VRAMSCOPE_VMM", &value)) config.use_vmm = value != 0;
  if (ReadSize("VRAMSCOPE_VMM_PIECE", &value)) {
    config.vmm_piece_bytes = value == 0 ? 0 : std::bit_floor(value);
  }
  if (ReadU64("VRAMSCOPE_QUICK_REUSE", &value)) config.quick_reuse = value != 0;
  if (ReadU64("VRAMSCOPE_FENCE_EAGER", &value)) config.fence_eager = value != 0;
  if (ReadU64("VRAMSCOPE_FENCE_EVENTS", &value)) config.fence_events = value != 0;
  if (ReadU64("VRAMSCOPE_FENCE_GPU_WAIT", &value)) config.fence_gpu_wait = value != 0;
  if (ReadU64("VRAMSCOPE_FENCE_LAG_FRACTION", &value)) config.fence_lag_fraction = value;
  if (ReadU64("VRAMSCOPE_FENCE_HANDOVER_FRACTION", &value)) {
    config.fence_handover_fraction = value;
  }
  // GPU-side waits space rounds and polls out (config.h): a handover covers the newest frees.
  if (config.fence_gpu_wait) {
    config.fence_round_us = Config::kGpuWaitRoundUs;
    config.fence_poll_us = Config::kGpuWaitPollUs;
  }
  if (ReadU64("VRAMSCOPE_FENCE_ROUND_US", &value)) {
    config.fence_round_us = std::clamp<std::uint64_t>(value, 1, 100000);
  }
  if (ReadU64("VRAMSCOPE_FENCE_POLL_US", &value)) {
    config.fence_poll_us = std::clamp<std::uint64_t>(value, 1, 100000);
  }
  if (ReadU64("VRAMSCOPE_CAP_PENDING", &value)) config.cap_counts_pending = value != 0;
  if (ReadU64("VRAMSCOPE_FENCE_ASYNC", &value)) config.fence_async = value != 0;
  if (ReadU64("VRAMSCOPE_FENCE_SPIN_US", &value)) {
    config.fence_spin_us = std::min<std::uint64_t>(value, 10000);
  }
  if (ReadU64("VRAMSCOPE_RUNTIME_HOOKS", &value)) config.runtime_hooks = value != 0;
  if (ReadU64("VRAMSCOPE_STACKS", &value)) config.stacks = value != 0;
  if (const char* unwind = getenv("VRAMSCOPE_STACKS_UNWIND")) {
    config.stacks_libgcc = strcmp(unwind, "libgcc") == 0;
  }
  if (ReadU64("VRAMSCOPE_CUPTI", &value)) {
    config.cupti = value != 0 ? CuptiSetting::kOn : CuptiSetting::kOff;
  }
  if (ReadU64("VRAMSCOPE_ORDERED", &value)) config.ordered = value != 0;
  if (ReadU64("VRAMSCOPE_IPC", &value)) config.ipc = value != 0;
  if (ReadU64("VRAMSCOPE_IPC_PIDFD", &value)) config.ipc_pidfd = value != 0;
  return config;
}

}  // namespace vramscope::interposer
