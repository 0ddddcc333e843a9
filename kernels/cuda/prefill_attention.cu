#include "kernels/cuda/prefill_attention.cuh"

#include <cmath>

#include "kernels/cuda/device_utils.cuh"

namespace tinyserve::cuda {
namespace {

constexpr int kPrefillThreads = 128;
constexpr int kQueriesPerWarp = 4;
constexpr int kQTile = kQueriesPerWarp * kPrefillThreads / 32;  // 16 queries per CTA
constexpr int kKeyTile = 32;                                     // one key per lane

// grid (ceil(max_q / kQTile), H_q, batch). Warp w owns queries [w*4, w*4+4) of the CTA's tile;
// lane j scores key j of each key tile; lane j also owns output columns j, j+32, ...
// \tparam T   element type
// \tparam kD  head dim
template <typename T, int kD>
__global__ void __launch_bounds__(kPrefillThreads) PrefillKernel(const PrefillAttentionParams p,
                                                                 float scale_log2) {
  constexpr int kCols = kD / 32;
  __shared__ float qs[kQTile][kD];            // scaled queries
  __shared__ float ks[kKeyTile][kD + 1];      // +1: lane j reads row j, conflict-free
  __shared__ float vs[kKeyTile][kD];
  const int b = blockIdx.z, h = blockIdx.y;
  const int q0 = p.q_indptr[b], nq = p.q_indptr[b + 1] - q0;
  const int first = blockIdx.x * kQTile;
  if (first >= nq) return;
  const int len = p.seq_lens[b];
  const int pos0 = len - nq;  // position of query 0
  const int G = p.num_q_heads / p.layout.num_kv_heads, g = h / G;
  const int P = p.layout.page_size;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const T* q = static_cast<const T*>(p.q);
  for (int i = threadIdx.x; i < kQTile * kD; i += blockDim.x) {
    const int qi = i / kD, d = i % kD;
    const int row = first + qi;
    qs[qi][d] = row < nq ? ToF32<T>(q[(q0 + row) * p.q_stride + h * kD + d]) * scale_log2 : 0.f;
  }
  int qpos[kQueriesPerWarp];
  float m[kQueriesPerWarp], l[kQueriesPerWarp], acc[kQueriesPerWarp][kCols];
#pragma unroll
  for (int i = 0; i < kQueriesPerWarp; ++i) {
    const int row = first + warp * kQueriesPerWarp + i;
    qpos[i] = row < nq ? pos0 + row : -1;  // -1: padding query, every key masked
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[i][c] = 0.f;
  }
  const int last_pos = pos0 + min(nq, first + kQTile) - 1;  // keys needed: [0, last_pos]
  const int32_t* table = p.page_indices + p.page_indptr[b];
  const T* kc = static_cast<const T*>(p.k_cache);
  const T* vc = static_cast<const T*>(p.v_cache);
  for (int k0 = 0; k0 <= last_pos; k0 += kKeyTile) {
    __syncthreads();  // previous tile fully used (and qs written on the first pass)
    for (int i = threadIdx.x; i < kKeyTile * kD; i += blockDim.x) {
      const int j = i / kD, d = i % kD, t = k0 + j;
      float kv = 0.f, vv = 0.f;
      if (t <= last_pos) {
        const int64_t off = p.layout.KvOffset(table[t / P], g, t % P) + d;
        kv = ToF32<T>(kc[off]);
        vv = ToF32<T>(vc[off]);
      }
      ks[j][d] = kv;
      vs[j][d] = vv;
    }
    __syncthreads();
    const int t = k0 + lane;
#pragma unroll
    for (int i = 0; i < kQueriesPerWarp; ++i) {
      const float* qrow = qs[warp * kQueriesPerWarp + i];
      float s = 0.f;
#pragma unroll 16
      for (int d = 0; d < kD; ++d) s = fmaf(qrow[d], ks[lane][d], s);
      s = t <= qpos[i] ? s : -INFINITY;
      const float m_new = fmaxf(m[i], WarpMax(s));
      // All keys masked so far: keep the reference at 0 so that 2^(-inf) stays 0, not NaN.
      const float m_ref = m_new == -INFINITY ? 0.f : m_new;
      const float pr = exp2f(s - m_ref);
      const float alpha = exp2f(m[i] - m_ref);
      l[i] = l[i] * alpha + WarpSum(pr);
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[i][c] *= alpha;
      for (int j = 0; j < kKeyTile; ++j) {
        const float pj = __shfl_sync(0xffffffffu, pr, j);
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[i][c] = fmaf(pj, vs[j][lane + 32 * c], acc[i][c]);
      }
    }
  }
  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int i = 0; i < kQueriesPerWarp; ++i) {
    const int row = first + warp * kQueriesPerWarp + i;
    if (row >= nq) continue;
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      out[(q0 + row) * p.out_stride + h * kD + lane + 32 * c] = FromF32<T>(acc[i][c] * inv);
  }
}

}  // namespace

cudaError_t PrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream) {
  TS_REQUIRE(p.layout.Valid(), "PrefillAttention: invalid layout");
  TS_REQUIRE(p.batch > 0 && p.batch <= 65535 && p.max_q_per_seq > 0,
             "PrefillAttention: batch / max_q_per_seq out of range");
  TS_REQUIRE(p.num_q_heads > 0 && p.num_q_heads % p.layout.num_kv_heads == 0 &&
                 p.num_q_heads <= 65535,
             "PrefillAttention: H_q must be a multiple of H_kv");
  TS_REQUIRE(p.q_stride >= int64_t{p.num_q_heads} * p.layout.head_dim &&
                 p.out_stride >= int64_t{p.num_q_heads} * p.layout.head_dim,
             "PrefillAttention: strides too small");
  TS_REQUIRE(p.q && p.out && p.q_indptr && p.seq_lens && p.page_indptr && p.page_indices &&
                 p.k_cache && p.v_cache,
             "PrefillAttention: null pointer");
  const float scale = p.sm_scale > 0.f ? p.sm_scale : 1.0f / std::sqrt(float(p.layout.head_dim));
  const dim3 grid((p.max_q_per_seq + kQTile - 1) / kQTile, p.num_q_heads, p.batch);
  return TS_DISPATCH_DTYPE16(p.dtype, T, [&] {
    return TS_DISPATCH_HEAD_DIM(p.layout.head_dim, kD, [&] {
      LaunchKernel(PrefillKernel<T, kD>, grid, kPrefillThreads, 0, stream, p,
                   scale * 1.4426950408889634f);
      TS_RETURN_LAUNCH_ERROR();
      return cudaSuccess;
    });
  });
}

}  // namespace tinyserve::cuda
