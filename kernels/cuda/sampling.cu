#include "kernels/cuda/sampling.cuh"

#include "kernels/cuda/device_utils.cuh"

namespace tinyserve::cuda {
namespace {

constexpr int kSampleThreads = 256;

// Larger value wins, then lower index; NaN loses to everything.
__device__ inline void ArgmaxCombine(float& v, int& i, float ov, int oi) {
  const bool take = (ov > v) || (ov == v && oi < i) || (v != v && ov == ov);
  if (take) {
    v = ov;
    i = oi;
  }
}

template <typename T>
__global__ void __launch_bounds__(kSampleThreads)
    ArgmaxKernel(const T* logits, int vocab, int32_t* out) {
  __shared__ float sv[kSampleThreads / 32];
  __shared__ int si[kSampleThreads / 32];
  const T* row = logits + int64_t{blockIdx.x} * vocab;
  float v = -INFINITY;
  int idx = 0x7fffffff;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) ArgmaxCombine(v, idx, ToF32<T>(row[i]), i);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    ArgmaxCombine(v, idx, ov, oi);
  }
  if (threadIdx.x % 32 == 0) {
    sv[threadIdx.x / 32] = v;
    si[threadIdx.x / 32] = idx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kSampleThreads / 32; ++w) ArgmaxCombine(v, idx, sv[w], si[w]);
    // Only -inf/NaN logits: idx may still be the sentinel or a valid index; clamp to 0.
    out[blockIdx.x] = (idx >= 0 && idx < vocab) ? idx : 0;
  }
}

// One CTA per row. probs doubles as the key buffer for the radix select.
template <typename T>
__global__ void __launch_bounds__(kSampleThreads)
    SoftmaxTopKKernel(const T* logits, int vocab, float inv_temp, int top_k, float* probs) {
  __shared__ int scan_scratch[33];
  __shared__ float red[kSampleThreads / 32];
  const T* row = logits + int64_t{blockIdx.x} * vocab;
  float* prow = probs + int64_t{blockIdx.x} * vocab;
  uint32_t* keys = reinterpret_cast<uint32_t*>(prow);
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float x = ToF32<T>(row[i]);
    keys[i] = OrderedKey(x);
    mx = fmaxf(mx, x);
  }
  mx = WarpMax(mx);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = mx;
  __syncthreads();
  mx = -INFINITY;
  for (int w = 0; w < kSampleThreads / 32; ++w) mx = fmaxf(mx, red[w]);
  __syncthreads();
  const int k = (top_k <= 0 || top_k >= vocab) ? vocab : top_k;
  uint32_t thr = 0;
  int need_eq = vocab;
  if (k < vocab) BlockRadixSelect(keys, vocab, k, &thr, &need_eq);
  // Pass 2 (ascending index): kept -> exp, else 0; the first need_eq keys == thr are kept.
  float sum = 0.f;
  int eq_base = 0;
  for (int base = 0; base < vocab; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const uint32_t key = i < vocab ? keys[i] : 0u;
    const bool eq = i < vocab && key == thr;
    int eq_total;
    const int rank = eq_base + BlockExclusiveScan(eq ? 1 : 0, &eq_total, scan_scratch);
    eq_base += eq_total;
    if (i < vocab) {
      const bool keep = key > thr || (eq && rank < need_eq);
      const float x = ToF32<T>(row[i]);
      const float p = keep && x == x ? __expf((x - mx) * inv_temp) : 0.f;
      prow[i] = p;
      sum += p;
    }
  }
  sum = WarpSum(sum);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = sum;
  __syncthreads();
  sum = 0.f;
  for (int w = 0; w < kSampleThreads / 32; ++w) sum += red[w];
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) prow[i] *= inv;
}

template <typename F>
cudaError_t DispatchAny(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(float{});
    case DType::kF16:
      return f(__half{});
    case DType::kBF16:
      return f(__nv_bfloat16{});
  }
  SetLaunchError("unknown dtype");
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t ArgmaxRows(DType dtype, const void* logits, int rows, int vocab, int32_t* out,
                       cudaStream_t stream) {
  TS_REQUIRE(logits && out && rows > 0 && vocab > 0, "ArgmaxRows: bad arguments");
  return DispatchAny(dtype, [&](auto tag) {
    using T = decltype(tag);
    LaunchKernel(ArgmaxKernel<T>, rows, kSampleThreads, 0, stream, static_cast<const T*>(logits),
                 vocab, out);
    TS_RETURN_LAUNCH_ERROR();
    return cudaSuccess;
  });
}

cudaError_t SoftmaxTopK(DType dtype, const void* logits, int rows, int vocab, float temperature,
                        int top_k, float* probs, cudaStream_t stream) {
  TS_REQUIRE(logits && probs && rows > 0 && vocab > 0, "SoftmaxTopK: bad arguments");
  TS_REQUIRE(temperature > 0.f, "SoftmaxTopK: temperature must be > 0");
  return DispatchAny(dtype, [&](auto tag) {
    using T = decltype(tag);
    LaunchKernel(SoftmaxTopKKernel<T>, rows, kSampleThreads, 0, stream,
                 static_cast<const T*>(logits), vocab, 1.f / temperature, top_k, probs);
    TS_RETURN_LAUNCH_ERROR();
    return cudaSuccess;
  });
}

}  // namespace tinyserve::cuda
