// A library linked against the other runtime (the fake libcudart.so.12): its cudaMalloc and
// cudaFree references carry the version libcudart.so.12, so they must bind to that runtime and
// not to the shim's libcudart.so.13 exports (runtime_hooks_test).
#include <cuda_runtime_api.h>

extern "C" __attribute__((visibility("default"))) int vs_rt12_malloc(void** p, size_t size) {
  return static_cast<int>(cudaMalloc(p, size));
}
extern "C" __attribute__((visibility("default"))) int vs_rt12_free(void* p) {
  return static_cast<int>(cudaFree(p));
}

extern "C" unsigned long long vramscope_fake_cudart12_calls(const char* name);
extern "C" __attribute__((visibility("default"))) unsigned long long vs_rt12_calls(
    const char* name) {
  return vramscope_fake_cudart12_calls(name);
}
