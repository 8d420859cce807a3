// The CUDA_INJECTION64_PATH entry point. The driver dlopens the library named there during
// cuInit and calls InitializeInjection; it initialises the shim (the lifecycle, shim.h) and arms
// CUPTI with the config's one reading of VRAMSCOPE_CUPTI (Config::CuptiWanted): as an injection
// the unset default means on, so CUPTI starts unless VRAMSCOPE_CUPTI=0 (and, as always, only with
// a ring to record into: VRAMSCOPE_RING_DIR). It lives here, at the top, so that cupti.cc never
// calls up into the lifecycle.
//
// Returns 1 (success: the driver goes on either way). Called by the driver from one thread.
#include "cupti.h"
#include "ring_events.h"
#include "shim.h"
#include "state.h"

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  using namespace vramscope::interposer;
  if (!EnsureDriver()) return 1;
  ArmCupti(Cfg().CuptiWanted(/*as_injection=*/true) && Ring() != nullptr);
  MaybeStartCupti();
  return 1;
}
