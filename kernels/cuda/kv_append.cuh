// File: kernels/cuda/kv_append.cuh
// Appends new K/V tokens of a batch to the paged cache (paged_kv.cuh) and brings the per-page
// key boxes (kmin/kmax) of every touched page up to date, in one kernel. Works for decode (one
// token per sequence) and for prefill chunks (many tokens, partial pages at both ends).
// The box of a touched page is recomputed from all its valid slots after the copy, so a page
// that is reused needs no reset and stale slots past the length never count.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch_status.cuh"
#include "kernels/cuda/paged_kv.cuh"

namespace tinyserve::cuda {

struct KvAppendParams {
  DType dtype = DType::kF16;  // cache, box and k_new/v_new dtype (f16 or bf16)
  PagedKvLayout layout;
  int batch = 0;
  const void* k_new = nullptr;      // [total_new][H_kv][d], rows new_stride elements apart
  const void* v_new = nullptr;      // [total_new][H_kv][d], rows new_stride elements apart
  int64_t new_stride = 0;           // elements between token rows of k_new / v_new; % 8 == 0
  const int32_t* new_indptr = nullptr;    // [batch + 1] new rows of seq b: [indptr[b], indptr[b+1])
  const int32_t* seq_lens = nullptr;      // [batch] lengths AFTER the append (>= new tokens)
  const int32_t* page_indptr = nullptr;   // [batch + 1]
  const int32_t* page_indices = nullptr;  // [total pages]
  int max_new_per_seq = 1;  // host bound on the new tokens of any one sequence (sizes the grid)
  void* k_cache = nullptr;  // [num_pages][H_kv][P][d]
  void* v_cache = nullptr;  // [num_pages][H_kv][P][d]
  void* kmin = nullptr;     // [num_pages][H_kv][d]
  void* kmax = nullptr;     // [num_pages][H_kv][d]
};

// REQUIRES: every page a new token lands in is listed in the sequence's page table. The grid
// depends only on (batch, max_new_per_seq), so a decode step can be captured in a CUDA graph.
cudaError_t AppendPagedKv(const KvAppendParams& p, cudaStream_t stream);

}  // namespace tinyserve::cuda
