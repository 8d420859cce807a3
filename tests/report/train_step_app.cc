// A GPT-2-shaped training loop for the HTML report's screenshots (docs/report-*.png): run under
// `vramscope run --stacks` over the fake driver (tests/fakes; no GPU), it allocates with
// cuMemAlloc_v2 like a model would: weights at load, then per step activations in "forward"
// (freed in reverse in "backward", where gradients appear), and optimizer state once in
// "optimizer". Sizes are GPT-2 small's (12 layers, 768 wide, batch 4 x 256 tokens, fp32) divided
// by 4, so the run stays small on the host memory that backs the fake.
//
//   train_step_app [STEPS]   (default 3) exits 0, or 1 with a message when a CUDA call fails.
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include <cuda.h>
#include <nvtx3/nvToolsExt.h>

namespace {

constexpr int kLayers = 12;
constexpr size_t kWidth = 768;
constexpr size_t kTokens = 4 * 256;
constexpr size_t kScale = 4;  // every size divided by this
constexpr size_t kFloat = 4;

void Fail(const char* what) {
  fprintf(stderr, "train_step_app: %s failed\n", what);
  exit(1);
}

inline __attribute__((always_inline)) CUdeviceptr Alloc(size_t bytes, const char* what) {
  CUdeviceptr p = 0;
  if (cuMemAlloc_v2(&p, bytes / kScale) != CUDA_SUCCESS) Fail(what);
  return p;
}
// Not inlined, each its own call of the inlined Alloc (and its own message, so the compiler
// cannot fold them into one): the allocation sites (--stacks) name these functions.
__attribute__((noinline)) CUdeviceptr Weight(size_t bytes) { return Alloc(bytes, "Weight"); }
__attribute__((noinline)) CUdeviceptr Activation(size_t bytes) {
  return Alloc(bytes, "Activation");
}
__attribute__((noinline)) CUdeviceptr Logits(size_t bytes) { return Alloc(bytes, "Logits"); }
__attribute__((noinline)) CUdeviceptr Gradient(size_t bytes) { return Alloc(bytes, "Gradient"); }
__attribute__((noinline)) CUdeviceptr OptimizerState(size_t bytes) {
  return Alloc(bytes, "OptimizerState");
}

void Free(CUdeviceptr p) {
  if (cuMemFree_v2(p) != CUDA_SUCCESS) Fail("cuMemFree_v2");
}

// Per layer: attention (qkv, proj) and MLP (fc, proj) weights.
const size_t kLayerWeights[] = {kWidth * 3 * kWidth * kFloat, kWidth* kWidth* kFloat,
                                kWidth * 4 * kWidth* kFloat, 4 * kWidth* kWidth* kFloat};
// Per layer: activations kept for backward (qkv, attention scores, MLP hidden, output).
const size_t kLayerActivations[] = {kTokens * 3 * kWidth * kFloat, 4 * 12 * 256 * 256 * kFloat,
                                    kTokens * 4 * kWidth* kFloat, kTokens* kWidth* kFloat};

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? atoi(argv[1]) : 3;
  CUdevice device;
  CUcontext ctx;
  if (cuInit(0) != CUDA_SUCCESS) Fail("cuInit");
  if (cuDeviceGet(&device, 0) != CUDA_SUCCESS) Fail("cuDeviceGet");
  if (cuDevicePrimaryCtxRetain(&ctx, device) != CUDA_SUCCESS) Fail("cuDevicePrimaryCtxRetain");
  if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) Fail("cuCtxSetCurrent");

  std::vector<CUdeviceptr> weights, grads, state;
  std::vector<size_t> weight_bytes;
  nvtxRangePushA("load");
  weight_bytes.push_back(50257 * kWidth * kFloat);  // token embedding
  weights.push_back(Weight(weight_bytes.back()));
  for (int l = 0; l < kLayers; ++l) {
    for (size_t bytes : kLayerWeights) {
      weight_bytes.push_back(bytes);
      weights.push_back(Weight(bytes));
    }
  }
  nvtxRangePop();

  for (int s = 0; s < steps; ++s) {
    nvtxRangePushA("step");
    std::vector<CUdeviceptr> saved;
    nvtxRangePushA("forward");
    for (int l = 0; l < kLayers; ++l) {
      for (size_t bytes : kLayerActivations) saved.push_back(Activation(bytes));
    }
    CUdeviceptr logits = Logits(kTokens * 50257 * kFloat);
    nvtxRangePop();
    nvtxRangePushA("backward");
    CUdeviceptr dlogits = Gradient(kTokens * 50257 * kFloat);
    Free(logits);
    if (grads.empty()) {
      for (size_t bytes : weight_bytes) grads.push_back(Gradient(bytes));
    }
    while (!saved.empty()) {
      Free(saved.back());
      saved.pop_back();
    }
    Free(dlogits);
    nvtxRangePop();
    nvtxRangePushA("optimizer");
    if (state.empty()) {
      for (size_t bytes : weight_bytes) {
        state.push_back(OptimizerState(bytes));  // Adam: first and second moments
        state.push_back(OptimizerState(bytes));
      }
    }
    nvtxRangePop();
    nvtxRangePop();
  }
  for (CUdeviceptr p : state) Free(p);
  for (CUdeviceptr p : grads) Free(p);
  for (CUdeviceptr p : weights) Free(p);
  return 0;
}
