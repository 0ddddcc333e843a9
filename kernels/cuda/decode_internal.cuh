// File: kernels/cuda/decode_internal.cuh
// Private to decode_attention.cu and quest_select.cu: the workspace carve-up and the selection
// launchers. Not an entry point.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/decode_attention.cuh"

namespace tinyserve::cuda::internal {

// What an attend kernel reads and writes: one CTA per (split, KV head, sequence) over its share of
// the page list, writing unnormalised split outputs for MergeSplitsKernel.
struct AttendArgs {
  const void* q;                // [batch][H_q][d], rows q_stride apart
  int64_t q_stride;
  const void* k_cache;          // [num_pages][H_kv][P][d]
  const void* v_cache;          // [num_pages][H_kv][P][d]
  PagedKvLayout layout;
  int group;                    // H_q / H_kv
  const int32_t* seq_lens;      // [batch]
  const int32_t* page_indptr;   // [batch + 1] (dense lists)
  const int32_t* page_indices;  // [total]     (dense lists)
  const int32_t* sel_pages;     // [batch][H_kv][budget] (quest lists) or null for dense
  const int32_t* sel_count;     // [batch][H_kv]
  int budget;
  int splits;
  float scale_log2;             // sm_scale * log2(e): scores live in log2 units
  float* partial_o;             // [batch][H_q][splits][d]
  float* partial_ml;            // [batch][H_q][splits][2]
};

// What one CTA (split, KV head g, sequence b) of an attend kernel walks: the page list (the
// selected pages, or the page table for dense) and its share [p0, p1) of the list's entries, the
// per-split count rounded up to a multiple of round_pages. Only the list's last entry (the
// sequence's last page) can be partial: it holds last_valid tokens.
struct SplitShare {
  const int32_t* list;
  int count;
  int p0, p1;
  int last_valid;
};
__device__ inline SplitShare AttendShare(const AttendArgs& a, int b, int g, int split,
                                         int round_pages) {
  SplitShare s;
  const int P = a.layout.page_size;
  const int len = a.seq_lens[b];
  const int n = (len + P - 1) / P;
  s.last_valid = len - (n - 1) * P;
  if (a.sel_pages != nullptr) {
    const int64_t slot = static_cast<int64_t>(b) * a.layout.num_kv_heads + g;
    s.list = a.sel_pages + slot * a.budget;
    s.count = a.sel_count[slot];
  } else {
    s.list = a.page_indices + a.page_indptr[b];
    s.count = n;
  }
  int per_split = (s.count + a.splits - 1) / a.splits;
  per_split = (per_split + round_pages - 1) / round_pages * round_pages;
  s.p0 = split * per_split;
  s.p1 = min(s.count, s.p0 + per_split);
  return s;
}

// The tensor-core attend kernel (decode_attend_mma.cu) for cache type T and head dim kD, without
// the merge. Defined for T in {__half, __nv_bfloat16}, kD in {64, 128}.
template <typename T, int kD>
cudaError_t LaunchAttendMma(const AttendArgs& a, int batch, cudaStream_t stream);

// Pieces of DecodeAttentionParams::workspace, each 256-byte aligned.
struct DecodeWorkspace {
  float* partial_o = nullptr;    // [batch][H_q][splits][d] unnormalised split outputs
  float* partial_ml = nullptr;   // [batch][H_q][splits][2] (running max in log2 units, sum)
  int32_t* sel_pages = nullptr;  // [batch][H_kv][budget] physical page ids (quest)
  int32_t* sel_count = nullptr;  // [batch][H_kv] (quest)
  float* scores = nullptr;       // [batch][H_kv][max_pages] split scoring output (quest)
  size_t bytes = 0;              // total
};

// Carves `base` (may be null to only size it).
DecodeWorkspace CarveWorkspace(const DecodeAttentionParams& p, int splits, bool quest,
                               void* base);
int NumSms();
int ChooseScoreSplits(const DecodeAttentionParams& p);

// Selection: fills ws.sel_pages / ws.sel_count (and the optional debug outputs of p).
cudaError_t LaunchQuestSelection(const DecodeAttentionParams& p, const DecodeWorkspace& ws,
                                 cudaStream_t stream);

}  // namespace tinyserve::cuda::internal
