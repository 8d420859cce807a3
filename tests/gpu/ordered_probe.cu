// ordered_probe: which CUDA runtime calls keep the shim's ordered reuse (interposer/shim/ordered.h)
// and which end it, on the real driver. The runtime reaches the driver through entry points it
// fetched with cuGetProcAddress; ordered reuse is only sound if every launch, copy and stream the
// runtime makes goes through one the shim watches. run_all.sh builds this twice (legacy default
// stream, and --default-stream per-thread) and reads the shim's summary line (ordered=...).
//
// Usage: ordered_probe MODE
//   legacy     kernels, copies and memsets on the default stream, events, a host function:
//              ordered reuse must hold (ordered=on)
//   stream     cudaStreamCreate: must end it (ended:cuStreamCreate)
//   per-thread a kernel on cudaStreamPerThread: must end it
//   graph      a graph captured on a created stream and launched: must end it
// Built with --default-stream per-thread, "legacy" must end it too (the per-thread stream).
// Prints "ordered_probe: MODE sum=..." (the same in every run of a mode).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#define CHECK(call)                                                      \
  do {                                                                   \
    cudaError_t err_ = (call);                                           \
    if (err_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(err_));                            \
      std::exit(2);                                                      \
    }                                                                    \
  } while (0)

__global__ void Scale(float* data, int n, float by) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] = data[i] * by + 1.0f;
}

void HostNote(void* flag) { *static_cast<int*>(flag) = 1; }

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "legacy";
  constexpr int kN = 1 << 20;
  std::vector<float> host(kN, 1.0f);
  float* a = nullptr;
  float* b = nullptr;
  CHECK(cudaMalloc(&a, kN * sizeof(float)));
  CHECK(cudaMalloc(&b, kN * sizeof(float)));
  CHECK(cudaMemcpy(a, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(b, 0, kN * sizeof(float)));
  Scale<<<(kN + 255) / 256, 256>>>(a, kN, 2.0f);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpyAsync(b, a, kN * sizeof(float), cudaMemcpyDeviceToDevice, 0));
  CHECK(cudaMemsetAsync(a, 0, sizeof(float), 0));
  cudaEvent_t done;
  CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  CHECK(cudaEventRecord(done, 0));
  int flag = 0;
  CHECK(cudaLaunchHostFunc(0, HostNote, &flag));
  CHECK(cudaEventSynchronize(done));
  if (std::strcmp(mode, "stream") == 0) {
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    Scale<<<(kN + 255) / 256, 256, 0, s>>>(b, kN, 0.5f);
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaStreamDestroy(s));
  } else if (std::strcmp(mode, "per-thread") == 0) {
    Scale<<<(kN + 255) / 256, 256, 0, cudaStreamPerThread>>>(b, kN, 0.5f);
    CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  } else if (std::strcmp(mode, "graph") == 0) {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    Scale<<<(kN + 255) / 256, 256, 0, s>>>(b, kN, 0.5f);
    CHECK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaStreamDestroy(s));
  }
  CHECK(cudaMemcpy(host.data(), b, kN * sizeof(float), cudaMemcpyDeviceToHost));
  double sum = 0;
  for (float v : host) sum += v;
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  CHECK(cudaEventDestroy(done));
  std::printf("ordered_probe: %s sum=%.1f host_function=%d\n", mode, sum, flag);
  return 0;
}
