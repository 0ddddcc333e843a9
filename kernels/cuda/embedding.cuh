// File: kernels/cuda/embedding.cuh
// Token embedding lookup.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch_status.cuh"

namespace tinyserve::cuda {

// out[r] = table[ids[r]]; an id outside [0, vocab) gives a zero row (checked on the device).
//   table [vocab][dim], ids [rows], out [rows][dim]; dim % 8 == 0.
cudaError_t EmbeddingLookup(DType dtype, const void* table, const int32_t* ids, void* out,
                            int rows, int vocab, int dim, cudaStream_t stream);

}  // namespace tinyserve::cuda
