#include "kernels/cpu/weight_layout.h"

#include <algorithm>
#include <cstring>

namespace tinyserve {

bool HasSplitLayout(GgmlType type) {
  return type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1 || type == GgmlType::kQ8_0;
}

int SplitQsBytes(GgmlType type) { return type == GgmlType::kQ8_0 ? 32 : 16; }

namespace {

// Offset of the ggml block's header fields and qs.
struct GgmlBlockShape {
  int block_bytes;
  int header_bytes;  // 2 (d) or 4 (d, m)
};

GgmlBlockShape ShapeOf(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return {18, 2};
    case GgmlType::kQ4_1:
      return {20, 4};
    default:
      return {34, 2};
  }
}

// Calls f(ggml_qs_offset_in_block, split_offset, bytes) for every qs piece of block b.
template <typename F>
void ForEachQsPiece(GgmlType type, int64_t nb, int64_t b, F f) {
  const int64_t g = b / 4, k = b % 4, gs = std::min<int64_t>(4, nb - 4 * g);
  if (type == GgmlType::kQ8_0) {
    const int64_t base = g * 128;
    f(0, base + k * 16, 16);
    f(16, base + gs * 16 + k * 16, 16);
  } else {
    f(0, b * 16, 16);
  }
}

}  // namespace

void RepackRowToSplit(GgmlType type, const uint8_t* ggml_row, uint8_t* split_row, int64_t nb) {
  const GgmlBlockShape s = ShapeOf(type);
  const int64_t qs_region = nb * SplitQsBytes(type);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = ggml_row + b * s.block_bytes;
    ForEachQsPiece(type, nb, b, [&](int64_t src, int64_t dst, int64_t n) {
      std::memcpy(split_row + dst, blk + s.header_bytes + src, n);
    });
    std::memcpy(split_row + qs_region + 2 * b, blk, 2);
    if (s.header_bytes == 4) std::memcpy(split_row + qs_region + 2 * nb + 2 * b, blk + 2, 2);
  }
}

void UnpackRowFromSplit(GgmlType type, const uint8_t* split_row, uint8_t* ggml_row, int64_t nb) {
  const GgmlBlockShape s = ShapeOf(type);
  const int64_t qs_region = nb * SplitQsBytes(type);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* blk = ggml_row + b * s.block_bytes;
    ForEachQsPiece(type, nb, b, [&](int64_t dst, int64_t src, int64_t n) {
      std::memcpy(blk + s.header_bytes + dst, split_row + src, n);
    });
    std::memcpy(blk, split_row + qs_region + 2 * b, 2);
    if (s.header_bytes == 4) std::memcpy(blk + 2, split_row + qs_region + 2 * nb + 2 * b, 2);
  }
}

}  // namespace tinyserve
