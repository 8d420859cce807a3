// Shared API-level checks run over every route to the driver (route_tests.cc).
//
// A route test executable compiles route_tests.cc with a main file that defines
// LoadRouteUnderTest (which loader fills the DriverApi). The checks use only the driver API, so
// they hold over the fake alone and with a shim preloaded (LD_PRELOAD=libvramscope.so): they
// never read the fake's internal counters.
//
// Environment:
//   VRAMSCOPE_EXPECT_MODULE=<substring>  the memory entry points of the table must live in a
//                                        module whose path contains it (default "libcuda.so.1";
//                                        set "libvramscope.so" to prove a route reaches the shim)
//   VRAMSCOPE_EXPECT_SYMBOLS=a,b,...     which members that applies to (default: the allocation
//                                        and capture entry points the shim hooks)
//   VRAMSCOPE_FAKE_DEVICES / _CAPACITY   as for the fake; the tests expect 2 devices
#ifndef VRAMSCOPE_TESTS_FAKES_ROUTE_TESTS_H_
#define VRAMSCOPE_TESTS_FAKES_ROUTE_TESTS_H_

#include <string>

#include "routes.h"

namespace vramscope::fake {

// Defined by each route test's main file.
bool LoadRouteUnderTest(DriverApi* api, std::string* error);

}  // namespace vramscope::fake

#endif  // VRAMSCOPE_TESTS_FAKES_ROUTE_TESTS_H_
