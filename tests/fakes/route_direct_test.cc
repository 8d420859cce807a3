// Route R4: the test program links libcuda.so.1 and calls the driver through the PLT.
#include <string>

#include "route_tests.h"
#include "routes.h"

namespace vramscope::fake {

bool LoadRouteUnderTest(DriverApi* api, std::string* error) { return LoadDirect(api, error); }

}  // namespace vramscope::fake
