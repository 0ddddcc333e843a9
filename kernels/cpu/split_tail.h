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

// REQUIRES: nb % 4 != 0. row is a split-layout row of nb blocks. Fixed-size copies and word
// stores only: a memset of the struct and byte-count memcpys (rep stos, byte loops) had cost
// ~13 % of an AVX2 prefill on SmolLM2's 18-block rows when run per row and token quad.
inline void LoadTailGroup(GgmlType type, const uint8_t* row, int64_t nb, TailGroup* t) {
  const int64_t g = nb / 4, gs = nb - 4 * g;
  uint64_t* words = reinterpret_cast<uint64_t*>(t->qs);
  for (int i = 0; i < 16; ++i) words[i] = 0;
  uint16_t d[4] = {0, 0, 0, 0}, m[4] = {0, 0, 0, 0};
  const uint8_t* dw = row + nb * (type == GgmlType::kQ8_0 ? 32 : 16);
  for (int64_t k = 0; k < gs; ++k) {
    if (type == GgmlType::kQ8_0) {
      std::memcpy(t->qs + 16 * k, row + g * 128 + 16 * k, 16);
      std::memcpy(t->qs + 64 + 16 * k, row + g * 128 + gs * 16 + 16 * k, 16);
    } else {
      std::memcpy(t->qs + 16 * k, row + g * 64 + 16 * k, 16);
    }
    std::memcpy(&d[k], dw + 8 * g + 2 * k, 2);
    if (type == GgmlType::kQ4_1) std::memcpy(&m[k], dw + 2 * nb + 8 * g + 2 * k, 2);
  }
  std::memcpy(t->d, d, sizeof(d));
  std::memcpy(t->m, m, sizeof(m));
}

}  // namespace
}  // namespace tinyserve
