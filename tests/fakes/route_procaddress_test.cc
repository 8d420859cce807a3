// Route R1: the CUDA runtime's way (dlopen, one dlsym of cuGetProcAddress_v2, the empty probe,
// cuGetProcAddress at 11030 and 12000, then every entry point through it, _ptsz/_ptds with
// flags 2). This program does not link the driver.
#include <string>

#include "route_tests.h"
#include "routes.h"

namespace vramscope::fake {

bool LoadRouteUnderTest(DriverApi* api, std::string* error) {
  return LoadByProcAddress(api, error);
}

}  // namespace vramscope::fake
