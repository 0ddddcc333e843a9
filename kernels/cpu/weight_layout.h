// File: kernels/cpu/weight_layout.h
// The "split" row layout of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL weights that the SIMD matrix
// kernels read (IQ4_NL's blocks are Q4_0's: fp16 d and 16 bytes of nibbles, which index 16
// levels; Q5_0 / Q5_1 are Q4_0 / Q4_1 plus a fifth bit per element in qh).
//
// A ggml row is nb blocks of {fp16 d; [fp16 m;] [qh;] qs}. The split row holds the same bytes,
// regrouped so that one 512-bit load covers four blocks and scales load as vectors:
//
//   [qs of all blocks][qh: Q5 only][d: nb fp16][m: nb fp16, Q4_1 / Q5_1 only]
//                                                               (size = ggml row size)
//
// qs is cut into groups of four blocks (the last group has gs = nb - 4g < 4 blocks):
//   Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL: the gs blocks' 16 qs bytes in order (16·gs bytes). Byte j
//                of block k holds element j (low nibble) and j + 16 (high nibble), as in ggml.
//   Q8_0:        [first 16 qs of each block][last 16 qs of each block] (32·gs bytes).
// So in either type, 128-bit lane k of a group's "low" vector holds elements 0..15 of block k
// and lane k of its "high" vector elements 16..31. The activation layout (quant_kernels.h)
// matches this.
//
// qh (Q5_0 / Q5_1; bit j of a block's 32-bit qh is element j's fifth bit): per group, at 16·g,
// [bits 0..15 of each block][bits 16..31 of each block] (2·gs + 2·gs bytes), so a group's
// first 64 bits are one bit per byte of its "low" vector, in order, and the next 64 bits the
// same for its "high" vector.
//
// Rows are independent: row r of a split matrix starts at r·row_bytes like a ggml row.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/ggml_types.h"

namespace tinyserve {

// True for the types that have a split layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL).
bool HasSplitLayout(GgmlType type);
// Bytes of qs per block in the split layout: 16, or 32 (Q8_0).
int SplitQsBytes(GgmlType type);
// Bytes of qh per block: 4 (Q5_0, Q5_1) or 0.
inline int SplitQhBytes(GgmlType type) {
  return type == GgmlType::kQ5_0 || type == GgmlType::kQ5_1 ? 4 : 0;
}
// Offset of the d scales in a split row of nb blocks.
inline int64_t SplitScalesOffset(GgmlType type, int64_t nb) {
  return nb * (SplitQsBytes(type) + SplitQhBytes(type));
}

// One row, nb blocks: ggml -> split and back. REQUIRES: HasSplitLayout(type); src != dst.
void RepackRowToSplit(GgmlType type, const uint8_t* ggml_row, uint8_t* split_row, int64_t nb);
void UnpackRowFromSplit(GgmlType type, const uint8_t* split_row, uint8_t* ggml_row, int64_t nb);

}  // namespace tinyserve
