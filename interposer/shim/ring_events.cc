#include "ring_events.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <new>

#include "driver.h"
#include "log.h"
#include "vramscope/ring/labels.h"
#include "vramscope/ring/ring_dir.h"

namespace vramscope::interposer {
namespace ring_internal {

constinit std::atomic<int> g_ring_state{static_cast<int>(RingState::kOff)};
constinit std::atomic<RingWriter*> g_ring{nullptr};

}  // namespace ring_internal

namespace {

using ring_internal::g_ring;
using ring_internal::g_ring_state;
using ring_internal::RingState;

// kPending -> kOpening is taken by one thread; the others record nothing until it is open.
constexpr int kOpening = 100;

// The writer in static storage, constructed on first open and never destroyed: a global
// RingWriter would register a destructor that unmaps the ring at exit, under threads that may
// still free memory.
alignas(RingWriter) constinit unsigned char g_writer_storage[sizeof(RingWriter)] = {};
constinit RingWriter* g_writer = nullptr;
constinit const char* g_mode_name = "pool";
// Where the ring goes (ring_dir.h), decided at init and again in a fork child. The path is copied:
// the program may change its environment later.
constinit RingDirSource g_dir_source = RingDirSource::kOff;
constinit char g_dir[400] = {};
// Devices whose device_info is filled in (bit per ordinal).
constinit std::atomic<std::uint32_t> g_devices_noted{0};

RingWriter* Writer() {
  if (g_writer == nullptr) g_writer = new (g_writer_storage) RingWriter();
  return g_writer;
}

// Reads the rule of ring_dir.h into g_dir_source/g_dir; false when rings are off.
bool ChooseDir() {
  const RingDirChoice choice = ChooseRingDir();
  g_dir_source = choice.source;
  if (choice.source == RingDirSource::kOff) {
    VRAMSCOPE_LOG_ONCE(kInfo, "VRAMSCOPE_RING_DIR=%s: no event ring", choice.dir);
    return false;
  }
  const int n = snprintf(g_dir, sizeof(g_dir), "%s", choice.dir);
  if (n < 0 || static_cast<std::size_t>(n) >= sizeof(g_dir)) {
    // Never a truncated path: it would name another directory.
    g_dir[0] = '\0';
  }
  return true;
}

// VRAMSCOPE_LABELS into the ring, once per ring (a fork child's too). Start-up, not a hot path;
// still no heap: the text is checked in place and copied as it is. A malformed value is logged
// and ignored: labels never stop the program.
void RecordLabelsFromEnvironment(RingWriter* writer) {
  const char* text = getenv("VRAMSCOPE_LABELS");
  if (text == nullptr || text[0] == '\0') return;
  const std::string_view labels(text);
  char why[160];
  if (labels.size() > VRAMSCOPE_RING_MAX_LABELS_BYTES ||
      !ParseLabels(labels, nullptr, nullptr, why, sizeof(why))) {
    if (labels.size() > VRAMSCOPE_RING_MAX_LABELS_BYTES) {
      snprintf(why, sizeof(why), "longer than %u bytes", VRAMSCOPE_RING_MAX_LABELS_BYTES);
    }
    VRAMSCOPE_LOG_ONCE(kWarn, "ignoring VRAMSCOPE_LABELS: %s", why);
    return;
  }
  if (!writer->RecordLabels(labels.data(), labels.size())) {
    VRAMSCOPE_LOG_ONCE(kWarn, "VRAMSCOPE_LABELS: the ring had no room for the labels");
  }
}

}  // namespace

void ring_internal::OpenPendingRing() {
  int expected = static_cast<int>(RingState::kPending);
  if (!g_ring_state.compare_exchange_strong(expected, kOpening, std::memory_order_acq_rel)) {
    return;
  }
  RingOpenOptions options;
  options.mode = g_mode_name;
  options.dir = g_dir;
  if (g_dir[0] == '\0') {
    VRAMSCOPE_LOG_ONCE(kWarn,
                       "the event ring directory's path is too long (%zu bytes at most); "
                       "running without recording events",
                       sizeof(g_dir) - 1);
    g_ring_state.store(static_cast<int>(RingState::kFailed), std::memory_order_release);
    return;
  }
  if (g_dir_source == RingDirSource::kDefault) {
    // The default directory is used only as vramscope-agent makes it: present, and safe to create
    // a file in (ring_dir.h). The file is then created relative to the descriptor checked.
    const RingDirCheck check = CheckRingDir(g_dir);
    if (check.verdict == RingDirVerdict::kMissing) {
      VRAMSCOPE_LOG_ONCE(kInfo,
                         "no agent ring directory %s; set VRAMSCOPE_RING_DIR or start "
                         "vramscope-agent (running without recording events)",
                         g_dir);
    } else if (check.verdict != RingDirVerdict::kSafe) {
      char why[128];
      VRAMSCOPE_LOG_ONCE(kWarn,
                         "not writing an event ring to %s: it %s; set VRAMSCOPE_RING_DIR or fix "
                         "the directory (running without recording events)",
                         g_dir, DescribeRingDirCheck(check, why, sizeof(why)));
    }
    if (check.verdict != RingDirVerdict::kSafe) {
      g_ring_state.store(static_cast<int>(RingState::kFailed), std::memory_order_release);
      return;
    }
    options.dir_fd = check.fd;
  }
  RingWriter* writer = Writer();
  const RingError error = writer->Open(options);
  if (options.dir_fd >= 0) close(options.dir_fd);
  if (error != RingError::kOk) {
    VRAMSCOPE_LOG_ONCE(kWarn,
                       "cannot open the event ring in %s (%s: %s); running without recording "
                       "events",
                       g_dir, RingErrorName(error), strerror(writer->last_errno()));
    g_ring_state.store(static_cast<int>(RingState::kFailed), std::memory_order_release);
    return;
  }
  g_devices_noted.store(0, std::memory_order_relaxed);
  RecordLabelsFromEnvironment(writer);
  g_ring.store(writer, std::memory_order_release);
  g_ring_state.store(static_cast<int>(RingState::kOpen), std::memory_order_release);
  VRAMSCOPE_LOG(kInfo, "recording events to %s", writer->path());
}

void OpenRingAtInit(const char* mode_name) {
  if (g_ring_state.load(std::memory_order_acquire) != static_cast<int>(RingState::kOff)) return;
  if (!ChooseDir()) return;
  g_mode_name = mode_name;
  g_ring_state.store(static_cast<int>(RingState::kPending), std::memory_order_release);
  ring_internal::OpenPendingRing();
}

void RingForkChild(const char* mode_name) {
  // Single-threaded here. The parent's mapping is inherited: unmap it without writing.
  g_ring.store(nullptr, std::memory_order_release);
  if (g_writer != nullptr) g_writer->Close();
  g_devices_noted.store(0, std::memory_order_relaxed);
  g_mode_name = mode_name;
  // A parent that chose a directory (whether or not its ring opened) gives the child a try of its
  // own, by the environment the child has now: the agent may have started since.
  if (g_ring_state.load(std::memory_order_relaxed) != static_cast<int>(RingState::kOff)) {
    g_ring_state.store(static_cast<int>(ChooseDir() ? RingState::kPending : RingState::kOff),
                       std::memory_order_release);
  }
}

void MarkRingExited(int status) {
  if (RingWriter* ring = Ring()) ring->MarkExited(status);
}

void NoteRingDevice(int device) {
  RingWriter* ring = Ring();
  if (ring == nullptr || device < 0 || device >= static_cast<int>(VRAMSCOPE_RING_MAX_DEVICES)) {
    return;
  }
  const std::uint32_t bit = 1u << device;
  if ((g_devices_noted.load(std::memory_order_relaxed) & bit) != 0) return;
  if ((g_devices_noted.fetch_or(bit, std::memory_order_relaxed) & bit) != 0) return;
  const RealDriver& real = Real();
  char name[64] = {};
  if (real.cuDeviceGetName == nullptr ||
      real.cuDeviceGetName(name, sizeof(name) - 1, device) != CUDA_SUCCESS) {
    name[0] = '\0';
  }
  CUuuid uuid{};
  const bool have_uuid =
      real.cuDeviceGetUuid_v2 != nullptr && real.cuDeviceGetUuid_v2(&uuid, device) == CUDA_SUCCESS;
  size_t total = 0;
  if (real.cuDeviceTotalMem_v2 == nullptr ||
      real.cuDeviceTotalMem_v2(&total, device) != CUDA_SUCCESS) {
    total = 0;
  }
  ring->SetDeviceInfo(static_cast<std::uint32_t>(device), name,
                      have_uuid ? reinterpret_cast<const std::uint8_t*>(uuid.bytes) : nullptr,
                      total);
}

int CurrentDeviceOrZero() {
  const RealDriver& real = Real();
  CUdevice device = 0;
  if (real.cuCtxGetDevice == nullptr || real.cuCtxGetDevice(&device) != CUDA_SUCCESS) return 0;
  return device;
}

std::uint8_t RingAllocKind(Kind kind) {
  switch (kind) {
    case Kind::kDevice:
      return VRAMSCOPE_RING_ALLOC_DRIVER;
    case Kind::kPitch:
      return VRAMSCOPE_RING_ALLOC_PITCHED;
    case Kind::kManaged:
      return VRAMSCOPE_RING_ALLOC_MANAGED;
    case Kind::kHost:
    case Kind::kHostRegistered:
      return VRAMSCOPE_RING_ALLOC_HOST;
    case Kind::kAsync:
      return VRAMSCOPE_RING_ALLOC_STREAM_ORDERED;
    case Kind::kVmmPhysical:
      return VRAMSCOPE_RING_ALLOC_VMM;
    case Kind::kIpcImport:
      return VRAMSCOPE_RING_ALLOC_IPC_IMPORT;
    case Kind::kArray:
      return VRAMSCOPE_RING_ALLOC_ARRAY;
    case Kind::kGraph:
      return VRAMSCOPE_RING_ALLOC_GRAPH;
    case Kind::kIpcExport:
      return VRAMSCOPE_RING_ALLOC_IPC_EXPORT;
    case Kind::kVmmMapped:
    case Kind::kVmmReserved:
    case Kind::kCount:
      break;
  }
  return VRAMSCOPE_RING_ALLOC_UNSPECIFIED;
}

}  // namespace vramscope::interposer
