// File: kernels/cuda/random_fill.cuh
// Deterministic random device fill (a 64-bit hash of (seed, index), no cuRAND): the benchmarks'
// data and DeviceModel::FillKvRandom.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch_status.cuh"

namespace tinyserve::cuda {

__host__ __device__ inline uint32_t HashU32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Uniform in [-1, 1) from (seed, i).
__host__ __device__ inline float HashUniform(uint64_t seed, int64_t i) {
  const float u = (HashU32(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i)) >> 8) *
                  (1.0f / 16777216.0f);
  return 2.f * u - 1.f;
}

// out[i] = scale * HashUniform(seed, offset + i), i < n.
template <typename T>
__global__ void FillUniformKernel(T* out, int64_t n, uint64_t seed, int64_t offset, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = FromF32<T>(scale * HashUniform(seed, offset + i));
}

template <typename T>
cudaError_t LaunchFillUniform(T* out, int64_t n, uint64_t seed, float scale, cudaStream_t s,
                              int64_t offset = 0) {
  LaunchKernel(FillUniformKernel<T>, 2048, 256, 0, s, out, n, seed, offset, scale);
  return cudaGetLastError();
}

}  // namespace tinyserve::cuda
