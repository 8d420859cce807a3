// What the driver's virtual-memory calls cost the program, with the GPU idle and with the GPU busy
// on a kernel that runs for a known time: does cuMemCreate + cuMemMap + cuMemSetAccess, or
// cuMemUnmap, wait for the GPU? A call that waits takes about as long as the kernel has left;
// one that does not takes its idle time. This is why the vmm pool should not unmap and map again
// every step (run_all.sh section 7b).
//
//   vmm_cost [MiB=64] [REPS=20] [BUSY_MS=20]
//
// Prints one line per call: idle and busy microseconds (median of REPS), and "waits" when the busy
// figure is over half the kernel's time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>

namespace {

__global__ void Spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

#define CHECK(call)                                                           \
  do {                                                                        \
    CUresult r_ = (call);                                                     \
    if (r_ != CUDA_SUCCESS) {                                                 \
      std::fprintf(stderr, "%s failed: %d (line %d)\n", #call, r_, __LINE__); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

double NowUs() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Vmm {
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};
  std::size_t bytes = 0;
  CUdeviceptr va = 0;

  void Map() {
    CUmemGenericAllocationHandle h = 0;
    CHECK(cuMemCreate(&h, bytes, &prop, 0));
    CHECK(cuMemMap(va, bytes, 0, h, 0));
    CHECK(cuMemRelease(h));
    CHECK(cuMemSetAccess(va, bytes, &access, 1));
  }
  void Unmap() { CHECK(cuMemUnmap(va, bytes)); }
};

}  // namespace

int main(int argc, char** argv) {
  const std::size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 64;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  const double busy_ms = argc > 3 ? std::atof(argv[3]) : 20;
  if (cudaFree(nullptr) != cudaSuccess) return 1;
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  const long long cycles = static_cast<long long>(busy_ms * clock_khz);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);

  Vmm vmm;
  vmm.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  vmm.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  vmm.prop.location.id = 0;
  // As the shim's pool maps it: exportable to other processes (cuMemExportToShareableHandle).
  vmm.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  vmm.access.location = vmm.prop.location;
  vmm.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  std::size_t granularity = 0;
  CHECK(cuMemGetAllocationGranularity(&granularity, &vmm.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  vmm.bytes = (mib << 20) / granularity * granularity;
  CHECK(cuMemAddressReserve(&vmm.va, vmm.bytes, 0, 0, 0));

  std::vector<double> map_idle, unmap_idle, map_busy, unmap_busy;
  for (int i = 0; i < reps; ++i) {
    cudaStreamSynchronize(stream);
    double t = NowUs();
    vmm.Map();
    map_idle.push_back(NowUs() - t);
    t = NowUs();
    vmm.Unmap();
    unmap_idle.push_back(NowUs() - t);

    Spin<<<1, 1, 0, stream>>>(cycles);
    t = NowUs();
    vmm.Map();
    map_busy.push_back(NowUs() - t);
    cudaStreamSynchronize(stream);
    Spin<<<1, 1, 0, stream>>>(cycles);
    t = NowUs();
    vmm.Unmap();
    unmap_busy.push_back(NowUs() - t);
  }
  cudaStreamSynchronize(stream);
  const double busy_us = busy_ms * 1000;
  auto line = [&](const char* name, const std::vector<double>& idle,
                  const std::vector<double>& busy) {
    const double b = Median(busy);
    std::printf("vmm_cost: %s bytes=%zu idle_us=%.1f busy_us=%.1f kernel_us=%.0f %s\n", name,
                vmm.bytes, Median(idle), b, busy_us, b > busy_us / 2 ? "waits" : "no_wait");
  };
  line("create+map+access", map_idle, map_busy);
  line("unmap", unmap_idle, unmap_busy);
  CHECK(cuMemAddressFree(vmm.va, vmm.bytes));
  return 0;
}
