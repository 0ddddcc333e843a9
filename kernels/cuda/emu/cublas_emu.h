// File: kernels/cuda/emu/cublas_emu.h
// The cuBLAS entry points gemm.cu loads, emulated on the CPU (cudart_emu.cc) for TS_CUDA_EMU
// builds; same signatures as the library's.
#pragma once

#include <cublas_v2.h>

namespace ts_emu {

cublasStatus_t EmuCublasCreate(cublasHandle_t* h);
cublasStatus_t EmuCublasDestroy(cublasHandle_t h);
cublasStatus_t EmuCublasSetWorkspace(cublasHandle_t h, void* workspace, size_t bytes);
cublasStatus_t EmuCublasSetStream(cublasHandle_t h, cudaStream_t stream);
cublasStatus_t EmuCublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                               int n, int k, const void* alpha, const void* A, cudaDataType at,
                               int lda, const void* B, cudaDataType bt, int ldb, const void* beta,
                               void* C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                               cublasGemmAlgo_t algo);

}  // namespace ts_emu
