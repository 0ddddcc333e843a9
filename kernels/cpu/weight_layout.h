// File: kernels/cpu/weight_layout.h
// The "split" row layout of Q4_0, Q4_1 and Q8_0 weights that the SIMD matrix kernels read.
//
// A ggml row is nb blocks of {fp16 d; [fp16 m;] qs}. The split row holds the same bytes,
// regrouped so that one 512-bit load covers four blocks and scales load as vectors:
//
//   [qs of all blocks][d: nb fp16][m: nb fp16, Q4_1 only]          (size = ggml row size)
//
// qs is cut into groups of four blocks (the last group has gs = nb - 4g < 4 blocks):
//   Q4_0 / Q4_1: the gs blocks' 16 qs bytes in order (16·gs bytes). Byte j of block k holds
//                element j (low nibble) and j + 16 (high nibble), as in ggml.
//   Q8_0:        [first 16 qs of each block][last 16 qs of each block] (32·gs bytes).
// So in either type, 128-bit lane k of a group's "low" vector holds elements 0..15 of block k
// and lane k of its "high" vector elements 16..31. The activation layout (quant_kernels.h)
// matches this.
//
// Rows are independent: row r of a split matrix starts at r·row_bytes like a ggml row.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/ggml_types.h"

namespace tinyserve {

// True for the types that have a split layout (Q4_0, Q4_1, Q8_0).
bool HasSplitLayout(GgmlType type);
// Bytes of qs per block in the split layout: 16 (Q4_0, Q4_1) or 32 (Q8_0).
int SplitQsBytes(GgmlType type);

// One row, nb blocks: ggml -> split and back. REQUIRES: HasSplitLayout(type); src != dst.
void RepackRowToSplit(GgmlType type, const uint8_t* ggml_row, uint8_t* split_row, int64_t nb);
void UnpackRowFromSplit(GgmlType type, const uint8_t* split_row, uint8_t* ggml_row, int64_t nb);

}  // namespace tinyserve
