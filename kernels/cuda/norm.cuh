// File: kernels/cuda/norm.cuh
// RMSNorm (with an optional fused residual add) and LayerNorm over rows, fp32 statistics.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch_status.cuh"

namespace tinyserve::cuda {

// out = x / sqrt(mean(x^2) + eps) * weight, row by row. If residual is not null, first
// h = x + residual is computed, written back to residual, and normalised instead of x.
//   x [rows][n], weight [n], out [rows][n], residual [rows][n] or null; n % 8 == 0.
cudaError_t RmsNorm(DType dtype, const void* x, const void* weight, void* out, void* residual,
                    int rows, int n, float eps, cudaStream_t stream);

// out = (x - mean) / sqrt(var + eps) * weight + bias (bias may be null).
//   x [rows][n], weight [n], bias [n], out [rows][n]; n % 8 == 0.
cudaError_t LayerNorm(DType dtype, const void* x, const void* weight, const void* bias, void* out,
                      int rows, int n, float eps, cudaStream_t stream);

}  // namespace tinyserve::cuda
