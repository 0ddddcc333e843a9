#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "kernels/cpu/aligned_scratch.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/quant_kernels.h"
#include "kernels/cpu/weight_convert.h"
#include "kernels/cpu/weight_layout.h"

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
  out.layout = m.layout;  // rows are independent in either layout
  std::memcpy(out.storage->data(), m.Row(r0), out.storage->size());
  return out;
}

void MatrixRowToFloat(const Matrix& m, int64_t r, float* out) {
  if (m.layout == MatrixLayout::kSplit) {
    std::vector<uint8_t> ggml(m.row_bytes);
    UnpackRowFromSplit(m.type, m.Row(r), ggml.data(), m.cols / 32);
    TS_CHECK(DequantizeRow(m.type, ggml.data(), out, m.cols).ok());
    return;
  }
  TS_CHECK(DequantizeRow(m.type, m.Row(r), out, m.cols).ok());
}

bool RepackEnabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("TINYSERVE_REPACK");
    return env == nullptr || std::string(env) != "0";
  }();
  return enabled;
}

Matrix RepackToSplit(const Matrix& m) {
  TS_CHECK(HasSplitLayout(m.type)) << GgmlTypeName(m.type);
  if (m.layout == MatrixLayout::kSplit) return m;
  Matrix out = Owned(m.type, m.rows, m.cols);
  out.layout = MatrixLayout::kSplit;
  for (int64_t r = 0; r < m.rows; ++r)
    RepackRowToSplit(m.type, m.Row(r), out.storage->data() + r * out.row_bytes, m.cols / 32);
  return out;
}

Matrix ToGgmlLayout(const Matrix& m) {
  if (m.layout == MatrixLayout::kGgml) return m;
  Matrix out = Owned(m.type, m.rows, m.cols);
  for (int64_t r = 0; r < m.rows; ++r)
    UnpackRowFromSplit(m.type, m.Row(r), out.storage->data() + r * out.row_bytes, m.cols / 32);
  return out;
}

