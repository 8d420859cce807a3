// (R4) LoadDirect: the program links libcuda.so.1 and names each entry point, so the dynamic
// linker binds it (to the first definition in lookup scope: an LD_PRELOADed shim, if any, else
// the driver). Compiled only into fake_routes_direct, which links the fake driver.
#include <cuda.h>
#include <cudaTypedefs.h>

#include "fake_cuda_decls.h"
#include "routes.h"

namespace vramscope::fake {

bool LoadDirect(DriverApi* api, std::string* error) {
  (void)error;
  *api = DriverApi{};
#define VRAMSCOPE_FAKE_DIRECT(member, direct, exported, symbol, version, per_thread, pfn) \
  api->member = &direct;
  VRAMSCOPE_FAKE_DRIVER_API(VRAMSCOPE_FAKE_DIRECT)
#undef VRAMSCOPE_FAKE_DIRECT
  return true;
}

}  // namespace vramscope::fake
