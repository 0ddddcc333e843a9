#include "kernels/cpu/weight_layout.h"

#include <algorithm>
#include <cstring>

namespace tinyserve {

bool HasSplitLayout(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
    case GgmlType::kIQ4_NL:
      return true;
    default:
      return false;
  }
}

int SplitQsBytes(GgmlType type) { return type == GgmlType::kQ8_0 ? 32 : 16; }

namespace {

// Offset of the ggml block's header fields, qh and qs.
struct GgmlBlockShape {
  int block_bytes;
  int header_bytes;  // 2 (d) or 4 (d, m)
  int qh_bytes;      // 4 (Q5) or 0
};

GgmlBlockShape ShapeOf(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kIQ4_NL:
      return {18, 2, 0};
    case GgmlType::kQ4_1:
      return {20, 4, 0};
    case GgmlType::kQ5_0:
      return {22, 2, 4};
    case GgmlType::kQ5_1:
      return {24, 4, 4};
    default:
      return {34, 2, 0};
  }
}

// Calls f(offset_in_ggml_block, split_offset, bytes) for every qs and qh piece of block b.
template <typename F>
void ForEachPiece(GgmlType type, int64_t nb, int64_t b, F f) {
  const GgmlBlockShape s = ShapeOf(type);
  const int64_t g = b / 4, k = b % 4, gs = std::min<int64_t>(4, nb - 4 * g);
  const int qs = s.header_bytes + s.qh_bytes;  // qs offset in the ggml block
  if (type == GgmlType::kQ8_0) {
    const int64_t base = g * 128;
    f(qs, base + k * 16, 16);
    f(qs + 16, base + gs * 16 + k * 16, 16);
  } else {
    f(qs, b * 16, 16);
  }
  if (s.qh_bytes != 0) {  // little-endian qh: bytes 0-1 are bits 0..15
    const int64_t base = nb * 16 + g * 16;
    f(s.header_bytes, base + 2 * k, 2);
    f(s.header_bytes + 2, base + 2 * gs + 2 * k, 2);
  }
}

}  // namespace

void RepackRowToSplit(GgmlType type, const uint8_t* ggml_row, uint8_t* split_row, int64_t nb) {
  const GgmlBlockShape s = ShapeOf(type);
  const int64_t scales = SplitScalesOffset(type, nb);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = ggml_row + b * s.block_bytes;
    ForEachPiece(type, nb, b, [&](int64_t src, int64_t dst, int64_t n) {
      std::memcpy(split_row + dst, blk + src, n);
    });
    std::memcpy(split_row + scales + 2 * b, blk, 2);
    if (s.header_bytes == 4) std::memcpy(split_row + scales + 2 * nb + 2 * b, blk + 2, 2);
  }
}

void UnpackRowFromSplit(GgmlType type, const uint8_t* split_row, uint8_t* ggml_row, int64_t nb) {
  const GgmlBlockShape s = ShapeOf(type);
  const int64_t scales = SplitScalesOffset(type, nb);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* blk = ggml_row + b * s.block_bytes;
    ForEachPiece(type, nb, b, [&](int64_t dst, int64_t src, int64_t n) {
      std::memcpy(blk + dst, split_row + src, n);
    });
    std::memcpy(blk, split_row + scales + 2 * b, 2);
    if (s.header_bytes == 4) std::memcpy(blk + 2, split_row + scales + 2 * nb + 2 * b, 2);
  }
}

}  // namespace tinyserve