absl::StatusOr<Matrix> SliceCols(const Matrix& split_or_ggml, int64_t c0, int64_t c1) {
  const Matrix m = ToGgmlLayout(split_or_ggml);
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
      return m;
    default:
      if (HasSplitLayout(m.type)) return RepackEnabled() ? RepackToSplit(m) : m;
      break;
  }
  const GgmlType to = ConvertedType(m.type);
  if (to != m.type && WeightConversionEnabled()) {
    Matrix out = Owned(to, m.rows, m.cols);
    bool ok = true;
    for (int64_t r = 0; r < m.rows && ok; ++r)
      ok = ConvertRow(m.type, m.Row(r), out.storage->data() + r * out.row_bytes, m.cols);
    if (ok) return RepackEnabled() ? RepackToSplit(out) : out;
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

#if !defined(TINYSERVE_AMX_KERNELS)
bool DequantRowBf16ForTest(GgmlType, const uint8_t*, int64_t, uint8_t*) { return false; }
#endif

const CpuKernels& CpuKernelsFor(CpuIsa isa) {
#if defined(TINYSERVE_X86_KERNELS)
#if defined(TINYSERVE_AMX_KERNELS)
  if (isa == CpuIsa::kAmx) return AmxCpuKernels();
#endif
  if (isa >= CpuIsa::kAvx512) return Avx512CpuKernels();
  if (isa == CpuIsa::kAvx2) return Avx2CpuKernels();
#else
  (void)isa;
#endif
  return ScalarCpuKernels();
}

namespace {

// Runs body(r0, r1, thread) over the output rows: on the caller alone when the work is too small
// to share (see kMatMulMinBytesPerThread), else split in row ranges aligned to 16 rows (one
// cache line of y per range boundary).
void ForRows(const Matrix& w, int64_t n_tokens, ThreadPool* pool,
             const std::function<void(int64_t, int64_t, int)>& body) {
  const size_t work = w.row_bytes * static_cast<size_t>(w.rows) * static_cast<size_t>(n_tokens);
  if (pool == nullptr || pool->num_threads() == 1 || work < 2 * kMatMulMinBytesPerThread ||
      w.rows < 32) {
    body(0, w.rows, 0);
    return;
  }
  pool->ParallelFor(w.rows, body, 16);
}

}  // namespace

int64_t MatMulInvariantRows() {
  return ActiveCpuIsa() == CpuIsa::kAmx ? kAmxMinTokens - 1 : std::numeric_limits<int64_t>::max();
}

void MatMul(const Matrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool) {
  if (n_tokens <= 0 || w.rows == 0) return;
  static const bool exact = [] {
    const char* v = std::getenv("TINYSERVE_MATMUL_EXACT");
    return v != nullptr && v[0] == '1';
  }();
  if (exact) {  // float activations, no quantization: a reference for numerical studies
    MatMulReference(w, x, n_tokens, y);
    return;
  }
  const CpuKernels& k = CpuKernelsFor(ActiveCpuIsa());
  switch (w.type) {
    case GgmlType::kF32:
      ForRows(w, n_tokens, pool, [&](int64_t r0, int64_t r1, int) {
        k.gemm_f32(reinterpret_cast<const float*>(w.Row(r0)), static_cast<int64_t>(w.row_bytes / 4),
                   r1 - r0, w.cols, x, n_tokens, y + r0, w.rows);
      });
      return;
    case GgmlType::kF16:
      ForRows(w, n_tokens, pool, [&](int64_t r0, int64_t r1, int) {
        k.gemm_f16(reinterpret_cast<const uint16_t*>(w.Row(r0)),
                   static_cast<int64_t>(w.row_bytes / 2), r1 - r0, w.cols, x, n_tokens, y + r0,
                   w.rows);
      });
      return;
    default: {
      if (HasSplitLayout(w.type)) break;
      // Not a MatMul type (PrepareMatrix converts these): dequantize row by row.
      ForRows(w, n_tokens, pool, [&](int64_t r0, int64_t r1, int) {
        std::vector<float> row(w.cols);
        for (int64_t r = r0; r < r1; ++r) {
          MatrixRowToFloat(w, r, row.data());
          k.gemm_f32(row.data(), w.cols, 1, w.cols, x, n_tokens, y + r, w.rows);
        }
      });
      return;
    }
  }

  // Many tokens on split-layout weights take the tile path (AMX, bf16) where the CPU has one.
  // Either path converts the activations once (token rows in parallel when there are many).
  const TileKernels* tiles =
      k.tiles != nullptr && w.layout == MatrixLayout::kSplit && n_tokens >= k.tiles->min_tokens
          ? k.tiles
          : nullptr;
  static thread_local AlignedScratch act_scratch;
  if (tiles != nullptr) {
    const size_t tile_bytes = tiles->tile_bytes(w.cols);
    const int64_t n_tiles = (n_tokens + kTileTokens - 1) / kTileTokens;
    uint8_t* acts = act_scratch.Get(tile_bytes * static_cast<size_t>(n_tiles));
    auto quantize = [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t t = i * kTileTokens;
        tiles->convert_tile(w.type, x + t * w.cols, std::min(kTileTokens, n_tokens - t), w.cols,
                            acts + i * tile_bytes);
      }
    };
    if (pool != nullptr && pool->num_threads() > 1 && n_tiles > 1) {
      pool->ParallelFor(n_tiles, quantize);
    } else {
      quantize(0, n_tiles, 0);
    }
    ForRows(w, n_tokens, pool, [&](int64_t r0, int64_t r1, int) {
      tiles->gemm_split(w.type, w.Row(r0), w.row_bytes, r1 - r0, w.cols, acts, n_tokens, y + r0,
                        w.rows);
    });
    return;
  }
  const size_t act_stride = ActRowBytes(w.cols);
  uint8_t* acts = act_scratch.Get(act_stride * static_cast<size_t>(n_tokens));
  auto quantize = [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) k.quantize_acts(w.type, x + t * w.cols, w.cols, acts + t * act_stride);
  };
  if (pool != nullptr && pool->num_threads() > 1 && n_tokens >= 16) {
    pool->ParallelFor(n_tokens, quantize);
  } else {
    quantize(0, n_tokens, 0);
  }

  if (w.layout == MatrixLayout::kSplit) {
    ForRows(w, n_tokens, pool, [&](int64_t r0, int64_t r1, int) {
      k.gemm_split(w.type, w.Row(r0), w.row_bytes, r1 - r0, w.cols, acts, act_stride, n_tokens,
                   y + r0, w.rows);
    });
    return;
  }
  // ggml layout: repack a few rows at a time into per-thread scratch (stays in L1).
  ForRows(w, n_tokens, pool, [&](int64_t r0, int64_t r1, int) {
    static thread_local AlignedScratch row_scratch;
    constexpr int64_t kChunk = 8;
    uint8_t* buf = row_scratch.Get(w.row_bytes * kChunk);
    for (int64_t r = r0; r < r1; r += kChunk) {
      const int64_t n = std::min(kChunk, r1 - r);
      for (int64_t i = 0; i < n; ++i)
        RepackRowToSplit(w.type, w.Row(r + i), buf + i * w.row_bytes, w.cols / 32);
      k.gemm_split(w.type, buf, w.row_bytes, n, w.cols, acts, act_stride, n_tokens, y + r, w.rows);
    }
  });
}

}  // namespace tinyserve
