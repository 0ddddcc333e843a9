// File: kernels/cpu/split_tail.h
// The last, partial group (fewer than four blocks) of a split-layout row, copied into a full,
// zero-padded group so that the SIMD kernels run one code path. Included by each kernel
// translation unit; internal linkage keeps each copy compiled with its own ISA flags.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/ggml_types.h"

namespace tinyserve {
namespace {

struct TailGroup {
  alignas(64) uint8_t qs[128];  // Q4: 64 bytes used; Q8: [low halves][high halves]
  uint16_t d[4];
  uint16_t m[4];
};

// REQUIRES: nb % 4 != 0. row is a split-layout row of nb blocks.
inline void LoadTailGroup(GgmlType type, const uint8_t* row, int64_t nb, TailGroup* t) {
  const int64_t g = nb / 4, gs = nb - 4 * g;
  std::memset(t, 0, sizeof(*t));
  if (type == GgmlType::kQ8_0) {
    const uint8_t* p = row + g * 128;
    std::memcpy(t->qs, p, gs * 16);
    std::memcpy(t->qs + 64, p + gs * 16, gs * 16);
  } else {
    std::memcpy(t->qs, row + g * 64, gs * 16);
  }
  const uint8_t* dw = row + nb * (type == GgmlType::kQ8_0 ? 32 : 16);
  std::memcpy(t->d, dw + 8 * g, gs * 2);
  if (type == GgmlType::kQ4_1) std::memcpy(t->m, dw + 2 * nb + 8 * g, gs * 2);
}

}  // namespace
}  // namespace tinyserve
