#include "kernels/cuda/gemm.cuh"

namespace tinyserve::cuda {

CublasGemm::~CublasGemm() {
  if (handle_) cublasDestroy(handle_);
  if (workspace_) cudaFree(workspace_);
}

bool CublasGemm::Init(size_t workspace_bytes) {
  if (handle_) return true;
  if (cublasCreate(&handle_) != CUBLAS_STATUS_SUCCESS) {
    handle_ = nullptr;
    SetLaunchError("cublasCreate failed");
    return false;
  }
  if (cudaMalloc(&workspace_, workspace_bytes) != cudaSuccess) {
    workspace_ = nullptr;
    SetLaunchError("CublasGemm: workspace allocation failed");
    return false;
  }
  workspace_bytes_ = workspace_bytes;
  if (cublasSetWorkspace(handle_, workspace_, workspace_bytes_) != CUBLAS_STATUS_SUCCESS) {
    SetLaunchError("cublasSetWorkspace failed");
    return false;
  }
  return true;
}

cudaError_t CublasGemm::Linear(DType dtype, const void* x, const void* w, void* y, int M, int N,
                               int K, cudaStream_t stream, float beta) {
  return Gemm(dtype, x, w, y, dtype, M, N, K, stream, beta);
}

cudaError_t CublasGemm::LinearF32Out(DType dtype, const void* x, const void* w, float* y, int M,
                                     int N, int K, cudaStream_t stream) {
  return Gemm(dtype, x, w, y, DType::kF32, M, N, K, stream, 0.f);
}

cudaError_t CublasGemm::Gemm(DType dtype, const void* x, const void* w, void* y, DType out_dtype,
                             int M, int N, int K, cudaStream_t stream, float beta) {
  TS_REQUIRE(handle_ && workspace_, "CublasGemm: not initialised");
  TS_REQUIRE(x && w && y && M > 0 && N > 0 && K > 0, "CublasGemm::Linear: bad arguments");
  TS_REQUIRE(dtype == DType::kF16 || dtype == DType::kBF16, "CublasGemm: f16 or bf16 only");
  const cudaDataType_t t = dtype == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF;
  const cudaDataType_t ty = out_dtype == DType::kF32 ? CUDA_R_32F : t;
  if (cublasSetStream(handle_, stream) != CUBLAS_STATUS_SUCCESS) {
    SetLaunchError("cublasSetStream failed");
    return cudaErrorUnknown;
  }
  // Column-major view: y^T [N][M] = W [N][K] (w read as K x N, transposed) * x^T [K][M].
  const float alpha = 1.f;
  const cublasStatus_t s =
      cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, w, t, K, x, t, K, &beta, y,
                   ty, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS) {
    SetLaunchError("cublasGemmEx failed");
    return cudaErrorUnknown;
  }
  return cudaSuccess;
}

}  // namespace tinyserve::cuda
