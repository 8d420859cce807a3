// cuGetProcAddress (CUDA 11.3 ABI, 4 arguments) and cuGetProcAddress_v2 (5 arguments): the
// route of the CUDA runtime (static and shared), cuDNN and CuPy, and of
// cudaGetDriverEntryPoint[ByVersion]. The real function answers first, with the caller's exact
// arguments (so symbol status, version errors and NULL for unknown names stay the driver's);
// the pointer it returns is then matched by identity against the driver's exported functions
// (driver.h): for an entry point the shim hooks, the shim's wrapper of that exact ABI is
// returned (cuGetProcAddress itself included, so later lookups come back here); anything else
// is returned unchanged and, at debug level, logged once so new driver variants show up.
#include "driver.h"
#include "hooks.h"

using namespace vramscope::interposer;

namespace vramscope::interposer {
namespace {

void Substitute(const char* route, const char* symbol, void** pfn) {
  if (pfn == nullptr || *pfn == nullptr) return;
  if (void* wrapper = WrapperFor(*pfn); wrapper != nullptr) {
    *pfn = wrapper;
    return;
  }
  NoteUnwrapped(route, symbol, *pfn);
}

}  // namespace
}  // namespace vramscope::interposer

VRAMSCOPE_EXPORT CUresult CUDAAPI
cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                    CUdriverProcAddressQueryResult* symbolStatus) {
  VRAMSCOPE_PROLOGUE(cuGetProcAddress_v2);
  const CUresult result = real.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
  if (result == CUDA_SUCCESS) Substitute("cuGetProcAddress_v2", symbol, pfn);
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                                   cuuint64_t flags) {
  VRAMSCOPE_PROLOGUE(cuGetProcAddress);
  const CUresult result = real.cuGetProcAddress(symbol, pfn, cudaVersion, flags);
  if (result == CUDA_SUCCESS) Substitute("cuGetProcAddress", symbol, pfn);
  return result;
}
