// CUDA arrays of the fake driver: cuArrayCreate_v2, cuArray3DCreate_v2, cuMipmappedArrayCreate,
// their destroys, and cuArrayGetMemoryRequirements / cuMipmappedArrayGetMemoryRequirements.
//
// Size model (a stand-in for the driver's tiled layout, deliberately not the bare texel count):
// each row is padded to 512 bytes, rows x height x depth (0 counts as 1; a layered or cubemap
// array's depth is its layer count) summed over mip levels (each halves width, height and, unless
// layered, depth), the total rounded up to 64 KiB. That many bytes are charged to the current
// context's device; sparse and deferred-mapping arrays are charged nothing (their memory would
// come from cuMemMapArrayAsync). Formats: the 8/16/32-bit integer, half and float ones with 1, 2
// or 4 channels (others: CUDA_ERROR_INVALID_VALUE). The requirement queries answer with that
// size for every array, or, with vramscope_fake_set_array_requirements(0) /
// VRAMSCOPE_FAKE_ARRAY_REQUIREMENTS=deferred, as the driver documents: CUDA_ERROR_INVALID_VALUE
// unless the array was made with CUDA_ARRAY3D_DEFERRED_MAPPING.
#include <type_traits>

#include <cuda.h>

#include "fake_cuda_decls.h"
#include "fake_state.h"

namespace vramscope::fake {
namespace {

constexpr size_t kRowAlignment = 512;
constexpr size_t kArrayAlignment = size_t{64} << 10;

size_t ElementBytes(CUarray_format format) {
  switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      return 4;
    default:
      return 0;
  }
}

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

CUresult Create(Call& call, const CUDA_ARRAY3D_DESCRIPTOR* desc, unsigned int levels,
                CUarray_st* array) {
  CUctx_st* ctx = nullptr;
  if (CUresult r = call.RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  const size_t element = desc == nullptr ? 0 : ElementBytes(desc->Format);
  if (element == 0 || desc->Width == 0 || levels == 0 ||
      (desc->NumChannels != 1 && desc->NumChannels != 2 && desc->NumChannels != 4)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const bool layers = (desc->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
  size_t w = desc->Width;
  size_t h = desc->Height == 0 ? 1 : desc->Height;
  size_t d = desc->Depth == 0 ? 1 : desc->Depth;
  size_t bytes = 0;
  for (unsigned int level = 0; level < levels; ++level) {
    bytes += RoundUp(w * element * desc->NumChannels, kRowAlignment) * h * d;
    w = w > 1 ? w / 2 : 1;
    h = h > 1 ? h / 2 : 1;
    if (!layers) d = d > 1 ? d / 2 : 1;
  }
  array->ctx = ctx;
  array->device = ctx->device;
  array->size = RoundUp(bytes, kArrayAlignment);
  array->deferred = (desc->Flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) != 0;
  array->charged = array->deferred ? 0 : array->size;
  if (!Charge(call.state(), array->device, array->charged)) return CUDA_ERROR_OUT_OF_MEMORY;
  call.state().arrays.insert(array);
  return CUDA_SUCCESS;
}

template <typename Handle>
CUresult CreateInto(Call& call, Handle* out, const CUDA_ARRAY3D_DESCRIPTOR* desc,
                    unsigned int levels) {
  if (out == nullptr) {
    if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto* array = new std::remove_pointer_t<Handle>;
  if (CUresult r = Create(call, desc, levels, array); r != CUDA_SUCCESS) {
    delete array;
    return r;
  }
  *out = array;
  return CUDA_SUCCESS;
}

CUresult Destroy(Call& call, CUarray_st* array) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  auto it = s.arrays.find(array);
  if (it == s.arrays.end()) return CUDA_ERROR_INVALID_HANDLE;
  Uncharge(s, array->device, array->charged);
  s.arrays.erase(it);
  delete array;
  return CUDA_SUCCESS;
}

CUresult Requirements(Call& call, CUDA_ARRAY_MEMORY_REQUIREMENTS* out, CUarray_st* array,
                      CUdevice device) {
  if (CUresult r = call.RequireInit(); r != CUDA_SUCCESS) return r;
  State& s = call.state();
  if (out == nullptr || s.arrays.count(array) == 0 || !ValidDevice(s, device) ||
      (!array->deferred && !s.array_requirements_for_all)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *out = CUDA_ARRAY_MEMORY_REQUIREMENTS{};
  out->size = array->size;
  out->alignment = kArrayAlignment;
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace vramscope::fake

using vramscope::fake::Call;
using vramscope::fake::State;
namespace fake = vramscope::fake;

VRAMSCOPE_FAKE_EXPORT CUresult cuArrayCreate_v2(CUarray* pHandle,
                                                const CUDA_ARRAY_DESCRIPTOR* pAllocateArray) {
  Call call("cuArrayCreate_v2");
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  if (pAllocateArray != nullptr) {
    desc.Width = pAllocateArray->Width;
    desc.Height = pAllocateArray->Height;
    desc.Format = pAllocateArray->Format;
    desc.NumChannels = pAllocateArray->NumChannels;
  }
  return fake::CreateInto(call, pHandle, pAllocateArray == nullptr ? nullptr : &desc, 1);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuArray3DCreate_v2(CUarray* pHandle,
                                                  const CUDA_ARRAY3D_DESCRIPTOR* pAllocateArray) {
  Call call("cuArray3DCreate_v2");
  return fake::CreateInto(call, pHandle, pAllocateArray, 1);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMipmappedArrayCreate(
    CUmipmappedArray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* pMipmappedArrayDesc,
    unsigned int numMipmapLevels) {
  Call call("cuMipmappedArrayCreate");
  return fake::CreateInto(call, pHandle, pMipmappedArrayDesc, numMipmapLevels);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuArrayDestroy(CUarray hArray) {
  Call call("cuArrayDestroy");
  return fake::Destroy(call, hArray);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
  Call call("cuMipmappedArrayDestroy");
  return fake::Destroy(call, hMipmappedArray);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuArrayGetMemoryRequirements(
    CUDA_ARRAY_MEMORY_REQUIREMENTS* memoryRequirements, CUarray array, CUdevice device) {
  Call call("cuArrayGetMemoryRequirements");
  return fake::Requirements(call, memoryRequirements, array, device);
}

VRAMSCOPE_FAKE_EXPORT CUresult cuMipmappedArrayGetMemoryRequirements(
    CUDA_ARRAY_MEMORY_REQUIREMENTS* memoryRequirements, CUmipmappedArray mipmap, CUdevice device) {
  Call call("cuMipmappedArrayGetMemoryRequirements");
  return fake::Requirements(call, memoryRequirements, mipmap, device);
}

VRAMSCOPE_FAKE_EXPORT size_t vramscope_fake_array_bytes(int device) {
  State& s = fake::GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  size_t bytes = 0;
  for (const CUarray_st* array : s.arrays) {
    if (array->device == device) bytes += array->charged;
  }
  return bytes;
}

VRAMSCOPE_FAKE_EXPORT int vramscope_fake_live_arrays(void) {
  State& s = fake::GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  return static_cast<int>(s.arrays.size());
}

VRAMSCOPE_FAKE_EXPORT void vramscope_fake_set_array_requirements(int for_all) {
  State& s = fake::GlobalState();
  std::lock_guard<std::mutex> lock(s.mu);
  s.array_requirements_for_all = for_all != 0;
}
