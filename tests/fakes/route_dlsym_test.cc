// Route R3: dlopen("libcuda.so.1") + dlsym by exact versioned name (JAX/XLA, cuBLASLt, NVML,
// ctypes). This program does not link the driver.
#include <string>

#include "route_tests.h"
#include "routes.h"

namespace vramscope::fake {

bool LoadRouteUnderTest(DriverApi* api, std::string* error) { return LoadByDlsym(api, error); }

}  // namespace vramscope::fake
