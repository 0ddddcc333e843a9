// File: kernels/cuda/test_util.cuh
// Shared by the *_test.cu files: the skip-without-GPU fixture, device buffers, rounding of random
// inputs to the kernel dtype (so the CPU reference sees exactly what the GPU sees), NaN poisoning
// and an allclose comparison that reports the worst element.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/dtype.cuh"

namespace tinyserve::cuda::testing {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

// A device allocation; poisoned (all bytes 0xFF: NaN in f32, f16 and bf16) on request.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { Resize(bytes); }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void Resize(size_t bytes) {
    if (ptr_) TS_CUDA_CHECK(cudaFree(ptr_));
    ptr_ = nullptr;
    bytes_ = bytes;
    if (bytes) TS_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
  void Poison() { TS_CUDA_CHECK(cudaMemset(ptr_, 0xFF, bytes_)); }
  template <typename U = void>
  U* get() const {
    return static_cast<U*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

inline float RoundTo(DType t, float x) {
  if (t == DType::kF16) return __half2float(__float2half_rn(x));
  if (t == DType::kBF16) return __bfloat162float(__float2bfloat16_rn(x));
  return x;
}

// Uniform [lo, hi) values already rounded to dtype t.
inline std::vector<float> RandomRounded(std::mt19937& rng, DType t, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = RoundTo(t, u(rng));
  return v;
}

// Host floats -> device buffer of dtype t (allocates).
inline void Upload(DeviceBuffer& buf, DType t, const std::vector<float>& v) {
  buf.Resize(v.size() * DTypeBytes(t));
  if (t == DType::kF32) {
    TS_CUDA_CHECK(cudaMemcpy(buf.get(), v.data(), buf.bytes(), cudaMemcpyHostToDevice));
    return;
  }
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kF16) {
      bits[i] = static_cast<__half_raw>(__float2half_rn(v[i])).x;
    } else {
      bits[i] = static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(v[i])).x;
    }
  }
  TS_CUDA_CHECK(cudaMemcpy(buf.get(), bits.data(), buf.bytes(), cudaMemcpyHostToDevice));
}

// Device buffer of dtype t (n elements) -> host floats.
inline std::vector<float> Download(const void* dev, DType t, size_t n) {
  std::vector<float> v(n);
  if (t == DType::kF32) {
    TS_CUDA_CHECK(cudaMemcpy(v.data(), dev, n * 4, cudaMemcpyDeviceToHost));
    return v;
  }
  std::vector<uint16_t> bits(n);
  TS_CUDA_CHECK(cudaMemcpy(bits.data(), dev, n * 2, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::kF16) {
      __half_raw r;
      r.x = bits[i];
      v[i] = __half2float(__half(r));
    } else {
      __nv_bfloat16_raw r;
      r.x = bits[i];
      v[i] = __bfloat162float(__nv_bfloat16(r));
    }
  }
  return v;
}

template <typename I>
inline void UploadInts(DeviceBuffer& buf, const std::vector<I>& v) {
  buf.Resize(std::max<size_t>(1, v.size()) * sizeof(I));
  if (!v.empty())
    TS_CUDA_CHECK(cudaMemcpy(buf.get(), v.data(), v.size() * sizeof(I), cudaMemcpyHostToDevice));
}
template <typename I>
inline std::vector<I> DownloadInts(const void* dev, size_t n) {
  std::vector<I> v(n);
  if (n) TS_CUDA_CHECK(cudaMemcpy(v.data(), dev, n * sizeof(I), cudaMemcpyDeviceToHost));
  return v;
}

// Tolerance of a kernel output in dtype t (rtol = atol): output rounding plus fp32 arithmetic.
inline float Tol(DType t) { return t == DType::kBF16 ? 1.5e-2f : (t == DType::kF16 ? 2e-3f : 1e-4f); }

// Every element within atol + rtol*|ref|, no NaN anywhere; the message names the configuration
// and the worst element.
inline ::testing::AssertionResult AllClose(const std::string& config, const std::vector<float>& got,
                                           const std::vector<float>& ref, float rtol, float atol) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << config << ": size " << got.size() << " vs "
                                         << ref.size();
  size_t bad = 0, worst = 0, nan = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) || std::isnan(ref[i])) {
      ++nan;
      worst = i;
      continue;
    }
    const double err = std::fabs(double(got[i]) - ref[i]);
    const double lim = atol + rtol * std::fabs(ref[i]);
    if (err > lim) ++bad;
    if (err - lim > worst_excess && nan == 0) {
      worst_excess = err - lim;
      worst = i;
    }
  }
  if (bad == 0 && nan == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << config << ": " << bad << " of " << got.size() << " elements out of tolerance, " << nan
         << " NaN; worst at " << worst << ": got " << got[worst] << " want " << ref[worst]
         << " (rtol " << rtol << ", atol " << atol << ")";
}

}  // namespace tinyserve::cuda::testing
