// A shared library with its own header-only NVTX copy (hidden visibility keeps it separate from
// nvtx_app's), so two NVTX copies in one process each initialise the injection: the shim's
// InitializeInjectionNvtx2 runs twice and both copies' ranges must arrive.
#include <cuda.h>
#include <nvtx3/nvToolsExt.h>

extern "C" __attribute__((visibility("default"))) int NvtxCopyPhase(size_t bytes) {
  const int level = nvtxRangePushA("lib_phase");
  if (level != 0 && level != NVTX_NO_PUSH_POP_TRACKING) return 1;
  CUdeviceptr p = 0;
  if (cuMemAlloc_v2(&p, bytes) != CUDA_SUCCESS || cuMemFree_v2(p) != CUDA_SUCCESS) return 1;
  const int popped = nvtxRangePop();
  return popped == 0 || popped == NVTX_NO_PUSH_POP_TRACKING ? 0 : 1;
}
