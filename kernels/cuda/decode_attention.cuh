// File: kernels/cuda/decode_attention.cuh
// Decode attention over the paged cache (paged_kv.cuh) for a batch of sequences, one new query
// token per sequence: dense (every token) and query-aware (Quest: a page budget chosen per
// (sequence, KV head) from the key boxes). Both end in the same split-K attend kernel and merge:
//
//   dense:  attend(page list = the sequence's page table)             -> merge
//   quest:  score+select (one CTA per (seq, kv head); for small batches the scoring is split
//           over several CTAs first) -> attend(page list = selected pages) -> merge
//
// Selection (per sequence b and KV head g, with n = ceil(L/P) pages and K = budget_pages):
//   n <= K: every page, in order: the result equals the dense path bit for bit when both use the
//           same num_splits.
//   else:   pages [0, n_sink), the last page n-1 (always, it is the current, possibly partial,
//           one), and the top K-1-n_sink of pages [n_sink, n-1) by score, ties to the lower
//           page index; the list is in ascending page order.
//   score of page p for query head h: U = sum_d max(q_d*kmin_d, q_d*kmax_d) (an upper bound of
//   q.k for every key of the page), aggregated over the group's query heads by max (kKvMax) or
//   sum (kKvSum). Each KV head keeps one list, so the group's query heads share each loaded page.
//
// Attention is the exact softmax(q.k * sm_scale) over the listed tokens, fp32 accumulation,
// online softmax over tiles of tokens, split over num_splits CTAs per (seq, kv head), merged.
// CUDA-graph safe: grids depend only on (batch, heads, max_pages_per_seq, budget, splits); all
// per-sequence values are read on the device.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch_status.cuh"
#include "kernels/cuda/paged_kv.cuh"

namespace tinyserve::cuda {

enum class GqaAggregation : int { kKvMax = 0, kKvSum = 1 };

// Which attend kernel reads the K/V tiles (selection and merge are shared). kCudaCores: fp32
// dot products on the CUDA cores (measured on an H200, docs/PERFORMANCE.md). kTensorCores:
// mma.sync m16n8k16 with the group's query heads as the M rows and P rounded to the cache dtype
// for PV (decode_attend_mma.cu; not yet measured on a GPU). kAuto reads TINYSERVE_CUDA_ATTEND
// once per process ("tensor" or "tensor_cores" select kTensorCores) and defaults to kCudaCores.
enum class AttendKernel : int { kAuto = 0, kCudaCores = 1, kTensorCores = 2 };
const char* AttendKernelName(AttendKernel k);
// Attend launches so far in this process by kernel (kCudaCores or kTensorCores): for tests.
int64_t AttendKernelLaunches(AttendKernel k);

// Largest GQA group (query heads per KV head) the decode kernels take.
inline constexpr int kMaxGqaGroup = 8;

struct DecodeAttentionParams {
  DType dtype = DType::kF16;  // q, out, caches and boxes (f16 or bf16)
  PagedKvLayout layout;       // head_dim 64 or 128; page_size a power of two <= 32
  int batch = 0;
  int num_q_heads = 0;        // H_q, a multiple of layout.num_kv_heads; H_q / H_kv <= 8
  const void* q = nullptr;    // [batch][H_q][d], rows q_stride elements apart
  int64_t q_stride = 0;       // elements between the rows of consecutive sequences; % 8 == 0
  void* out = nullptr;        // [batch][H_q][d], rows out_stride elements apart
  int64_t out_stride = 0;
  const void* k_cache = nullptr;  // [num_pages][H_kv][P][d]
  const void* v_cache = nullptr;  // [num_pages][H_kv][P][d]
  const void* kmin = nullptr;     // [num_pages][H_kv][d] (quest only)
  const void* kmax = nullptr;     // [num_pages][H_kv][d] (quest only)
  const int32_t* page_indptr = nullptr;   // [batch + 1]
  const int32_t* page_indices = nullptr;  // [total pages]
  const int32_t* seq_lens = nullptr;      // [batch], 1 <= L <= max_pages_per_seq * P
  int max_pages_per_seq = 0;  // host bound on ceil(L/P) over the batch (sizes grid, workspace)
  float sm_scale = 0.f;       // softmax scale; 0 means 1/sqrt(d)
  int num_splits = 0;         // split-K CTAs per (seq, kv head); 0 = chosen from the shapes
  AttendKernel attend_kernel = AttendKernel::kAuto;
  // Quest only.
  int budget_pages = 0;       // K = budget_tokens / P; >= n_sink + 1
  int n_sink = 0;             // first pages always kept
  GqaAggregation aggregation = GqaAggregation::kKvMax;
  int score_splits = 0;       // CTAs scoring one (seq, kv head); 0 = chosen, 1 = fused in select
  // Scratch from the caller, DecodeWorkspaceBytes(params) bytes, 256-byte aligned.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Optional outputs for tests and metrics (quest only; may be null).
  int32_t* selected_pages = nullptr;  // [batch][H_kv][budget_pages] logical page indices
  int32_t* selected_count = nullptr;  // [batch][H_kv]
  float* page_scores = nullptr;       // [batch][H_kv][max_pages_per_seq] aggregated scores of
                                      // candidate pages [n_sink, n-1); others untouched
};

// Scratch bytes the call needs (quest = true adds the selection buffers).
size_t DecodeWorkspaceBytes(const DecodeAttentionParams& p, bool quest);

// The split count used when num_splits == 0, for a list of at most max_list_pages pages.
int ChooseNumSplits(const DecodeAttentionParams& p, int max_list_pages);

cudaError_t DenseDecodeAttention(const DecodeAttentionParams& p, cudaStream_t stream);
cudaError_t QuestDecodeAttention(const DecodeAttentionParams& p, cudaStream_t stream);

// Only the selection part of QuestDecodeAttention (into the workspace and the optional outputs):
// for benchmarks that split the time into select and attend, and for selection metrics.
cudaError_t QuestSelectOnly(const DecodeAttentionParams& p, cudaStream_t stream);
// Only the attend-and-merge part, over caller-given page lists: lists [batch][H_kv][budget_pages]
// holds, for each (sequence, KV head), counts[b][g] page ids into p.k_cache / p.v_cache in
// ascending logical order, the last being the sequence's current (possibly partial) page. The
// split count is QuestDecodeAttention's for the same params, so the same lists give the same
// bits; with budget_pages = max_pages_per_seq and every page listed it is DenseDecodeAttention's.
// Used by the tiered cache (device_model.cu), whose lists name device slots. kmin/kmax unused.
cudaError_t AttendPageLists(const DecodeAttentionParams& p, const int32_t* lists,
                            const int32_t* counts, cudaStream_t stream);

}  // namespace tinyserve::cuda
