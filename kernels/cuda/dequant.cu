#include "kernels/cuda/dequant.cuh"

#include <algorithm>
#include <type_traits>

namespace tinyserve::cuda {
namespace {

constexpr int kMaxGemvRows = 8;

// Decodes one block (2-byte aligned) into 32 floats.
template <QuantType kType>
__device__ inline void DecodeBlock(const uint8_t* blk, float (&w)[32]) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(blk);
  const float d = __half2float(__ushort_as_half(h[0]));
  if constexpr (kType == QuantType::kQ8_0) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint16_t two = h[1 + j];
      w[2 * j] = static_cast<float>(static_cast<int8_t>(two & 0xff)) * d;
      w[2 * j + 1] = static_cast<float>(static_cast<int8_t>(two >> 8)) * d;
    }
  } else {
    const int qoff = kType == QuantType::kQ4_1 ? 2 : 1;  // in uint16 units
    const float m = kType == QuantType::kQ4_1 ? __half2float(__ushort_as_half(h[1])) : 0.f;
    const float bias = kType == QuantType::kQ4_0 ? -8.f : 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint16_t two = h[qoff + j];
      const int b0 = two & 0xff, b1 = two >> 8;
      w[2 * j] = (static_cast<float>(b0 & 0xf) + bias) * d + m;
      w[2 * j + 16] = (static_cast<float>(b0 >> 4) + bias) * d + m;
      w[2 * j + 1] = (static_cast<float>(b1 & 0xf) + bias) * d + m;
      w[2 * j + 17] = (static_cast<float>(b1 >> 4) + bias) * d + m;
    }
  }
}

// One thread per block.
template <QuantType kType, typename T>
__global__ void DequantKernel(const uint8_t* blocks, T* out, int64_t nblocks) {
  constexpr int kBytes = kType == QuantType::kQ4_0 ? 18 : (kType == QuantType::kQ4_1 ? 20 : 34);
  for (int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; b < nblocks;
       b += int64_t{gridDim.x} * blockDim.x) {
    float w[32];
    DecodeBlock<kType>(blocks + b * kBytes, w);
#pragma unroll
    for (int j = 0; j < 32; ++j) out[b * 32 + j] = FromF32<T>(w[j]);
  }
}

// One warp per output column j (row of W); lanes stride over its blocks. 8 warps per CTA.
// \tparam kType  block format
// \tparam A      activation type of x and y
template <QuantType kType, typename A>
__global__ void __launch_bounds__(256)
    QuantGemvKernel(const uint8_t* w, const A* x, A* y, int M, int N, int K) {
  constexpr int kBytes = kType == QuantType::kQ4_0 ? 18 : (kType == QuantType::kQ4_1 ? 20 : 34);
  const int j = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (j >= N) return;
  const int nb = K / 32;
  const uint8_t* row = w + int64_t{j} * nb * kBytes;
  float acc[kMaxGemvRows] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int blk = lane; blk < nb; blk += 32) {
    float wv[32];
    DecodeBlock<kType>(row + int64_t{blk} * kBytes, wv);
#pragma unroll
    for (int m = 0; m < kMaxGemvRows; ++m) {
      if (m < M) {
        const A* xr = x + int64_t{m} * K + blk * 32;
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < 32; ++e) s = fmaf(wv[e], ToF32<A>(xr[e]), s);
        acc[m] += s;
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kMaxGemvRows; ++m) {
    if (m < M) {
      float s = acc[m];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) y[int64_t{m} * N + j] = FromF32<A>(s);
    }
  }
}

template <typename F>
cudaError_t DispatchQuant(QuantType t, F&& f) {
  switch (t) {
    case QuantType::kQ4_0:
      return f(std::integral_constant<QuantType, QuantType::kQ4_0>{});
    case QuantType::kQ4_1:
      return f(std::integral_constant<QuantType, QuantType::kQ4_1>{});
    case QuantType::kQ8_0:
      return f(std::integral_constant<QuantType, QuantType::kQ8_0>{});
  }
  SetLaunchError("unknown quant type");
  return cudaErrorInvalidValue;
}

template <typename F>
cudaError_t DispatchAct(DType t, F&& f) {
  switch (t) {
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

cudaError_t DequantizeBlocks(QuantType type, const void* blocks, DType out_dtype, void* out,
                             int64_t n, cudaStream_t stream) {
  TS_REQUIRE(blocks && out && n > 0 && n % 32 == 0, "DequantizeBlocks: bad arguments");
  TS_REQUIRE((reinterpret_cast<uintptr_t>(blocks) & 1) == 0,
             "DequantizeBlocks: blocks must be 2-byte aligned");
  const int64_t nb = n / 32;
  const int grid = static_cast<int>(std::min<int64_t>((nb + 255) / 256, 65536));
  return DispatchQuant(type, [&](auto qt) {
    return DispatchAct(out_dtype, [&](auto tag) {
      using T = decltype(tag);
      LaunchKernel(DequantKernel<decltype(qt)::value, T>, grid, 256, 0, stream,
                   static_cast<const uint8_t*>(blocks), static_cast<T*>(out), nb);
      TS_RETURN_LAUNCH_ERROR();
      return cudaSuccess;
    });
  });
}

cudaError_t QuantGemv(QuantType type, const void* w, DType act_dtype, const void* x, void* y,
                      int M, int N, int K, cudaStream_t stream) {
  TS_REQUIRE(w && x && y, "QuantGemv: null pointer");
  TS_REQUIRE(M >= 1 && M <= kMaxGemvRows, "QuantGemv: M must be in [1, 8]");
  TS_REQUIRE(N > 0 && K > 0 && K % 32 == 0, "QuantGemv: need N > 0 and K % 32 == 0");
  TS_REQUIRE((reinterpret_cast<uintptr_t>(w) & 1) == 0, "QuantGemv: w must be 2-byte aligned");
  const int grid = (N + 7) / 8;
  return DispatchQuant(type, [&](auto qt) {
    return DispatchAct(act_dtype, [&](auto tag) {
      using A = decltype(tag);
      LaunchKernel(QuantGemvKernel<decltype(qt)::value, A>, grid, 256, 0, stream,
                   static_cast<const uint8_t*>(w), static_cast<const A*>(x), static_cast<A*>(y), M,
                   N, K);
      TS_RETURN_LAUNCH_ERROR();
      return cudaSuccess;
    });
  });
}

}  // namespace tinyserve::cuda
