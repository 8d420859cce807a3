#include "counters.h"

#include <new>

namespace vramscope::interposer {
namespace {

constinit ShimCounters g_counters{};

}  // namespace

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kDevice:
      return "device";
    case Kind::kPitch:
      return "pitch";
    case Kind::kManaged:
      return "managed";
    case Kind::kHost:
      return "host";
    case Kind::kHostRegistered:
      return "host_registered";
    case Kind::kAsync:
      return "async";
    case Kind::kVmmPhysical:
      return "vmm_physical";
    case Kind::kVmmMapped:
      return "vmm_mapped";
    case Kind::kVmmReserved:
      return "vmm_reserved";
    case Kind::kIpcImport:
      return "ipc_import";
    case Kind::kArray:
      return "array";
    case Kind::kGraph:
      return "graph";
    case Kind::kIpcExport:
      return "ipc_export";
    case Kind::kCount:
      break;
  }
  return "unknown";
}

bool IsDeviceMemory(Kind kind) {
  return kind == Kind::kDevice || kind == Kind::kPitch || kind == Kind::kAsync ||
         kind == Kind::kVmmPhysical || kind == Kind::kArray || kind == Kind::kGraph;
}

ShimCounters& Counters() { return g_counters; }

void ResetCountersInChild() {
  g_counters.~ShimCounters();
  new (&g_counters) ShimCounters();
}

DeviceCounters& DeviceCountersFor(int device) {
  if (device < 0 || device >= kMaxDevices) device = kMaxDevices - 1;
  return g_counters.device[device];
}

}  // namespace vramscope::interposer
