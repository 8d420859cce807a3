#include "graph_memory.h"

#include <pthread.h>

#include <atomic>

#include "counters.h"
#include "driver.h"
#include "registry.h"
#include "ring_events.h"
#include "state.h"

namespace vramscope::interposer {
namespace {

static_assert(kMaxDevices <= 32, "the device mask is 32 bits");

// Devices with mem-alloc nodes (bit per ordinal); 0 until the first node.
constinit std::atomic<std::uint32_t> g_devices{0};

struct DeviceGraphPool {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  std::uint64_t recorded = 0;  // the reserved bytes last recorded (guarded by mu)
};
constinit DeviceGraphPool g_pools[kMaxDevices] = {};

void Refresh(int device) {
  const RealDriver& real = Real();
  DeviceGraphPool& pool = g_pools[device];
  pthread_mutex_lock(&pool.mu);
  // Read under the lock, so that the records follow the order of the reads: a thread that read
  // an older figure cannot record it after a newer one.
  cuuint64_t now = 0;
  if (real.cuDeviceGetGraphMemAttribute(device, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &now) ==
          CUDA_SUCCESS &&
      now != pool.recorded) {
    const std::uintptr_t key = GraphPoolKey(device);
    if (pool.recorded != 0) (void)RecordFree(RegistryId::kGraphPools, key);
    if (now != 0) {
      AllocOrigin origin;
      origin.device = device;
      RecordAlloc(RegistryId::kGraphPools, key, now, Kind::kGraph, origin);
    }
    pool.recorded = now;
  }
  pthread_mutex_unlock(&pool.mu);
}

}  // namespace

void NoteGraphMemAllocNode(int device) {
  if (device < 0) device = CurrentDeviceOrZero();
  if (device >= kMaxDevices) device = kMaxDevices - 1;
  const std::uint32_t bit = 1u << device;
  if ((g_devices.load(std::memory_order_relaxed) & bit) == 0) {
    g_devices.fetch_or(bit, std::memory_order_relaxed);
  }
}

void RefreshGraphMemory(int also_device) {
  std::uint32_t devices = g_devices.load(std::memory_order_relaxed);
  if (__builtin_expect(devices == 0, 1)) return;
  if (!Active() || Real().cuDeviceGetGraphMemAttribute == nullptr) return;
  if (also_device >= 0 && also_device < kMaxDevices) devices |= 1u << also_device;
  for (int device = 0; devices != 0; ++device, devices >>= 1) {
    if ((devices & 1u) != 0) Refresh(device);
  }
}

void LockGraphMemoryForFork() {
  for (DeviceGraphPool& pool : g_pools) pthread_mutex_lock(&pool.mu);
}

void UnlockGraphMemoryAfterFork() {
  for (DeviceGraphPool& pool : g_pools) pthread_mutex_unlock(&pool.mu);
}

void ResetGraphMemoryInChild() {
  // The child holds no graph memory (its registries are cleared alongside).
  UnlockGraphMemoryAfterFork();
  for (DeviceGraphPool& pool : g_pools) pool.recorded = 0;
  g_devices.store(0, std::memory_order_relaxed);
}

}  // namespace vramscope::interposer
