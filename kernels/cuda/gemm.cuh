// File: kernels/cuda/gemm.cuh
// Dense GEMM through cuBLAS for the linear layers: y = x W^T with W in nn.Linear layout
// ([out][in], row-major), f16/bf16 operands, fp32 accumulation (cublasGemmEx). Weights are
// dequantized to f16/bf16 once at load (dequant.cuh). The handle owns a fixed workspace so
// that calls can be captured in CUDA graphs.
#pragma once

#include <cstdint>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch_status.cuh"

namespace tinyserve::cuda {

class CublasGemm {
 public:
  CublasGemm() = default;
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  // Creates the handle and its workspace on the current device. False (and LastLaunchError) on
  // failure; every other method then fails too.
  bool Init(size_t workspace_bytes = 32u << 20);

  // y[M][N] = x[M][K] . w[N][K]^T (+ beta * y). All row-major, one dtype (f16 or bf16).
  cudaError_t Linear(DType dtype, const void* x, const void* w, void* y, int M, int N, int K,
                     cudaStream_t stream, float beta = 0.f);
  // The same product with an f32 output y (for logits): x and w f16/bf16, y f32.
  cudaError_t LinearF32Out(DType dtype, const void* x, const void* w, float* y, int M, int N,
                           int K, cudaStream_t stream);

 private:
  cudaError_t Gemm(DType dtype, const void* x, const void* w, void* y, DType out_dtype, int M,
                   int N, int K, cudaStream_t stream, float beta);
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

}  // namespace tinyserve::cuda
