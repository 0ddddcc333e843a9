#include "kernels/cuda/rope.cuh"

namespace tinyserve::cuda {
namespace {

// grid (tokens); threads walk (head, pair) over the query heads then the key heads.
// \tparam T  element type
template <typename T>
__global__ void RopeKernel(const RopeParams p, int rot) {
  const int t = blockIdx.x;
  const int half = rot / 2;
  const double pos = p.positions[t];
  const int total = (p.num_q_heads + p.num_kv_heads) * half;
  for (int i = threadIdx.x; i < total; i += blockDim.x) {
    const int head = i / half, pair = i % half;
    T* row;
    if (head < p.num_q_heads) {
      if (p.q == nullptr) continue;
      row = static_cast<T*>(p.q) + t * p.q_stride + head * p.head_dim;
    } else {
      if (p.k == nullptr) continue;
      row = static_cast<T*>(p.k) + t * p.k_stride + (head - p.num_q_heads) * p.head_dim;
    }
    double inv_freq = p.freq_scale * pow(static_cast<double>(p.theta), -2.0 * pair / rot);
    if (p.freq_factors != nullptr) inv_freq /= p.freq_factors[pair];
    double s, c;
    sincos(pos * inv_freq, &s, &c);
    const int i0 = p.style == RopeStyle::kAdjacentPairs ? 2 * pair : pair;
    const int i1 = p.style == RopeStyle::kAdjacentPairs ? 2 * pair + 1 : pair + half;
    const float x0 = ToF32<T>(row[i0]), x1 = ToF32<T>(row[i1]);
    const float cf = static_cast<float>(c), sf = static_cast<float>(s);
    row[i0] = FromF32<T>(x0 * cf - x1 * sf);
    row[i1] = FromF32<T>(x0 * sf + x1 * cf);
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
  return TS_DISPATCH_DTYPE16(p.dtype, T, [&] {
    LaunchKernel(RopeKernel<T>, p.tokens, 256, 0, stream, p, rot);
    TS_RETURN_LAUNCH_ERROR();
    return cudaSuccess;
  });
}

}  // namespace tinyserve::cuda
