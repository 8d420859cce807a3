// Stream capture bookkeeping, the application's own synchronisation, and context teardown.
#include "capture.h"
#include "counters.h"
#include "device_pools.h"
#include "hooks.h"
#include "ordered.h"

using namespace vramscope::interposer;

VRAMSCOPE_EXPORT CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream) {
  VRAMSCOPE_PROLOGUE(cuStreamBeginCapture);
  WatchStream(hStream, false, "cuStreamBeginCapture");
  const CUresult result = real.cuStreamBeginCapture(hStream);
  NoteCaptureBegin(result);
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hStream) {
  VRAMSCOPE_PROLOGUE(cuStreamBeginCapture_ptsz);
  WatchStream(hStream, true, "cuStreamBeginCapture_ptsz");
  const CUresult result = real.cuStreamBeginCapture_ptsz(hStream);
  NoteCaptureBegin(result);
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream,
                                                          CUstreamCaptureMode mode) {
  VRAMSCOPE_PROLOGUE(cuStreamBeginCapture_v2);
  WatchStream(hStream, false, "cuStreamBeginCapture_v2");
  const CUresult result = real.cuStreamBeginCapture_v2(hStream, mode);
  NoteCaptureBegin(result);
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream,
                                                               CUstreamCaptureMode mode) {
  VRAMSCOPE_PROLOGUE(cuStreamBeginCapture_v2_ptsz);
  WatchStream(hStream, true, "cuStreamBeginCapture_v2_ptsz");
  const CUresult result = real.cuStreamBeginCapture_v2_ptsz(hStream, mode);
  NoteCaptureBegin(result);
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                                              const CUgraphNode* dependencies,
                                                              const CUgraphEdgeData* dependencyData,
                                                              size_t numDependencies,
                                                              CUstreamCaptureMode mode) {
  VRAMSCOPE_PROLOGUE(cuStreamBeginCaptureToGraph);
  WatchStream(hStream, false, "cuStreamBeginCaptureToGraph");
  const CUresult result = real.cuStreamBeginCaptureToGraph(hStream, hGraph, dependencies,
                                                           dependencyData, numDependencies, mode);
  NoteCaptureBegin(result);
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(
    CUstream hStream, CUgraph hGraph, const CUgraphNode* dependencies,
    const CUgraphEdgeData* dependencyData, size_t numDependencies, CUstreamCaptureMode mode) {
  VRAMSCOPE_PROLOGUE(cuStreamBeginCaptureToGraph_ptsz);
  WatchStream(hStream, true, "cuStreamBeginCaptureToGraph_ptsz");
  const CUresult result = real.cuStreamBeginCaptureToGraph_ptsz(
      hStream, hGraph, dependencies, dependencyData, numDependencies, mode);
  NoteCaptureBegin(result);
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  VRAMSCOPE_PROLOGUE(cuStreamEndCapture);
  const CUresult result = real.cuStreamEndCapture(hStream, phGraph);
  NoteCaptureEnd(result);
  return result;
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  VRAMSCOPE_PROLOGUE(cuStreamEndCapture_ptsz);
  const CUresult result = real.cuStreamEndCapture_ptsz(hStream, phGraph);
  NoteCaptureEnd(result);
  return result;
}

namespace vramscope::interposer {
namespace {

// The application waits for the whole context `ctx` (null: none, or not pooled): every free
// fence of its pool issued before the call is complete once `sync` returns successfully, so no
// synchronisation of the shim's own is needed.
template <typename Sync>
CUresult UserSync(CUcontext ctx, Sync&& sync) {
  Slot* slot = Active() && ctx != nullptr ? ExistingSlot(ctx) : nullptr;
  if (slot == nullptr || slot->pool == nullptr) return sync();
  const std::uint64_t epoch = slot->fences.BeginUserSync();
  const CUresult result = sync();
  slot->fences.EndUserSync(epoch, result);
  return result;
}

CUcontext CurrentContext() {
  CUcontext ctx = nullptr;
  return Real().cuCtxGetCurrent(&ctx) == CUDA_SUCCESS ? ctx : nullptr;
}

}  // namespace
}  // namespace vramscope::interposer

VRAMSCOPE_EXPORT CUresult CUDAAPI cuCtxSynchronize() {
  VRAMSCOPE_PROLOGUE(cuCtxSynchronize);
  return UserSync(Active() ? CurrentContext() : nullptr, [&] { return real.cuCtxSynchronize(); });
}

// CUDA 13's variant names the context (NULL: the current one); cudaDeviceSynchronize of a
// CUDA 13 runtime arrives here (cuGetProcAddress at 13000).
VRAMSCOPE_EXPORT CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  VRAMSCOPE_PROLOGUE(cuCtxSynchronize_v2);
  const CUcontext target = ctx != nullptr || !Active() ? ctx : CurrentContext();
  return UserSync(target, [&] { return real.cuCtxSynchronize_v2(ctx); });
}

namespace vramscope::interposer {
namespace {

// A reset frees every allocation of the primary context: the pool's memory is gone with it, so
// the pool is dropped without a driver call (before, so no thread takes a block that is about
// to vanish, and after, for a pool a racing thread created meanwhile).
CUresult PrimaryReset(decltype(&::cuDevicePrimaryCtxReset_v2) reset, CUdevice dev) {
  if (Active() || Exiting()) DropPrimaryContext(dev, /*context_alive=*/true);
  const CUresult result = reset(dev);
  if (Active() || Exiting()) DropPrimaryContext(dev, /*context_alive=*/false);
  return result;
}

// The last release destroys the primary context (and its memory).
CUresult PrimaryRelease(decltype(&::cuDevicePrimaryCtxRelease_v2) release, CUdevice dev) {
  const CUresult result = release(dev);
  const RealDriver& real = Real();
  if (result == CUDA_SUCCESS && (Active() || Exiting()) &&
      real.cuDevicePrimaryCtxGetState != nullptr) {
    unsigned int flags = 0;
    int active = 1;
    if (real.cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && !active) {
      DropPrimaryContext(dev, /*context_alive=*/false);
    }
  }
  return result;
}

CUresult Destroy(decltype(&::cuCtxDestroy_v2) destroy, CUcontext ctx) {
  const CUresult result = destroy(ctx);
  if (result == CUDA_SUCCESS && (Active() || Exiting())) DropContext(ctx);
  return result;
}

}  // namespace
}  // namespace vramscope::interposer

VRAMSCOPE_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  VRAMSCOPE_PROLOGUE(cuDevicePrimaryCtxReset_v2);
  return PrimaryReset(real.cuDevicePrimaryCtxReset_v2, dev);
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) {
  VRAMSCOPE_PROLOGUE(cuDevicePrimaryCtxReset);
  return PrimaryReset(real.cuDevicePrimaryCtxReset, dev);
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  VRAMSCOPE_PROLOGUE(cuDevicePrimaryCtxRelease_v2);
  return PrimaryRelease(real.cuDevicePrimaryCtxRelease_v2, dev);
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
  VRAMSCOPE_PROLOGUE(cuDevicePrimaryCtxRelease);
  return PrimaryRelease(real.cuDevicePrimaryCtxRelease, dev);
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
  VRAMSCOPE_PROLOGUE(cuCtxDestroy_v2);
  return Destroy(real.cuCtxDestroy_v2, ctx);
}

VRAMSCOPE_EXPORT CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) {
  VRAMSCOPE_PROLOGUE(cuCtxDestroy);
  return Destroy(real.cuCtxDestroy, ctx);
}
