#include "kernels/cpu/matmul.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "kernels/cpu/dequant.h"

namespace tinyserve {

Matrix MatrixView(GgmlType type, int64_t rows, int64_t cols, const void* data) {
  Matrix m;
  m.type = type;
  m.rows = rows;
  m.cols = cols;
  m.row_bytes = GgmlRowBytes(type, cols);
  m.data = static_cast<const uint8_t*>(data);
  return m;
}

static Matrix Owned(GgmlType type, int64_t rows, int64_t cols) {
  Matrix m;
  m.type = type;
  m.rows = rows;
  m.cols = cols;
  m.row_bytes = GgmlRowBytes(type, cols);
  m.storage = std::make_shared<std::vector<uint8_t>>(m.row_bytes * rows);
  m.data = m.storage->data();
  return m;
}

Matrix MatrixFromFloats(const float* data, int64_t rows, int64_t cols) {
  Matrix m = Owned(GgmlType::kF32, rows, cols);
  std::memcpy(m.storage->data(), data, m.storage->size());
  return m;
}

Matrix SliceRows(const Matrix& m, int64_t r0, int64_t r1) {
  TS_CHECK(0 <= r0 && r0 <= r1 && r1 <= m.rows);
  Matrix out = Owned(m.type, r1 - r0, m.cols);
  std::memcpy(out.storage->data(), m.Row(r0), out.storage->size());
  return out;
}

void MatrixRowToFloat(const Matrix& m, int64_t r, float* out) {
  TS_CHECK(DequantizeRow(m.type, m.Row(r), out, m.cols).ok());
}

absl::StatusOr<Matrix> SliceCols(const Matrix& m, int64_t c0, int64_t c1) {
  if (!(0 <= c0 && c0 <= c1 && c1 <= m.cols))
    return absl::InvalidArgumentError(absl::StrCat("column slice [", c0, ", ", c1, ") out of range"));
  const GgmlTypeInfo* info = GetGgmlTypeInfo(m.type);
  if (c0 % info->block_size == 0 && c1 % info->block_size == 0) {
    Matrix out = Owned(m.type, m.rows, c1 - c0);
    const size_t off = static_cast<size_t>(c0 / info->block_size) * info->block_bytes;
    for (int64_t r = 0; r < m.rows; ++r)
      std::memcpy(out.storage->data() + r * out.row_bytes, m.Row(r) + off, out.row_bytes);
    return out;
  }
  Matrix out = Owned(GgmlType::kF32, m.rows, c1 - c0);
  std::vector<float> row(m.cols);
  for (int64_t r = 0; r < m.rows; ++r) {
    MatrixRowToFloat(m, r, row.data());
    std::memcpy(out.storage->data() + r * out.row_bytes, row.data() + c0, (c1 - c0) * 4);
  }
  return out;
}

absl::StatusOr<Matrix> PrepareMatrix(Matrix m) {
  switch (m.type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ8_0:
      return m;
    default:
      break;
  }
  Matrix out = Owned(GgmlType::kF32, m.rows, m.cols);
  for (int64_t r = 0; r < m.rows; ++r) {
    auto s = DequantizeRow(m.type, m.Row(r), reinterpret_cast<float*>(out.storage->data()) + r * m.cols,
                           m.cols);
    if (!s.ok()) return s;
  }
  return out;
}

void MatMulReference(const Matrix& w, const float* x, int64_t n_tokens, float* y) {
  std::vector<float> row(w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    MatrixRowToFloat(w, r, row.data());
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x + t * w.cols;
      float acc = 0;
      for (int64_t c = 0; c < w.cols; ++c) acc += row[c] * xt[c];
      y[t * w.rows + r] = acc;
    }
  }
}

void MatMul(const Matrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool) {
  auto body = [&](int64_t r0, int64_t r1, int) {
    std::vector<float> row(w.cols);
    for (int64_t r = r0; r < r1; ++r) {
      const float* wr;
      if (w.type == GgmlType::kF32) {
        wr = reinterpret_cast<const float*>(w.Row(r));
      } else {
        MatrixRowToFloat(w, r, row.data());
        wr = row.data();
      }
      for (int64_t t = 0; t < n_tokens; ++t) {
        const float* xt = x + t * w.cols;
        float acc = 0;
        for (int64_t c = 0; c < w.cols; ++c) acc += wr[c] * xt[c];
        y[t * w.rows + r] = acc;
      }
    }
  };
  if (pool) {
    pool->ParallelFor(w.rows, body, 16);
  } else {
    body(0, w.rows, 0);
  }
}

}  // namespace tinyserve
