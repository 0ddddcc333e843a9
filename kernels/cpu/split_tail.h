// File: kernels/cpu/split_tail.h
// The last, partial group (fewer than four blocks) of a split-layout row, copied into a full,
// zero-padded group so that the SIMD kernels run one code path. Included by each kernel
// translation unit; internal linkage keeps each copy compiled with its own ISA flags.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/ggml_types.h"
#include "kernels/cpu/weight_layout.h"

namespace tinyserve {
namespace {

struct TailGroup {
  alignas(64) uint8_t qs[128];  // Q4 / Q5: 64 bytes used; Q8: [low halves][high halves]
  uint8_t qh[16];               // Q5: [low bits of 4 blocks][high bits of 4 blocks]
  uint16_t d[4];
  uint16_t m[4];
};

// The copies of LoadTailGroup for a tail of GS blocks: constant sizes, so they compile to a few
// vector moves (a loop over the blocks became a libc memcpy call per row, 8 % of an AVX2 decode).
template <int GS>
inline void CopyTailGroup(GgmlType type, const uint8_t* row, int64_t nb, TailGroup* t) {
  const int64_t g = nb / 4;
  const uint8_t* dw = row + SplitScalesOffset(type, nb);
  if (type == GgmlType::kQ8_0) {
    std::memcpy(t->qs, row + g * 128, 16 * GS);
    std::memcpy(t->qs + 64, row + g * 128 + 16 * GS, 16 * GS);
  } else {
    std::memcpy(t->qs, row + g * 64, 16 * GS);
  }
  if (SplitQhBytes(type) != 0) {
    const uint8_t* qh = row + nb * 16 + g * 16;
    std::memcpy(t->qh, qh, 2 * GS);
    std::memcpy(t->qh + 8, qh + 2 * GS, 2 * GS);
  }
  std::memcpy(t->d, dw + 8 * g, 2 * GS);
  if (type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1)
    std::memcpy(t->m, dw + 2 * nb + 8 * g, 2 * GS);
}

// Zeroes t; once per matrix product, not per row.
inline void InitTailGroup(TailGroup* t) { std::memset(t, 0, sizeof(*t)); }

// REQUIRES: nb % 4 != 0; row is a split-layout row of nb blocks; t was zeroed by InitTailGroup
// and since then loaded only with rows of nb blocks (each load writes the same first nb % 4
// blocks, so the padding stays zero).
inline void LoadTailGroup(GgmlType type, const uint8_t* row, int64_t nb, TailGroup* t) {
  switch (nb % 4) {
    case 1:
      CopyTailGroup<1>(type, row, nb, t);
      break;
    case 2:
      CopyTailGroup<2>(type, row, nb, t);
      break;
    default:
      CopyTailGroup<3>(type, row, nb, t);
      break;
  }
}

}  // namespace
}  // namespace tinyserve
