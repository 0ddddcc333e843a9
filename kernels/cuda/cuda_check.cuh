// File: kernels/cuda/cuda_check.cuh
// Checked CUDA calls: TS_CUDA_CHECK aborts naming the statement, file and line (a CUDA failure
// inside a kernel launch sequence is not recoverable); CudaDeviceCount() is the clean probe
// that GPU tests use to skip when no device is present.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define TS_CUDA_CHECK(stmt)                                                             \
  do {                                                                                  \
    cudaError_t ts_err_ = (stmt);                                                       \
    if (ts_err_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(ts_err_), \
                   __FILE__, __LINE__, #stmt);                                          \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

namespace tinyserve::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no device (never aborts).
int CudaDeviceCount();

}  // namespace tinyserve::cuda
