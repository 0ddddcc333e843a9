// File: kernels/cuda/paged_kv.cuh
// The paged KV cache layout shared by the CPU engine and every CUDA kernel, written down once
// with the index arithmetic both sides use.
//
// Per layer (one PagedKvLayout describes one layer's buffers):
//   k_cache, v_cache  [num_pages][num_kv_heads][page_size][head_dim]   (fp16 or bf16)
//   kmin, kmax        [num_pages][num_kv_heads][head_dim]              (same dtype as the cache)
// Keys are stored after RoPE. kmin/kmax are the per-channel min/max over the VALID tokens of the
// page only (slots [0, valid) where valid = min(page_size, L - page * page_size)). They are kept
// in the cache dtype: the keys themselves are stored in that dtype, so the min and max of them
// are exactly representable and the box needs no rounding to stay a valid bound.
//
// Per sequence b of a batch (CSR, FlashInfer-style):
//   page_indptr   [batch + 1]   pages of sequence b are page_indices[page_indptr[b] .. [b+1])
//   page_indices  [total]       physical page ids; may list more pages than the sequence uses
//   seq_lens      [batch]       L_b >= 1 tokens; token t lives in page_indices[indptr[b] + t / P],
//                               slot t % P. Only the last used page ceil(L/P)-1 can be partial.
#pragma once

#include <cstdint>

namespace tinyserve::cuda {

struct PagedKvLayout {
  int num_pages = 0;     // physical pages in the pool
  int num_kv_heads = 0;  // H_kv
  int page_size = 16;    // P: a power of two
  int head_dim = 64;     // d

  // Element offset of (page, kv head, slot, 0) in k_cache / v_cache.
  __host__ __device__ int64_t KvOffset(int page, int head, int slot) const {
    return ((static_cast<int64_t>(page) * num_kv_heads + head) * page_size + slot) * head_dim;
  }
  // Element offset of (page, kv head, 0) in kmin / kmax.
  __host__ __device__ int64_t MetaOffset(int page, int head) const {
    return (static_cast<int64_t>(page) * num_kv_heads + head) * head_dim;
  }
  // Elements in one of k_cache / v_cache, and in one of kmin / kmax.
  __host__ __device__ int64_t KvElements() const {
    return static_cast<int64_t>(num_pages) * num_kv_heads * page_size * head_dim;
  }
  __host__ __device__ int64_t MetaElements() const {
    return static_cast<int64_t>(num_pages) * num_kv_heads * head_dim;
  }
  // Pages used by a sequence of `len` tokens.
  __host__ __device__ int PagesFor(int len) const { return (len + page_size - 1) / page_size; }

  // Host-side check of the invariants every kernel relies on.
  bool Valid() const {
    return num_pages > 0 && num_kv_heads > 0 && page_size > 0 &&
           (page_size & (page_size - 1)) == 0 && head_dim > 0 && head_dim % 8 == 0 &&
           KvElements() < (int64_t{1} << 40);
  }
};

// Integer log2 of a power of two (host or device).
__host__ __device__ inline int Log2Pow2(int x) {
  int r = 0;
  while ((1 << r) < x) ++r;
  return r;
}

}  // namespace tinyserve::cuda
