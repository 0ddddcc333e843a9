// File: kernels/cuda/dequant.cuh
// ggml block formats on the GPU: dequantization to f16/bf16 at weight load, and a dequantizing
// GEMV for decode (y = x W^T with W left in blocks). Block layouts (32 weights per block, as in
// kernels/cpu/dequant.cc and ggml):
//   Q4_0 (18 B): f16 d, 16 B nibbles; w[j] = (lo(q[j]) - 8) d, w[j+16] = (hi(q[j]) - 8) d
//   Q4_1 (20 B): f16 d, f16 m, 16 B nibbles; w[j] = lo(q[j]) d + m, w[j+16] = hi(q[j]) d + m
//   Q8_0 (34 B): f16 d, 32 x int8; w[j] = q[j] d
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch_status.cuh"

namespace tinyserve::cuda {

enum class QuantType : int { kQ4_0 = 0, kQ4_1 = 1, kQ8_0 = 2 };

// Bytes of one 32-weight block.
inline int QuantBlockBytes(QuantType t) {
  return t == QuantType::kQ4_0 ? 18 : (t == QuantType::kQ4_1 ? 20 : 34);
}

// out[i] = weight i of the blocks, i < n; n % 32 == 0. blocks [n/32 blocks], out [n] (f16/bf16/f32).
cudaError_t DequantizeBlocks(QuantType type, const void* blocks, DType out_dtype, void* out,
                             int64_t n, cudaStream_t stream);

// y[m][j] = sum_k x[m][k] W[j][k], fp32 accumulation, for m < M <= 8 (decode batches).
//   w [N][K/32 blocks] row-major (each row K/32 blocks, K % 32 == 0), x [M][K], y [M][N];
//   x and y share act_dtype (f32, f16 or bf16).
cudaError_t QuantGemv(QuantType type, const void* w, DType act_dtype, const void* x, void* y,
                      int M, int N, int K, cudaStream_t stream);

}  // namespace tinyserve::cuda
