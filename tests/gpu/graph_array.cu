// CUDA arrays and graph memory nodes, with the driver's own figures, for tests/gpu/run_all.sh
// (step 10): run it with and without the shim (VRAMSCOPE_SUMMARY=1) and compare the shim's
// array= and graph= figures with the lines printed here.
//
//   graph_array
//
// Arrays: a 4096 x 4096 float array (cudaMallocArray, 64 MiB of texels) and a 256^3 uchar4 3D
// array (cudaMalloc3DArray, 64 MiB), both live at once, then freed. Printed: the texel bytes,
// cudaMemGetInfo's drop while they are live (what the driver took), and what
// cudaArrayGetMemoryRequirements answers (the driver documents it for deferred-mapping arrays
// only; its status says which source the shim used).
// Graph: a stream capture of cudaMallocAsync(32 MiB) + a fill kernel + cudaFreeAsync, instantiated
// and launched twice, then destroyed and trimmed (cudaDeviceGraphMemTrim). Printed: the graph
// pool's reserved bytes after each step (cudaDeviceGetGraphMemAttribute RESERVED_MEM_CURRENT),
// its high-water mark, and cudaMemGetInfo's drop while the graph is instantiated.
//
// Output: `key=value` lines on stdout; exit status 1 on any CUDA error.
#include <stdio.h>

#include <cstdint>

#include <cuda_runtime.h>

namespace {

#define CHECK(call)                                                            \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      fprintf(stderr, "graph_array: %s: %s\n", #call, cudaGetErrorString(e_)); \
      return 1;                                                                \
    }                                                                          \
  } while (0)

size_t FreeBytes() {
  size_t free = 0, total = 0;
  cudaMemGetInfo(&free, &total);
  return free;
}

unsigned long long GraphAttr(cudaGraphMemAttributeType attr) {
  unsigned long long value = 0;
  cudaDeviceGetGraphMemAttribute(0, attr, &value);
  return value;
}

__global__ void Fill(unsigned int* p, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    p[i] = static_cast<unsigned int>(i);
  }
}

}  // namespace

int main() {
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));

  // Arrays.
  const size_t free0 = FreeBytes();
  cudaChannelFormatDesc f32 = cudaCreateChannelDesc<float>();
  cudaChannelFormatDesc u8x4 = cudaCreateChannelDesc<uchar4>();
  cudaArray_t a2 = nullptr;
  cudaArray_t a3 = nullptr;
  CHECK(cudaMallocArray(&a2, &f32, 4096, 4096));
  CHECK(cudaMalloc3DArray(&a3, &u8x4, make_cudaExtent(256, 256, 256)));
  const size_t array_delta = free0 - FreeBytes();
  cudaArrayMemoryRequirements needs2{};
  cudaArrayMemoryRequirements needs3{};
  const cudaError_t r2 = cudaArrayGetMemoryRequirements(&needs2, a2, 0);
  const cudaError_t r3 = cudaArrayGetMemoryRequirements(&needs3, a3, 0);
  cudaGetLastError();  // the requirement queries may fail by design
  printf("array_texel_bytes=%zu\n", size_t{4096} * 4096 * 4 + size_t{256} * 256 * 256 * 4);
  printf("array_driver_delta=%zu\n", array_delta);
  printf("array_requirements_status=%d,%d\n", static_cast<int>(r2), static_cast<int>(r3));
  printf("array_requirements_bytes=%zu\n",
         (r2 == cudaSuccess ? needs2.size : 0) + (r3 == cudaSuccess ? needs3.size : 0));
  CHECK(cudaFreeArray(a2));
  CHECK(cudaFreeArray(a3));
  printf("array_freed_delta=%lld\n",
         static_cast<long long>(free0) - static_cast<long long>(FreeBytes()));

  // Graph memory.
  constexpr size_t kBytes = size_t{32} << 20;
  cudaStream_t s = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t free1 = FreeBytes();
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  unsigned int* p = nullptr;
  CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p), kBytes, s));
  Fill<<<256, 256, 0, s>>>(p, kBytes / sizeof(unsigned int));
  CHECK(cudaFreeAsync(p, s));
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  printf("graph_reserved_after_instantiate=%llu\n", GraphAttr(cudaGraphMemAttrReservedMemCurrent));
  CHECK(cudaGraphLaunch(exec, s));
  CHECK(cudaGraphLaunch(exec, s));
  CHECK(cudaStreamSynchronize(s));
  printf("graph_reserved_after_launch=%llu\n", GraphAttr(cudaGraphMemAttrReservedMemCurrent));
  printf("graph_driver_delta=%lld\n",
         static_cast<long long>(free1) - static_cast<long long>(FreeBytes()));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  printf("graph_reserved_after_destroy=%llu\n", GraphAttr(cudaGraphMemAttrReservedMemCurrent));
  CHECK(cudaDeviceGraphMemTrim(0));
  printf("graph_reserved_after_trim=%llu\n", GraphAttr(cudaGraphMemAttrReservedMemCurrent));
  printf("graph_reserved_high=%llu\n", GraphAttr(cudaGraphMemAttrReservedMemHigh));
  printf("graph_trimmed_delta=%lld\n",
         static_cast<long long>(free1) - static_cast<long long>(FreeBytes()));
  CHECK(cudaStreamDestroy(s));
  return 0;
}
