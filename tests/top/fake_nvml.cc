// A stand-in for libnvidia-ml.so.1 (NVML) for `vramscope top`'s tests: the calls
// viewer-cli/top/nvml.cc makes, answering from VRAMSCOPE_FAKE_NVML, read at nvmlInit_v2:
//   GPU;GPU;...   GPU = UUID|NAME|TOTAL|USED|PID:BYTES,PID:BYTES,...   (BYTES "-": not available)
// VRAMSCOPE_FAKE_NVML_FAIL=init makes nvmlInit_v2 fail (NVML_ERROR_DRIVER_NOT_LOADED, 9).
#include <stdlib.h>
#include <string.h>

#include <climits>
#include <string>
#include <vector>

namespace {

struct Process {
  unsigned int pid;
  unsigned long long bytes;
};
struct Gpu {
  std::string uuid, name;
  unsigned long long total = 0, used = 0;
  std::vector<Process> processes;
};
std::vector<Gpu> g_gpus;

std::vector<std::string> Split(const std::string& text, char separator) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = text.find(separator, start);
    out.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

void Parse(const char* spec) {
  g_gpus.clear();
  if (spec == nullptr || spec[0] == '\0') return;
  for (const std::string& gpu_text : Split(spec, ';')) {
    const std::vector<std::string> fields = Split(gpu_text, '|');
    if (fields.size() < 4) continue;
    Gpu gpu;
    gpu.uuid = fields[0];
    gpu.name = fields[1];
    gpu.total = strtoull(fields[2].c_str(), nullptr, 10);
    gpu.used = strtoull(fields[3].c_str(), nullptr, 10);
    if (fields.size() > 4 && !fields[4].empty()) {
      for (const std::string& p : Split(fields[4], ',')) {
        const std::size_t colon = p.find(':');
        if (colon == std::string::npos) continue;
        const std::string bytes = p.substr(colon + 1);
        gpu.processes.push_back({static_cast<unsigned int>(strtoul(p.c_str(), nullptr, 10)),
                                 bytes == "-" ? ULLONG_MAX : strtoull(bytes.c_str(), nullptr, 10)});
      }
    }
    g_gpus.push_back(gpu);
  }
}

struct Memory {
  unsigned long long total, free, used;
};
struct ProcessInfo {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id, compute_instance_id;
};

int CopyText(const std::string& text, char* out, unsigned int length) {
  if (text.size() + 1 > length) return 7;  // NVML_ERROR_INSUFFICIENT_SIZE
  memcpy(out, text.c_str(), text.size() + 1);
  return 0;
}

}  // namespace

extern "C" {

int nvmlInit_v2() {
  const char* fail = getenv("VRAMSCOPE_FAKE_NVML_FAIL");
  if (fail != nullptr && strcmp(fail, "init") == 0) return 9;
  Parse(getenv("VRAMSCOPE_FAKE_NVML"));
  return 0;
}
int nvmlShutdown() { return 0; }
int nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = static_cast<unsigned int>(g_gpus.size());
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (index >= g_gpus.size()) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *device = &g_gpus[index];
  return 0;
}
int nvmlDeviceGetMemoryInfo(void* device, Memory* memory) {
  const Gpu* gpu = static_cast<const Gpu*>(device);
  *memory = {gpu->total, gpu->total - gpu->used, gpu->used};
  return 0;
}
int nvmlDeviceGetName(void* device, char* name, unsigned int length) {
  return CopyText(static_cast<const Gpu*>(device)->name, name, length);
}
int nvmlDeviceGetUUID(void* device, char* uuid, unsigned int length) {
  return CopyText(static_cast<const Gpu*>(device)->uuid, uuid, length);
}
int nvmlDeviceGetComputeRunningProcesses_v3(void* device, unsigned int* count, ProcessInfo* infos) {
  const Gpu* gpu = static_cast<const Gpu*>(device);
  if (*count < gpu->processes.size()) {
    *count = static_cast<unsigned int>(gpu->processes.size());
    return 7;  // NVML_ERROR_INSUFFICIENT_SIZE
  }
  *count = static_cast<unsigned int>(gpu->processes.size());
  for (std::size_t i = 0; i < gpu->processes.size(); ++i) {
    infos[i] = {gpu->processes[i].pid, gpu->processes[i].bytes, 0, 0};
  }
  return 0;
}

}  // extern "C"
