// The driver's own view of this machine's GPUs for `vramscope top`: each GPU's capacity and
// used memory, and the memory of every process on it (traced or not), from NVML. NVML
// (libnvidia-ml.so.1, installed with the NVIDIA driver) is loaded with dlopen when `top` starts;
// where it is absent or cannot start (no driver, a container without it) Load returns null and
// the dashboard shows no GPU lines and no untraced row. VRAMSCOPE_NVML_LIBRARY names another
// library to load (the tests' fake one).
//
// Thread safety: one thread uses an instance. Errors: Query returns what it could read; a GPU
// whose memory NVML cannot read is left out, a process whose memory it cannot see (another
// user's, in some containers) counts with used_bytes 0 and known false.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace vramscope::cli::top {

struct GpuProcess {
  std::uint32_t pid = 0;
  std::uint64_t used_bytes = 0;
  bool known = true;  // NVML reported its memory (it may not, for processes of other users)
};

struct GpuMemory {
  std::uint32_t index = 0;  // NVML's index (PCI order)
  std::string uuid;         // "GPU-...", as DeviceInfo.uuid
  std::string name;
  std::uint64_t total_bytes = 0;
  std::uint64_t used_bytes = 0;
  std::vector<GpuProcess> processes;  // compute processes using it
};

class Nvml {
 public:
  // The library and its session, or null (with the reason in `why`, for --verbose/tests).
  static std::unique_ptr<Nvml> Load(std::string* why = nullptr);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  std::vector<GpuMemory> Query();

 private:
  struct Api;
  explicit Nvml(void* library, std::unique_ptr<Api> api);
  void* library_;
  std::unique_ptr<Api> api_;
};

}  // namespace vramscope::cli::top
