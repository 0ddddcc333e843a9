#include "kernels/cuda/cuda_check.cuh"

namespace tinyserve::cuda {

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error from the failed probe
    return 0;
  }
  return n;
}

}  // namespace tinyserve::cuda

#include "kernels/cuda/launch_status.cuh"

namespace tinyserve::cuda {
namespace {
thread_local const char* g_last_launch_error = "";
}  // namespace

void SetLaunchError(const char* what) { g_last_launch_error = what; }
const char* LastLaunchError() { return g_last_launch_error; }

}  // namespace tinyserve::cuda
