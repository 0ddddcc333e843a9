// File: kernels/cuda/launch_status.cuh
// The error channel of the host launchers: each returns a cudaError_t and never throws. Invalid
// arguments are found before anything is launched and return cudaErrorInvalidValue, with the
// reason readable through LastLaunchError() on the same thread; a failed launch returns the
// launch's own error (cudaGetLastError right after the launch). And the one way kernels are
// launched (LaunchKernel), so that the CPU emulator (emu/cuda_emu.h) can run the same calls.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>
#ifdef TS_CUDA_EMU
#include <tuple>
#endif

namespace tinyserve::cuda {

// kernel<<<grid, block, smem, stream>>>(args...). Under TS_CUDA_EMU the arguments are converted
// to the kernel's parameter types now (as a launch copies them) and the grid runs on the CPU
// emulator in stream order, or is recorded when the stream is being captured.
template <typename... Params, typename... Args>
void LaunchKernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                  cudaStream_t stream, Args&&... args) {
#ifdef TS_CUDA_EMU
  ::ts_emu::EnqueueLaunch(reinterpret_cast<const void*>(kernel), grid, block, smem, stream,
                          [kernel, params = std::tuple<Params...>(std::forward<Args>(args)...)] {
                            std::apply(kernel, params);
                          });
#else
  kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
#endif
}

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
