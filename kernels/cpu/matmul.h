// File: kernels/cpu/matmul.h
// Weight matrices and the CPU matrix products of the model runners.
//
// A Matrix is [rows, cols] in ggml layout: `rows` rows of `cols` elements, each row a whole
// number of blocks of `type`, rows `row_bytes` apart. y = x·Wᵀ: output r of token t is
// dot(W[r, :], x[t, :]). Data either points into a memory-mapped model file or is owned.
//
// MatMul supports F32, F16, Q4_0, Q4_1 and Q8_0 directly; PrepareMatrix converts any other
// supported type (BF16, Q5_0, Q5_1, Q4_K, Q6_K) to F32 once at load.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/thread_pool.h"
#include "kernels/cpu/ggml_types.h"

namespace tinyserve {

struct Matrix {
  GgmlType type = GgmlType::kF32;
  int64_t rows = 0;     // output features
  int64_t cols = 0;     // input features
  size_t row_bytes = 0;
  const uint8_t* data = nullptr;                   // [rows][row_bytes]
  std::shared_ptr<std::vector<uint8_t>> storage;   // set when the matrix owns its bytes

  const uint8_t* Row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
};

// Wraps bytes that stay alive elsewhere (an mmap).
Matrix MatrixView(GgmlType type, int64_t rows, int64_t cols, const void* data);
// Copies rows [r0, r1) into an owned matrix.
Matrix SliceRows(const Matrix& m, int64_t r0, int64_t r1);
// Copies columns [c0, c1) of every row into an owned matrix. Quantized types keep their type
// when c0 and c1 fall on block boundaries; otherwise the result is F32.
absl::StatusOr<Matrix> SliceCols(const Matrix& m, int64_t c0, int64_t c1);
// Converts to a type MatMul runs directly (see above); others pass through unchanged.
absl::StatusOr<Matrix> PrepareMatrix(Matrix m);
// Dequantizes one row to float.
void MatrixRowToFloat(const Matrix& m, int64_t r, float* out);
// An owned F32 matrix from floats [rows][cols].
Matrix MatrixFromFloats(const float* data, int64_t rows, int64_t cols);

// y[t, r] = dot(W[r, :], x[t, :]) for t < n_tokens; x [n_tokens, cols], y [n_tokens, rows]
// (rows of y are `rows` apart). Work is split over output rows across the pool's threads.
void MatMul(const Matrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool);

// The straightforward version (dequantize a row, float dot): the oracle for tests of MatMul.
void MatMulReference(const Matrix& w, const float* x, int64_t n_tokens, float* y);

}  // namespace tinyserve
