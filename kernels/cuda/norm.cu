#include "kernels/cuda/norm.cuh"

#include "kernels/cuda/device_utils.cuh"

namespace tinyserve::cuda {
namespace {

constexpr int kNormThreads = 256;

// Block sum of two values; every thread gets the totals.
__device__ inline float2 BlockSum2(float a, float b) {
  __shared__ float2 part[kNormThreads / 32];
  a = WarpSum(a);
  b = WarpSum(b);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = make_float2(a, b);
  __syncthreads();
  float2 t = make_float2(0.f, 0.f);
  for (int w = 0; w < kNormThreads / 32; ++w) {
    t.x += part[w].x;
    t.y += part[w].y;
  }
  __syncthreads();
  return t;
}

// One CTA per row; each thread handles 8-element vectors.
// \tparam T       element type
// \tparam kLayer  true: LayerNorm (mean removed, bias); false: RMSNorm
template <typename T, bool kLayer>
__global__ void __launch_bounds__(kNormThreads)
    NormKernel(const T* x, const T* __restrict__ w, const T* __restrict__ bias,
               T* out, T* residual, int n, float eps) {
  const int64_t row = blockIdx.x;
  const uint4* xv = reinterpret_cast<const uint4*>(x + row * n);
  uint4* rv = residual ? reinterpret_cast<uint4*>(residual + row * n) : nullptr;
  const int nv = n / 8;
  float s1 = 0.f, s2 = 0.f;
  for (int i = threadIdx.x; i < nv; i += blockDim.x) {
    float v[8];
    Unpack8<T>(xv[i], v);
    if (rv) {
      float r[8];
      Unpack8<T>(rv[i], r);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] += r[e];
      rv[i] = Pack8<T>(v);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      s1 += v[e];
      s2 += v[e] * v[e];
    }
  }
  const float2 t = BlockSum2(s1, s2);
  const float mean = kLayer ? t.x / n : 0.f;
  const float var = kLayer ? fmaxf(t.y / n - mean * mean, 0.f) : t.y / n;
  const float inv = rsqrtf(var + eps);
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  const uint4* bv = reinterpret_cast<const uint4*>(bias);
  uint4* ov = reinterpret_cast<uint4*>(out + row * n);
  for (int i = threadIdx.x; i < nv; i += blockDim.x) {
    float v[8], ww[8], bb[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    // With a fused residual, normalise the stored (rounded) h that this same thread wrote
    // above; the statistics used the unrounded h (a difference far below the tolerance).
    Unpack8<T>(rv ? rv[i] : xv[i], v);
    Unpack8<T>(wv[i], ww);
    if (kLayer && bv) Unpack8<T>(bv[i], bb);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = (v[e] - mean) * inv * ww[e] + bb[e];
    ov[i] = Pack8<T>(v);
  }
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

cudaError_t RmsNorm(DType dtype, const void* x, const void* weight, void* out, void* residual,
                    int rows, int n, float eps, cudaStream_t stream) {
  TS_REQUIRE(x && weight && out, "RmsNorm: null pointer");
  TS_REQUIRE(rows > 0 && n > 0 && n % 8 == 0, "RmsNorm: need rows > 0 and n % 8 == 0");
  TS_REQUIRE(Aligned16(x) && Aligned16(weight) && Aligned16(out) && Aligned16(residual),
             "RmsNorm: pointers must be 16-byte aligned");
  return TS_DISPATCH_DTYPE16(dtype, T, [&] {
    LaunchKernel(NormKernel<T, false>, rows, kNormThreads, 0, stream, static_cast<const T*>(x),
                 static_cast<const T*>(weight), nullptr, static_cast<T*>(out),
                 static_cast<T*>(residual), n, eps);
    TS_RETURN_LAUNCH_ERROR();
    return cudaSuccess;
  });
}

cudaError_t LayerNorm(DType dtype, const void* x, const void* weight, const void* bias, void* out,
                      int rows, int n, float eps, cudaStream_t stream) {
  TS_REQUIRE(x && weight && out, "LayerNorm: null pointer");
  TS_REQUIRE(rows > 0 && n > 0 && n % 8 == 0, "LayerNorm: need rows > 0 and n % 8 == 0");
  TS_REQUIRE(Aligned16(x) && Aligned16(weight) && Aligned16(out) && Aligned16(bias),
             "LayerNorm: pointers must be 16-byte aligned");
  return TS_DISPATCH_DTYPE16(dtype, T, [&] {
    LaunchKernel(NormKernel<T, true>, rows, kNormThreads, 0, stream, static_cast<const T*>(x),
                 static_cast<const T*>(weight), static_cast<const T*>(bias), static_cast<T*>(out),
                 nullptr, n, eps);
    TS_RETURN_LAUNCH_ERROR();
    return cudaSuccess;
  });
}

}  // namespace tinyserve::cuda
