#include "kernels/cuda/rope.cuh"

#include "kernels/cuda/device_utils.cuh"

namespace tinyserve::cuda {
namespace {

// grid (tokens); with a norm, first one warp per head computes its 1/rms; then threads walk
// (head, pair) over the query heads then the key heads.
// \tparam T  element type
template <typename T>
__global__ void RopeKernel(const RopeParams p, int rot) {
  const int t = blockIdx.x;
  const int half = rot / 2;
  const int heads = p.num_q_heads + p.num_kv_heads;
  const double pos = p.positions[t];
  auto row_of = [&](int head) -> T* {  // null: that side is not rotated
    if (head < p.num_q_heads)
      return p.q == nullptr ? nullptr : static_cast<T*>(p.q) + t * p.q_stride + head * p.head_dim;
    return p.k == nullptr
               ? nullptr
               : static_cast<T*>(p.k) + t * p.k_stride + (head - p.num_q_heads) * p.head_dim;
  };
  auto norm_of = [&](int head) {
    return static_cast<const T*>(head < p.num_q_heads ? p.q_norm : p.k_norm);
  };
  __shared__ float inv_rms[kMaxNormHeads];
  const bool normed = p.q_norm != nullptr || p.k_norm != nullptr;
  if (normed) {
    const int lane = threadIdx.x % 32;
    for (int head = threadIdx.x / 32; head < heads; head += blockDim.x / 32) {
      const T* row = row_of(head);
      if (row == nullptr || norm_of(head) == nullptr) continue;  // the same for the whole warp
      float ss = 0.f;
      for (int i = lane; i < p.head_dim; i += 32) {
        const float v = ToF32<T>(row[i]);
        ss += v * v;
      }
      ss = WarpSum(ss);
      if (lane == 0) inv_rms[head] = rsqrtf(ss / p.head_dim + p.norm_eps);
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < heads * half; i += blockDim.x) {
    const int head = i / half, pair = i % half;
    T* row = row_of(head);
    if (row == nullptr) continue;
    double inv_freq = p.freq_scale * pow(static_cast<double>(p.theta), -2.0 * pair / rot);
    if (p.freq_factors != nullptr) inv_freq /= p.freq_factors[pair];
    double s, c;
    sincos(pos * inv_freq, &s, &c);
    const int i0 = p.style == RopeStyle::kAdjacentPairs ? 2 * pair : pair;
    const int i1 = p.style == RopeStyle::kAdjacentPairs ? 2 * pair + 1 : pair + half;
    float x0 = ToF32<T>(row[i0]), x1 = ToF32<T>(row[i1]);
    if (const T* w = normed ? norm_of(head) : nullptr) {
      x0 *= inv_rms[head] * ToF32<T>(w[i0]);
      x1 *= inv_rms[head] * ToF32<T>(w[i1]);
    }
    const float cf = static_cast<float>(c * p.attn_factor),
                sf = static_cast<float>(s * p.attn_factor);
    row[i0] = FromF32<T>(x0 * cf - x1 * sf);
    row[i1] = FromF32<T>(x0 * sf + x1 * cf);
  }
  // Channels past rotary_dim are normalised but not rotated.
  const int tail = p.head_dim - rot;
  if (!normed || tail == 0) return;
  for (int i = threadIdx.x; i < heads * tail; i += blockDim.x) {
    const int head = i / tail, e = rot + i % tail;
    T* row = row_of(head);
    const T* w = norm_of(head);
    if (row != nullptr && w != nullptr)
      row[e] = FromF32<T>(ToF32<T>(row[e]) * inv_rms[head] * ToF32<T>(w[e]));
  }
}

}  // namespace

cudaError_t ApplyRope(const RopeParams& p, cudaStream_t stream) {
  const int rot = p.rotary_dim > 0 ? p.rotary_dim : p.head_dim;
  TS_REQUIRE(p.tokens > 0 && p.positions, "ApplyRope: no tokens or positions");
  TS_REQUIRE(p.head_dim > 0 && rot % 2 == 0 && rot <= p.head_dim,
             "ApplyRope: rotary_dim must be even and <= head_dim");
  TS_REQUIRE(p.num_q_heads >= 0 && p.num_kv_heads >= 0 && (p.q || p.k),
             "ApplyRope: nothing to rotate");
  TS_REQUIRE(!p.q || p.q_stride >= int64_t{p.num_q_heads} * p.head_dim, "ApplyRope: q_stride");
  TS_REQUIRE(!p.k || p.k_stride >= int64_t{p.num_kv_heads} * p.head_dim, "ApplyRope: k_stride");
  TS_REQUIRE((!p.q_norm && !p.k_norm) || p.num_q_heads + p.num_kv_heads <= kMaxNormHeads,
             "ApplyRope: more heads than kMaxNormHeads with a per-head norm");
  return TS_DISPATCH_DTYPE16(p.dtype, T, [&] {
    LaunchKernel(RopeKernel<T>, p.tokens, 256, 0, stream, p, rot);
    TS_RETURN_LAUNCH_ERROR();
    return cudaSuccess;
  });
}

}  // namespace tinyserve::cuda
