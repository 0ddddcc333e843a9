// File: kernels/cuda/launch_status.cuh
// The error channel of the host launchers: each returns a cudaError_t and never throws. Invalid
// arguments are found before anything is launched and return cudaErrorInvalidValue, with the
// reason readable through LastLaunchError() on the same thread; a failed launch returns the
// launch's own error (cudaGetLastError right after the launch).
#pragma once

#include <cuda_runtime.h>

namespace tinyserve::cuda {

// Records why the last launcher on this thread refused its arguments (a static string).
void SetLaunchError(const char* what);
// The reason recorded by the last refusing launcher on this thread ("" if none).
const char* LastLaunchError();

}  // namespace tinyserve::cuda

// Inside a launcher: refuse the arguments unless cond holds.
#define TS_REQUIRE(cond, what)                        \
  do {                                                \
    if (!(cond)) {                                    \
      ::tinyserve::cuda::SetLaunchError(what);        \
      return cudaErrorInvalidValue;                   \
    }                                                 \
  } while (0)

// Inside a launcher: return the error of the launch just made, if any.
#define TS_RETURN_LAUNCH_ERROR()                      \
  do {                                                \
    cudaError_t ts_launch_err_ = cudaGetLastError();  \
    if (ts_launch_err_ != cudaSuccess) {              \
      ::tinyserve::cuda::SetLaunchError("launch failed"); \
      return ts_launch_err_;                          \
    }                                                 \
  } while (0)
