// Helpers shared by the hook translation units (hooks_*.cc): the exported-symbol macro and the
// prologue every hook runs.
#pragma once

#include "config.h"
#include "driver.h"
#include "shim.h"

#define VRAMSCOPE_EXPORT extern "C" __attribute__((visibility("default")))

// Loads the real driver if needed and binds `real` to its table. A hook whose driver function
// is missing answers CUDA_ERROR_NOT_FOUND (only reachable by linking against a newer driver).
#define VRAMSCOPE_PROLOGUE(name)                                                     \
  if (!::vramscope::interposer::EnsureDriver()) return CUDA_ERROR_NOT_INITIALIZED;   \
  const ::vramscope::interposer::RealDriver& real = ::vramscope::interposer::Real(); \
  if (real.name == nullptr) return CUDA_ERROR_NOT_FOUND

namespace vramscope::interposer {

// Calls `call` and, if the driver ran out of memory while the pools hold idle memory, gives
// that memory back and calls it once more.
template <typename Call>
CUresult WithOomRetry(Call&& call);

bool FlushCachesForRetry();

template <typename Call>
CUresult WithOomRetry(Call&& call) {
  CUresult result = call();
  if (result == CUDA_ERROR_OUT_OF_MEMORY && Active() && FlushCachesForRetry()) result = call();
  return result;
}

}  // namespace vramscope::interposer
