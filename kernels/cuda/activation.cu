#include "kernels/cuda/activation.cuh"

#include <algorithm>

namespace tinyserve::cuda {
namespace {

// grid (ceil(n / 256), rows).
template <typename T>
__global__ void SwiGluKernel(const T* gate, int64_t gs, const T* up, int64_t us, T* out,
                             int64_t os, int n) {
  const int r = blockIdx.y;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = ToF32<T>(gate[r * gs + i]), u = ToF32<T>(up[r * us + i]);
  out[r * os + i] = FromF32<T>(g / (1.f + expf(-g)) * u);
}

template <typename T>
__global__ void GeluKernel(const T* x, T* out, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = ToF32<T>(x[i]);
    const float inner = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    out[i] = FromF32<T>(0.5f * v * (1.f + tanhf(inner)));
  }
}

// grid (ceil(n / 256), rows).
template <typename T>
__global__ void AddBiasKernel(T* y, int64_t ys, const T* bias, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  T* p = y + blockIdx.y * ys + i;
  *p = FromF32<T>(ToF32<T>(*p) + ToF32<T>(bias[i]));
}

}  // namespace

cudaError_t SwiGlu(DType dtype, const void* gate, int64_t gate_stride, const void* up,
                   int64_t up_stride, void* out, int64_t out_stride, int rows, int n,
                   cudaStream_t stream) {
  TS_REQUIRE(gate && up && out, "SwiGlu: null pointer");
  TS_REQUIRE(rows > 0 && rows <= 65535 && n > 0, "SwiGlu: rows / n out of range");
  TS_REQUIRE(gate_stride >= n && up_stride >= n && out_stride >= n, "SwiGlu: strides < n");
  const dim3 grid((n + 255) / 256, rows);
  return TS_DISPATCH_DTYPE16(dtype, T, [&] {
    LaunchKernel(SwiGluKernel<T>, grid, 256, 0, stream, static_cast<const T*>(gate), gate_stride,
                 static_cast<const T*>(up), up_stride, static_cast<T*>(out), out_stride, n);
    TS_RETURN_LAUNCH_ERROR();
    return cudaSuccess;
  });
}

cudaError_t GeluTanh(DType dtype, const void* x, void* out, int64_t count, cudaStream_t stream) {
  TS_REQUIRE(x && out && count > 0, "GeluTanh: bad arguments");
  const int blocks = static_cast<int>(std::min<int64_t>((count + 255) / 256, 4096));
  return TS_DISPATCH_DTYPE16(dtype, T, [&] {
    LaunchKernel(GeluKernel<T>, blocks, 256, 0, stream, static_cast<const T*>(x),
                 static_cast<T*>(out), count);
    TS_RETURN_LAUNCH_ERROR();
    return cudaSuccess;
  });
}

cudaError_t AddBias(DType dtype, void* y, int64_t y_stride, const void* bias, int rows, int n,
                    cudaStream_t stream) {
  TS_REQUIRE(y && bias, "AddBias: null pointer");
  TS_REQUIRE(rows > 0 && rows <= 65535 && n > 0 && y_stride >= n, "AddBias: bad shape");
  const dim3 grid((n + 255) / 256, rows);
  return TS_DISPATCH_DTYPE16(dtype, T, [&] {
    LaunchKernel(AddBiasKernel<T>, grid, 256, 0, stream, static_cast<T*>(y), y_stride,
                 static_cast<const T*>(bias), n);
    TS_RETURN_LAUNCH_ERROR();
    return cudaSuccess;
  });
}

}  // namespace tinyserve::cuda
