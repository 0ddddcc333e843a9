// File: kernels/cuda/sampling.cuh
// Sampling helpers over logits rows: argmax, and softmax with temperature and a top-k mask.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch_status.cuh"

namespace tinyserve::cuda {

// out[r] = index of the largest logit of row r, ties to the lowest index, NaN never wins
// (a row of NaN gives 0). logits [rows][vocab] in f32, f16 or bf16; out [rows].
cudaError_t ArgmaxRows(DType dtype, const void* logits, int rows, int vocab, int32_t* out,
                       cudaStream_t stream);

// probs[r] = softmax(logits[r] / temperature) restricted to the top_k largest logits (ties to the
// lower index; top_k <= 0 or >= vocab keeps all), zeros elsewhere. temperature > 0.
// logits [rows][vocab]; probs [rows][vocab] f32 (also used as scratch).
cudaError_t SoftmaxTopK(DType dtype, const void* logits, int rows, int vocab, float temperature,
                        int top_k, float* probs, cudaStream_t stream);

}  // namespace tinyserve::cuda
