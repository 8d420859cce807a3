#include "top/nvml.h"

#include <absl/strings/str_cat.h>
#include <dlfcn.h>
#include <stdlib.h>

#include <climits>

namespace vramscope::cli::top {
namespace {

// NVML's C ABI, the few calls used (nvml.h; stable since the _v2/_v3 names).
using Return = int;  // nvmlReturn_t: 0 success
constexpr Return kSuccess = 0;
constexpr Return kInsufficientSize = 7;
using Device = struct DeviceOpaque*;
struct Memory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct ProcessInfo {  // nvmlProcessInfo_v2_t, what the _v3 call fills
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
constexpr unsigned long long kValueNotAvailable = ULLONG_MAX;

}  // namespace

struct Nvml::Api {
  Return (*init)();
  Return (*shutdown)();
  Return (*count)(unsigned int*);
  Return (*handle)(unsigned int, Device*);
  Return (*memory)(Device, Memory*);
  Return (*name)(Device, char*, unsigned int);
  Return (*uuid)(Device, char*, unsigned int);
  Return (*processes)(Device, unsigned int*, ProcessInfo*);
};

std::unique_ptr<Nvml> Nvml::Load(std::string* why) {
  const char* path = getenv("VRAMSCOPE_NVML_LIBRARY");
  if (path == nullptr || path[0] == '\0') path = "libnvidia-ml.so.1";
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    if (why != nullptr) *why = absl::StrCat("cannot load ", path, ": ", dlerror());
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  bool complete = true;
  auto bind = [&](auto* slot, const char* symbol) {
    void* address = dlsym(library, symbol);
    complete &= address != nullptr;
    *slot = reinterpret_cast<std::remove_pointer_t<decltype(slot)>>(address);
  };
  bind(&api->init, "nvmlInit_v2");
  bind(&api->shutdown, "nvmlShutdown");
  bind(&api->count, "nvmlDeviceGetCount_v2");
  bind(&api->handle, "nvmlDeviceGetHandleByIndex_v2");
  bind(&api->memory, "nvmlDeviceGetMemoryInfo");
  bind(&api->name, "nvmlDeviceGetName");
  bind(&api->uuid, "nvmlDeviceGetUUID");
  bind(&api->processes, "nvmlDeviceGetComputeRunningProcesses_v3");
  if (!complete) {
    if (why != nullptr) *why = absl::StrCat(path, " lacks an NVML call vramscope uses");
    dlclose(library);
    return nullptr;
  }
  if (const Return r = api->init(); r != kSuccess) {
    if (why != nullptr) *why = absl::StrCat("nvmlInit_v2 failed (", r, ")");
    dlclose(library);
    return nullptr;
  }
  return std::unique_ptr<Nvml>(new Nvml(library, std::move(api)));
}

Nvml::Nvml(void* library, std::unique_ptr<Api> api) : library_(library), api_(std::move(api)) {}

Nvml::~Nvml() {
  api_->shutdown();
  dlclose(library_);
}

std::vector<GpuMemory> Nvml::Query() {
  std::vector<GpuMemory> out;
  unsigned int count = 0;
  if (api_->count(&count) != kSuccess) return out;
  for (unsigned int i = 0; i < count; ++i) {
    Device device = nullptr;
    Memory memory{};
    if (api_->handle(i, &device) != kSuccess || api_->memory(device, &memory) != kSuccess) {
      continue;
    }
    GpuMemory gpu;
    gpu.index = i;
    gpu.total_bytes = memory.total;
    gpu.used_bytes = memory.used;
    char text[96] = {};
    if (api_->uuid(device, text, sizeof(text) - 1) == kSuccess) gpu.uuid = text;
    char name[96] = {};
    if (api_->name(device, name, sizeof(name) - 1) == kSuccess) gpu.name = name;
    // The list can grow between the two calls: ask again with the size NVML asks for.
    std::vector<ProcessInfo> infos(16);
    for (int attempt = 0; attempt < 4; ++attempt) {
      unsigned int n = static_cast<unsigned int>(infos.size());
      const Return r = api_->processes(device, &n, infos.data());
      if (r == kInsufficientSize) {
        infos.resize(static_cast<std::size_t>(n) + 8);
        continue;
      }
      if (r != kSuccess) n = 0;
      for (unsigned int k = 0; k < n && k < infos.size(); ++k) {
        const bool known = infos[k].used_gpu_memory != kValueNotAvailable;
        gpu.processes.push_back({infos[k].pid, known ? infos[k].used_gpu_memory : 0, known});
      }
      break;
    }
    out.push_back(std::move(gpu));
  }
  return out;
}

}  // namespace vramscope::cli::top
