// File: kernels/cuda/activation.cuh
// Feed-forward activations: SwiGLU (silu(gate) * up) and GELU (tanh approximation, gelu_new);
// and a bias add after a projection.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch_status.cuh"

namespace tinyserve::cuda {

// out[r][i] = silu(gate[r][i]) * up[r][i], silu(x) = x / (1 + e^-x), fp32 inside.
//   gate [rows][n] (row stride gate_stride), up [rows][n] (up_stride), out [rows][n]
//   (out_stride). A fused gate|up projection passes gate = gu, up = gu + n, strides 2n.
cudaError_t SwiGlu(DType dtype, const void* gate, int64_t gate_stride, const void* up,
                   int64_t up_stride, void* out, int64_t out_stride, int rows, int n,
                   cudaStream_t stream);

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise; x [count], out [count].
cudaError_t GeluTanh(DType dtype, const void* x, void* out, int64_t count, cudaStream_t stream);

// y[r][i] += bias[i] (fp32 inside): y [rows][n] with row stride y_stride, bias [n].
cudaError_t AddBias(DType dtype, void* y, int64_t y_stride, const void* bias, int rows, int n,
                    cudaStream_t stream);

}  // namespace tinyserve::cuda
