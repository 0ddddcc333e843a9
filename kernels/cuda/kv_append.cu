#include "kernels/cuda/kv_append.cuh"

#include <algorithm>

namespace tinyserve::cuda {
namespace {

constexpr int kAppendThreads = 128;

// One CTA per (touched page slot x, sequence b); it walks the sequence's touched pages with
// stride gridDim.x. Copies the page's new tokens for all KV heads, then recomputes the box.
// \tparam T  cache element type (__half or __nv_bfloat16)
template <typename T>
__global__ void __launch_bounds__(kAppendThreads) AppendPagedKvKernel(const KvAppendParams p) {
  const PagedKvLayout lay = p.layout;
  const int b = blockIdx.y;
  const int len_new = p.seq_lens[b];
  const int row0 = p.new_indptr[b];
  const int n_new = p.new_indptr[b + 1] - row0;
  if (n_new <= 0 || len_new < n_new) return;
  const int len_old = len_new - n_new;
  const int P = lay.page_size;
  const int chunks = lay.head_dim / 8;  // 16-byte vectors per head row
  const int first = len_old / P, last = (len_new - 1) / P;
  const int32_t* table = p.page_indices + p.page_indptr[b];
  const T* k_new = static_cast<const T*>(p.k_new);
  const T* v_new = static_cast<const T*>(p.v_new);
  T* k_cache = static_cast<T*>(p.k_cache);
  T* v_cache = static_cast<T*>(p.v_cache);
  T* kmin = static_cast<T*>(p.kmin);
  T* kmax = static_cast<T*>(p.kmax);

  for (int lp = first + blockIdx.x; lp <= last; lp += gridDim.x) {
    const int phys = table[lp];
    const int t0 = max(len_old, lp * P), t1 = min(len_new, (lp + 1) * P);
    const int per_token = lay.num_kv_heads * chunks;
    for (int i = threadIdx.x; i < (t1 - t0) * per_token; i += blockDim.x) {
      const int tok = t0 + i / per_token;
      const int head = (i % per_token) / chunks;
      const int c = i % chunks;
      const int64_t src = (row0 + tok - len_old) * p.new_stride + head * lay.head_dim + c * 8;
      const int64_t dst = lay.KvOffset(phys, head, tok - lp * P) + c * 8;
      *reinterpret_cast<uint4*>(k_cache + dst) = *reinterpret_cast<const uint4*>(k_new + src);
      *reinterpret_cast<uint4*>(v_cache + dst) = *reinterpret_cast<const uint4*>(v_new + src);
    }
    // Global writes of this block are visible to the whole block after the barrier.
    __syncthreads();
    const int valid = t1 - lp * P;  // slots [0, valid) hold tokens of the sequence
    for (int i = threadIdx.x; i < per_token; i += blockDim.x) {
      const int head = i / chunks, c = i % chunks;
      float mn[8], mx[8];
      Unpack8<T>(*reinterpret_cast<const uint4*>(k_cache + lay.KvOffset(phys, head, 0) + c * 8),
                 mn);
#pragma unroll
      for (int e = 0; e < 8; ++e) mx[e] = mn[e];
      for (int s = 1; s < valid; ++s) {
        float k[8];
        Unpack8<T>(
            *reinterpret_cast<const uint4*>(k_cache + lay.KvOffset(phys, head, s) + c * 8), k);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          mn[e] = fminf(mn[e], k[e]);
          mx[e] = fmaxf(mx[e], k[e]);
        }
      }
      // Exact: min/max of values that are already T round-trip through float unchanged.
      const int64_t m = lay.MetaOffset(phys, head) + c * 8;
      *reinterpret_cast<uint4*>(kmin + m) = Pack8<T>(mn);
      *reinterpret_cast<uint4*>(kmax + m) = Pack8<T>(mx);
    }
    __syncthreads();
  }
}

bool Aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

}  // namespace

cudaError_t AppendPagedKv(const KvAppendParams& p, cudaStream_t stream) {
  TS_REQUIRE(p.layout.Valid(), "AppendPagedKv: invalid layout");
  TS_REQUIRE(p.batch > 0 && p.batch <= 65535, "AppendPagedKv: batch out of range");
  TS_REQUIRE(p.max_new_per_seq > 0, "AppendPagedKv: max_new_per_seq must be > 0");
  TS_REQUIRE(p.new_stride >= int64_t{p.layout.num_kv_heads} * p.layout.head_dim &&
                 p.new_stride % 8 == 0,
             "AppendPagedKv: new_stride must be >= H_kv*d and a multiple of 8");
  TS_REQUIRE(p.k_new && p.v_new && p.new_indptr && p.seq_lens && p.page_indptr &&
                 p.page_indices && p.k_cache && p.v_cache && p.kmin && p.kmax,
             "AppendPagedKv: null pointer");
  TS_REQUIRE(Aligned16(p.k_new) && Aligned16(p.v_new) && Aligned16(p.k_cache) &&
                 Aligned16(p.v_cache) && Aligned16(p.kmin) && Aligned16(p.kmax),
             "AppendPagedKv: pointers must be 16-byte aligned");
  const int touched = std::min(1024, (p.max_new_per_seq + p.layout.page_size - 1) /
                                         p.layout.page_size + 1);
  const dim3 grid(touched, p.batch);
  return TS_DISPATCH_DTYPE16(p.dtype, T, [&] {
    LaunchKernel(AppendPagedKvKernel<T>, grid, kAppendThreads, 0, stream, p);
    TS_RETURN_LAUNCH_ERROR();
    return cudaSuccess;
  });
}

}  // namespace tinyserve::cuda
