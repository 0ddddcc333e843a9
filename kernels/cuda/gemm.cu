#include "kernels/cuda/gemm.cuh"

#include <dlfcn.h>

#ifdef TS_CUDA_EMU
#include "kernels/cuda/emu/cublas_emu.h"
#endif

namespace tinyserve::cuda {

namespace {

// cuBLAS is loaded with dlopen on first use, not linked: a linked libcublasLt puts ~94 KB of
// static TLS into every thread of the process, more than the fixed stacks some libraries give
// their threads (civetweb's /metrics threads then fail with EINVAL); loaded later, its TLS is
// allocated dynamically and only processes that use the GPU pay for it.
struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  // The cublasComputeType_t overload (the header adds a C++ one taking cudaDataType).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*,
                            cudaDataType, int, const void*, void*, cudaDataType, int,
                            cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  bool ok = false;
};

const CublasApi& Api() {
  static const CublasApi api = [] {
    CublasApi a;
#ifdef TS_CUDA_EMU
    a.create = ts_emu::EmuCublasCreate;
    a.destroy = ts_emu::EmuCublasDestroy;
    a.set_workspace = ts_emu::EmuCublasSetWorkspace;
    a.set_stream = ts_emu::EmuCublasSetStream;
    a.gemm_ex = ts_emu::EmuCublasGemmEx;
    a.ok = true;
    return a;
#endif
    void* lib = nullptr;
    for (const char* name : {TS_CUBLAS_PATH, TS_CUBLAS_SONAME, "libcublas.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
    }
    if (lib == nullptr) return a;
    a.create = reinterpret_cast<decltype(a.create)>(dlsym(lib, "cublasCreate_v2"));
    a.destroy = reinterpret_cast<decltype(a.destroy)>(dlsym(lib, "cublasDestroy_v2"));
    a.set_workspace =
        reinterpret_cast<decltype(a.set_workspace)>(dlsym(lib, "cublasSetWorkspace_v2"));
    a.set_stream = reinterpret_cast<decltype(a.set_stream)>(dlsym(lib, "cublasSetStream_v2"));
    a.gemm_ex = reinterpret_cast<decltype(a.gemm_ex)>(dlsym(lib, "cublasGemmEx"));
    a.ok = a.create && a.destroy && a.set_workspace && a.set_stream && a.gemm_ex;
    return a;
  }();
  return api;
}

}  // namespace

CublasGemm::~CublasGemm() {
  if (handle_) Api().destroy(handle_);
  if (workspace_) cudaFree(workspace_);
}

bool CublasGemm::Init(size_t workspace_bytes) {
  if (handle_) return true;
  if (!Api().ok) {
    SetLaunchError("cannot load cuBLAS (" TS_CUBLAS_SONAME ") with dlopen");
    return false;
  }
  if (Api().create(&handle_) != CUBLAS_STATUS_SUCCESS) {
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
  if (Api().set_workspace(handle_, workspace_, workspace_bytes_) != CUBLAS_STATUS_SUCCESS) {
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
  if (Api().set_stream(handle_, stream) != CUBLAS_STATUS_SUCCESS) {
    SetLaunchError("cublasSetStream failed");
    return cudaErrorUnknown;
  }
  // Column-major view: y^T [N][M] = W [N][K] (w read as K x N, transposed) * x^T [K][M].
  const float alpha = 1.f;
  const cublasStatus_t s =
      Api().gemm_ex(handle_, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, w, t, K, x, t, K, &beta, y,
                   ty, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS) {
    SetLaunchError("cublasGemmEx failed");
    return cudaErrorUnknown;
  }
  return cudaSuccess;
}

}  // namespace tinyserve::cuda
