// The shim's one internal error enum.
//
// Hooks return CUresult at the C boundary; everything below them returns ShimStatus, and the
// hook turns it into the CUDA code the call documents. No exceptions anywhere in the shim.
#pragma once

namespace vramscope::interposer {

enum class [[nodiscard]] ShimStatus{
    kOk = 0,
    kUnavailable,   // the shim is not active (init failed, exiting, re-entrant call): pass through
    kNotOurs,       // the address/handle is not the shim's: pass through to the driver
    kInvalidValue,  // the caller passed something the driver would reject
    kOutOfMemory,
    kDriverError,  // the driver failed; the CUresult is kept by the caller
};

}  // namespace vramscope::interposer
