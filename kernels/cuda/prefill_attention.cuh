// File: kernels/cuda/prefill_attention.cuh
// Causal prefill attention over the paged cache (paged_kv.cuh): the n_b new tokens of sequence b
// (already appended, so they are its last n_b tokens) each attend to every cache token at or
// before their own position. Simple and exact: fp32 tiles in shared memory, online softmax,
// one warp per 4 queries. Quest applies to decode only, so prefill is always dense.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch_status.cuh"
#include "kernels/cuda/paged_kv.cuh"

namespace tinyserve::cuda {

struct PrefillAttentionParams {
  DType dtype = DType::kF16;  // q, out, caches (f16 or bf16)
  PagedKvLayout layout;       // head_dim 64 or 128
  int batch = 0;
  int num_q_heads = 0;        // a multiple of layout.num_kv_heads
  const void* q = nullptr;    // [total_q][H_q][d], rows q_stride elements apart
  int64_t q_stride = 0;
  void* out = nullptr;        // [total_q][H_q][d], rows out_stride elements apart
  int64_t out_stride = 0;
  const int32_t* q_indptr = nullptr;      // [batch + 1] query rows of seq b; query i of b is at
                                          // position seq_lens[b] - n_b + i
  const int32_t* seq_lens = nullptr;      // [batch] lengths including the new tokens
  const int32_t* page_indptr = nullptr;   // [batch + 1]
  const int32_t* page_indices = nullptr;  // [total pages]
  const void* k_cache = nullptr;          // [num_pages][H_kv][P][d]
  const void* v_cache = nullptr;          // [num_pages][H_kv][P][d]
  int max_q_per_seq = 0;                  // host bound on n_b (sizes the grid)
  float sm_scale = 0.f;                   // 0 means 1/sqrt(d)
};

cudaError_t PrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream);

}  // namespace tinyserve::cuda
