// File: kernels/cuda/dtype.cuh
// Element types of the CUDA kernels and the one place where run-time values (dtype, head_dim)
// become template constants (TS_DISPATCH_*). Also 16-byte vector helpers: every kernel that
// streams K/V or activations moves 8 half-width elements (one uint4) per thread per access.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace tinyserve::cuda {

// Storage type of a tensor. KV caches, weights and activations are kF16 or kBF16; kF32 only for
// activations that say so (GEMV input/output, logits).
enum class DType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

inline size_t DTypeBytes(DType t) { return t == DType::kF32 ? 4 : 2; }
inline const char* DTypeName(DType t) {
  return t == DType::kF32 ? "f32" : (t == DType::kF16 ? "f16" : "bf16");
}

template <typename T>
__host__ __device__ inline float ToF32(T x);
template <>
__host__ __device__ inline float ToF32<float>(float x) { return x; }
template <>
__host__ __device__ inline float ToF32<__half>(__half x) { return __half2float(x); }
template <>
__host__ __device__ inline float ToF32<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__host__ __device__ inline T FromF32(float x);
template <>
__host__ __device__ inline float FromF32<float>(float x) { return x; }
template <>
__host__ __device__ inline __half FromF32<__half>(float x) { return __float2half_rn(x); }
template <>
__host__ __device__ inline __nv_bfloat16 FromF32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// 8 half-width elements <-> 8 floats through one 16-byte word.
template <typename T>
__device__ inline void Unpack8(const uint4& u, float (&f)[8]) {
  static_assert(sizeof(T) == 2, "Unpack8 is for 16-bit types");
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = ToF32<T>(e[i]);
}

template <typename T>
__device__ inline uint4 Pack8(const float (&f)[8]) {
  static_assert(sizeof(T) == 2, "Pack8 is for 16-bit types");
  uint4 u;
  T* e = reinterpret_cast<T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = FromF32<T>(f[i]);
  return u;
}

}  // namespace tinyserve::cuda

// TS_DISPATCH_DTYPE16(dtype, T, ...): runs the body with T = __half or __nv_bfloat16; any other
// dtype makes the enclosing function return cudaErrorInvalidValue.
#define TS_DISPATCH_DTYPE16(dtype, T, ...)                                       \
  [&]() -> cudaError_t {                                                         \
    if ((dtype) == ::tinyserve::cuda::DType::kF16) {                             \
      using T = __half;                                                          \
      return __VA_ARGS__();                                                      \
    }                                                                            \
    if ((dtype) == ::tinyserve::cuda::DType::kBF16) {                            \
      using T = __nv_bfloat16;                                                   \
      return __VA_ARGS__();                                                      \
    }                                                                            \
    ::tinyserve::cuda::SetLaunchError("dtype must be f16 or bf16");              \
    return cudaErrorInvalidValue;                                                \
  }()

// TS_DISPATCH_HEAD_DIM(d, kD, ...): runs the body with kD = 64 or 128.
#define TS_DISPATCH_HEAD_DIM(d, kD, ...)                                         \
  [&]() -> cudaError_t {                                                         \
    if ((d) == 64) {                                                             \
      constexpr int kD = 64;                                                     \
      return __VA_ARGS__();                                                      \
    }                                                                            \
    if ((d) == 128) {                                                            \
      constexpr int kD = 128;                                                    \
      return __VA_ARGS__();                                                      \
    }                                                                            \
    ::tinyserve::cuda::SetLaunchError("head_dim must be 64 or 128");             \
    return cudaErrorInvalidValue;                                                \
  }()
