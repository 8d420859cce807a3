// cuStreamDestroy[_v2]: a stream destroyed while it has work the next event fence must cover
// gets its event first (stream_fence.h); the work still runs after the destroy returns.
#include "exports.h"
#include "hooks.h"
#include "stream_fence.h"

using namespace vramscope::interposer;

VRAMSCOPE_EXPORT CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) {
  VRAMSCOPE_PROLOGUE(cuStreamDestroy_v2);
  BeforeStreamDestroy(hStream);
  return real.cuStreamDestroy_v2(hStream);
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuStreamDestroy(CUstream hStream) {
  VRAMSCOPE_PROLOGUE(cuStreamDestroy);
  BeforeStreamDestroy(hStream);
  return real.cuStreamDestroy(hStream);
}
