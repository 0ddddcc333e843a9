// File: kernels/cpu/matmul.h
// Weight matrices and the CPU matrix products of the model runners.
//
// A Matrix is [rows, cols] in ggml layout: `rows` rows of `cols` elements, each row a whole
// number of blocks of `type`, rows `row_bytes` apart. y = x·Wᵀ: output r of token t is
// dot(W[r, :], x[t, :]). Data either points into a memory-mapped model file or is owned.
//
// MatMul supports F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL directly. PrepareMatrix
// converts the other quantized types once at load (weight_convert.h: Q4_K to Q4_1, Q5_K to Q5_1
// and IQ4_XS to IQ4_NL with fp16-rounded scales; Q2_K, Q3_K, Q6_K requantized to Q8_0) and BF16
// to F32, and repacks the MatMul types into the split layout of weight_layout.h (same size; one
// SIMD load per four blocks) unless TINYSERVE_REPACK=0. A matrix in ggml layout still works
// everywhere, only slower.
//
// How MatMul computes (the llama.cpp scheme, shared/reference/model-formats.md §11): the
// activations are quantized once per call and token row, to Q8_0 (Q4_0, Q5_0, Q8_0, IQ4_NL) or
// Q8_1 (Q4_1, Q5_1 weights), and every output is a sum over blocks of integer block dots times the
// block scales, in fp32 (quant_kernels.h gives the exact formulas). So y differs from the float
// product by the activation quantization error (about 1e-2 of Σ|w·x| at worst); against a
// reference that uses the same quantized activations it agrees to fp32 rounding. F32 and F16
// weights multiply float activations directly. The instruction set (scalar, AVX2, AVX-512 VNNI)
// is picked at run time; see cpu_features.h and TINYSERVE_CPU_ISA. On a CPU with AMX, products
// of kAmxMinTokens (12) or more token rows on repacked weights multiply in bf16 on the tile unit
// instead (quant_dot_amx.cc): |y − Σ w·x| <= (2^-8 + fp32 rounding)·Σ|w·x|.
//
// Threads: MatMul splits output rows over the pool when the matrix is big enough to pay for the
// synchronisation (kMatMulMinBytesPerThread) and runs inline on the caller otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/thread_pool.h"
#include "kernels/cpu/ggml_types.h"

namespace tinyserve {

// How the rows of a quantized matrix are arranged.
enum class MatrixLayout {
  kGgml,   // ggml blocks, as in the GGUF file
  kSplit,  // weight_layout.h (Q4_0, Q4_1, Q8_0 only); owned storage
};

struct Matrix {
  GgmlType type = GgmlType::kF32;
  MatrixLayout layout = MatrixLayout::kGgml;
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
// Converts to a type MatMul runs directly (see above) and repacks Q4_0 / Q4_1 / Q8_0 to the
// split layout when RepackEnabled(); F32 and F16 pass through unchanged.
absl::StatusOr<Matrix> PrepareMatrix(Matrix m);
// False when the environment sets TINYSERVE_REPACK=0 (read once).
bool RepackEnabled();
// The matrix in split layout (a copy; REQUIRES: Q4_0, Q4_1 or Q8_0), and back in ggml layout
// (returned as is when already ggml).
Matrix RepackToSplit(const Matrix& m);
Matrix ToGgmlLayout(const Matrix& m);
// Dequantizes one row to float.
void MatrixRowToFloat(const Matrix& m, int64_t r, float* out);
// An owned F32 matrix from floats [rows][cols].
Matrix MatrixFromFloats(const float* data, int64_t rows, int64_t cols);

// The most token rows a product may have for each row's result not to depend on the number of
// rows it runs with: kAmxMinTokens - 1 where MatMul's path is AMX (bf16 tiles from there on),
// else no limit.
int64_t MatMulInvariantRows();

// y[t, r] = dot(W[r, :], x[t, :]) for t < n_tokens; x [n_tokens, cols], y [n_tokens, rows]
// (rows of y are `rows` apart). Work is split over output rows across the pool's threads.
void MatMul(const Matrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool);

// MatMul runs on one thread when the weights are smaller than this many bytes per extra
// thread (per token row for n_tokens > 1 it counts n_tokens times): below it, waking and
// joining a thread costs more than it saves. Measured by bench/matmul_bench.cc.
inline constexpr size_t kMatMulMinBytesPerThread = 64 * 1024;

// The straightforward version (dequantize a row, float dot): the oracle for tests of MatMul.
// TINYSERVE_MATMUL_EXACT=1 makes MatMul use it (fp32 activations, no quantization): a switch
// for numerical studies (docs/CORRECTNESS.md), far slower.
void MatMulReference(const Matrix& w, const float* x, int64_t n_tokens, float* y);

}  // namespace tinyserve
