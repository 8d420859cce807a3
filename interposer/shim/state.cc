// The definitions of state.h's process-wide lifecycle state (constant-initialised, so usable
// from a hook that runs before the shim's own constructors).
#include "state.h"

namespace vramscope::interposer::shim_internal {

constinit std::atomic<int> g_state{static_cast<int>(State::kUninitialised)};
constinit std::atomic<bool> g_disabled{false};
constinit std::atomic<bool> g_exiting{false};
constinit Config g_config{};
__attribute__((tls_model("initial-exec"))) constinit thread_local bool t_in_init = false;
constinit std::atomic<bool> g_runtime_seen{false};

}  // namespace vramscope::interposer::shim_internal
