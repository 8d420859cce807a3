// nvtx_phases: a training-loop-shaped CUDA program with nested NVTX ranges whose per-range
// memory figures are known in advance. It prints them, so `vramscope run --json` can be checked
// against the truth (tests/gpu/run_all.sh, step "NVTX phases").
//
// NVTX is header-only (nvtx3, shipped with the CUDA toolkit): nothing to link; without a tool
// attached the ranges cost nothing. Under `vramscope run` they arrive through
// NVTX_INJECTION64_PATH. Every size is a multiple of 2 MiB, so the pool's rounding adds nothing.
//
// Output: one `expect name=N domain=D count=C peak=P net=G allocs=A` line per range (peak
// allocated bytes while open, net growth summed over instances, allocations made with the range
// innermost), then `checksum=...`.
// Usage: nvtx_phases [STEPS] (default 3)
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#define CHECK(call)                                                             \
  do {                                                                          \
    cudaError_t err_ = (call);                                                  \
    if (err_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(err_));                                   \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

namespace {

constexpr long long kMiB = 1 << 20;

__global__ void Touch(unsigned char* data, std::size_t n, unsigned char value) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    data[i] = value;
  }
}

unsigned char* Alloc(long long bytes, unsigned char value) {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, static_cast<std::size_t>(bytes)));
  Touch<<<256, 256>>>(static_cast<unsigned char*>(p), static_cast<std::size_t>(bytes), value);
  CHECK(cudaGetLastError());
  return static_cast<unsigned char*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 3;
  if (steps < 1) {
    std::fprintf(stderr, "usage: nvtx_phases [STEPS >= 1]\n");
    return 2;
  }
  CHECK(cudaFree(nullptr));  // context first: the figures below start from nothing allocated
  nvtxDomainHandle_t eval_domain = nvtxDomainCreateA("nvtx_phases");

  nvtxRangePushA("load");
  unsigned char* weights = Alloc(64 * kMiB, 1);
  nvtxRangePop();

  nvtxRangePushA("train");
  for (int s = 0; s < steps; ++s) {
    nvtxRangePushA("step");
    nvtxRangePushA("forward");
    unsigned char* act1 = Alloc(32 * kMiB, 2);
    unsigned char* act2 = Alloc(16 * kMiB, 3);
    nvtxRangePop();
    nvtxRangePushA("backward");
    unsigned char* grad = Alloc(64 * kMiB, 4);
    CHECK(cudaFree(act2));
    CHECK(cudaFree(act1));
    nvtxRangePop();
    nvtxRangePushA("optimizer");
    unsigned char* tmp = Alloc(8 * kMiB, 5);
    CHECK(cudaFree(tmp));
    CHECK(cudaFree(grad));
    nvtxRangePop();
    nvtxRangePop();  // step
  }
  nvtxRangePop();  // train

  nvtxEventAttributes_t attrib = {};
  attrib.version = NVTX_VERSION;
  attrib.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attrib.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attrib.message.ascii = "eval";
  nvtxDomainRangePushEx(eval_domain, &attrib);
  unsigned char* big = Alloc(128 * kMiB, 6);
  unsigned char host = 0;
  CHECK(cudaMemcpy(&host, big + 12345, 1, cudaMemcpyDeviceToHost));
  CHECK(cudaFree(big));
  nvtxDomainRangePop(eval_domain);

  unsigned char w = 0;
  CHECK(cudaMemcpy(&w, weights, 1, cudaMemcpyDeviceToHost));
  CHECK(cudaFree(weights));

  // Allocated bytes: weights 64 MiB throughout; per step forward +48, backward +64 -48,
  // optimizer +8 -8 -64.
  const long long n = steps;
  std::printf("expect name=load domain= count=1 peak=%lld net=%lld allocs=1\n", 64 * kMiB,
              64 * kMiB);
  std::printf("expect name=train domain= count=1 peak=%lld net=0 allocs=0\n", 176 * kMiB);
  std::printf("expect name=step domain= count=%lld peak=%lld net=0 allocs=0\n", n, 176 * kMiB);
  std::printf("expect name=forward domain= count=%lld peak=%lld net=%lld allocs=%lld\n", n,
              112 * kMiB, n * 48 * kMiB, 2 * n);
  std::printf("expect name=backward domain= count=%lld peak=%lld net=%lld allocs=%lld\n", n,
              176 * kMiB, n * 16 * kMiB, n);
  std::printf("expect name=optimizer domain= count=%lld peak=%lld net=%lld allocs=%lld\n", n,
              136 * kMiB, n * -64 * kMiB, n);
  std::printf("expect name=eval domain=nvtx_phases count=1 peak=%lld net=0 allocs=1\n", 192 * kMiB);
  std::printf("checksum=%u\n", static_cast<unsigned>(host) * 256u + w);
  return host == 6 && w == 1 ? 0 : 1;
}
