// File: kernels/cuda/rope.cuh
// Rotary position embedding, in place on the query and key rows of a batch of tokens, with
// Qwen3's per-head RMSNorm fused in front.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch_status.cuh"

namespace tinyserve::cuda {

// Which elements form a rotated pair (i in [0, rotary_dim/2)), with angle pos * theta^(-2i/rot)
// (scaled as RopeParams says):
enum class RopeStyle : int {
  kAdjacentPairs = 0,  // (2i, 2i+1): GPT-J, llama.cpp's NORM rope (GGUF Llama weights)
  kRotateHalf = 1,     // (i, i + rot/2): GPT-NeoX, Hugging Face Llama
};

struct RopeParams {
  DType dtype = DType::kF16;
  void* q = nullptr;          // [tokens][H_q][d], rows q_stride elements apart (may be null)
  int64_t q_stride = 0;
  void* k = nullptr;          // [tokens][H_kv][d], rows k_stride elements apart (may be null)
  int64_t k_stride = 0;
  const int32_t* positions = nullptr;  // [tokens]
  int tokens = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;           // even
  int rotary_dim = 0;         // even, <= head_dim; 0 means head_dim
  float theta = 10000.f;
  // Pair i's angle times freq_scale and divided by freq_factors[i] (device, rot/2 floats; null:
  // all 1): linear RoPE scaling and Llama 3's per-frequency factors.
  float freq_scale = 1.f;
  const float* freq_factors = nullptr;
  float attn_factor = 1.f;  // YaRN: cos and sin scaled by it
  RopeStyle style = RopeStyle::kRotateHalf;
  // Qwen3's per-head norms: each Q (K) head RMS-normalised over its head_dim elements and scaled
  // by q_norm (k_norm) before it is rotated (device, [head_dim] in `dtype`; null: none), with the
  // statistics in fp32 and no rounding in between. At most kMaxNormHeads heads with a norm.
  const void* q_norm = nullptr;
  const void* k_norm = nullptr;
  float norm_eps = 1e-6f;
};

inline constexpr int kMaxNormHeads = 256;

// Angles are computed in double precision, so long positions (128K) keep their accuracy.
cudaError_t ApplyRope(const RopeParams& p, cudaStream_t stream);

}  // namespace tinyserve::cuda
