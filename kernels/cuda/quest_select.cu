// Query-aware page selection (decode_attention.cuh): page scores from the key boxes, then the
// budget fill (sinks, last page, top-k by radix select, ties to the lower page index).
#include <algorithm>

#include "kernels/cuda/decode_internal.cuh"
#include "kernels/cuda/device_utils.cuh"

namespace tinyserve::cuda::internal {
namespace {

constexpr int kSelectThreads = 256;
// Dynamic shared memory of the select kernel: one key per page, at most 51200 pages.
constexpr int kMaxSelectSmem = 200 * 1024;

struct SelectArgs {
  const void* q;                // [batch][H_q][d], rows q_stride apart
  int64_t q_stride;
  const void* kmin;             // [num_pages][H_kv][d]
  const void* kmax;             // [num_pages][H_kv][d]
  PagedKvLayout layout;
  int group;                    // H_q / H_kv
  const int32_t* page_indptr;   // [batch + 1]
  const int32_t* page_indices;  // [total]
  const int32_t* seq_lens;      // [batch]
  int max_pages;
  int budget;                   // K pages
  int n_sink;
  GqaAggregation aggregation;
  int score_splits;
  float* scores;                // [batch][H_kv][max_pages] (split scoring) or null
  int32_t* sel_pages;           // [batch][H_kv][budget] physical ids
  int32_t* sel_count;           // [batch][H_kv]
  int32_t* dbg_pages;           // [batch][H_kv][budget] logical ids, or null
  int32_t* dbg_count;           // [batch][H_kv], or null
  float* dbg_scores;            // [batch][H_kv][max_pages], or null
};

// Scores candidate pages [j0, j1) of (b, g) and hands (j, score) to sink. kD/8 consecutive lanes
// share one page (16 bytes of kmin and of kmax each); the group's query heads are in registers.
// Sum aggregation (the default) splits the group's query by sign once: per channel,
// sum_h max(q_h·mn, q_h·mx) = qp·mx + qn·mn with qp (qn) the sum of the positive (negative) q_h,
// so a page costs one dot product and one group sum instead of one per query head (as the CPU's
// BoxScoreSplit).
// \tparam T   cache element type
// \tparam kD  head dim (64 or 128)
template <typename T, int kD, typename Sink>
__device__ void ScorePages(const SelectArgs& a, int b, int g, int j0, int j1, Sink sink) {
  constexpr int kChunks = kD / 8;
  const int c = threadIdx.x % kChunks;
  const int row = threadIdx.x / kChunks;
  const int rows = blockDim.x / kChunks;
  const int G = a.group;
  const T* q = static_cast<const T*>(a.q) + b * a.q_stride + (g * G) * kD + c * 8;
  float qr[kMaxGqaGroup][8];
#pragma unroll
  for (int j = 0; j < kMaxGqaGroup; ++j) {
    if (j < G) {
      Unpack8<T>(*reinterpret_cast<const uint4*>(q + j * kD), qr[j]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) qr[j][e] = 0.f;
    }
  }
  const bool split = a.aggregation == GqaAggregation::kKvSum;
  float qp[8], qn[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    qp[e] = qn[e] = 0.f;
#pragma unroll
    for (int j = 0; j < kMaxGqaGroup; ++j) {
      const float x = qr[j][e];  // 0 beyond the group
      qp[e] += fmaxf(x, 0.f);
      qn[e] += fminf(x, 0.f);
    }
  }
  const int32_t* table = a.page_indices + a.page_indptr[b];
  const T* kmin = static_cast<const T*>(a.kmin);
  const T* kmax = static_cast<const T*>(a.kmax);
  // kPagesPerThread pages per thread per iteration: their page-table loads, then their box loads,
  // are all issued before any is used, so one iteration costs two memory latencies, not 2 per page.
  constexpr int kPagesPerThread = 4;
  // Every thread runs the same number of iterations: the shuffles below need all 32 lanes.
  for (int base = j0; base < j1; base += rows * kPagesPerThread) {
    int32_t pid[kPagesPerThread];
#pragma unroll
    for (int u = 0; u < kPagesPerThread; ++u) {
      const int j = base + u * rows + row;
      pid[u] = j < j1 ? table[j] : 0;
    }
    uint4 mnv[kPagesPerThread], mxv[kPagesPerThread];
#pragma unroll
    for (int u = 0; u < kPagesPerThread; ++u) {
      if (base + u * rows + row < j1) {
        const int64_t off = a.layout.MetaOffset(pid[u], g) + c * 8;
        mnv[u] = *reinterpret_cast<const uint4*>(kmin + off);
        mxv[u] = *reinterpret_cast<const uint4*>(kmax + off);
      } else {
        mnv[u] = mxv[u] = make_uint4(0u, 0u, 0u, 0u);  // unpacks to 0.f (f16 and bf16)
      }
    }
#pragma unroll
    for (int u = 0; u < kPagesPerThread; ++u) {
      const int j = base + u * rows + row;
      float mn[8], mx[8];
      Unpack8<T>(mnv[u], mn);
      Unpack8<T>(mxv[u], mx);
      float agg;
      if (split) {  // uniform across the warp: every lane takes the same branch
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) s += qp[e] * mx[e] + qn[e] * mn[e];
        agg = GroupSum<kChunks>(s);
      } else {
        agg = -INFINITY;
#pragma unroll
        for (int h = 0; h < kMaxGqaGroup; ++h) {
          if (h < G) {
            float s = 0.f;
#pragma unroll
            for (int e = 0; e < 8; ++e) s += fmaxf(qr[h][e] * mn[e], qr[h][e] * mx[e]);
            agg = fmaxf(agg, GroupSum<kChunks>(s));
          }
        }
      }
      if (j < j1 && c == 0) sink(j, agg);
    }
  }
}

// Split scoring for small batches: grid (score_splits, H_kv, batch); writes a.scores.
template <typename T, int kD>
__global__ void __launch_bounds__(kSelectThreads) QuestScoreKernel(const SelectArgs a) {
  const int b = blockIdx.z, g = blockIdx.y;
  const int n = a.layout.PagesFor(a.seq_lens[b]);
  if (n <= a.budget) return;
  const int lo = a.n_sink, hi = n - 1;  // candidates
  const int per = (hi - lo + a.score_splits - 1) / a.score_splits;
  const int j0 = lo + blockIdx.x * per, j1 = min(hi, j0 + per);
  const int64_t row = (static_cast<int64_t>(b) * a.layout.num_kv_heads + g) * a.max_pages;
  float* scores = a.scores + row;
  float* dbg = a.dbg_scores ? a.dbg_scores + row : nullptr;
  ScorePages<T, kD>(a, b, g, j0, j1, [&](int j, float s) {
    scores[j] = s;
    if (dbg) dbg[j] = s;
  });
}

// Budget fill for one (seq, kv head): grid (H_kv, batch). Dynamic shared memory holds one key
// per candidate page. When a.score_splits == 1 it scores the pages itself.
template <typename T, int kD>
__global__ void __launch_bounds__(kSelectThreads) QuestSelectKernel(const SelectArgs a) {
  TS_DYNAMIC_SMEM(uint32_t, keys);  // [n - 1 - n_sink]
  __shared__ int scan_scratch[33];
  const int b = blockIdx.y, g = blockIdx.x;
  const int hkv = a.layout.num_kv_heads;
  const int n = a.layout.PagesFor(a.seq_lens[b]);
  const int K = a.budget;
  const int64_t slot = static_cast<int64_t>(b) * hkv + g;
  int32_t* out = a.sel_pages + slot * K;
  int32_t* dbg = a.dbg_pages ? a.dbg_pages + slot * K : nullptr;
  const int32_t* table = a.page_indices + a.page_indptr[b];
  auto emit = [&](int pos, int logical) {
    out[pos] = table[logical];
    if (dbg) dbg[pos] = logical;
  };
  if (n <= K) {  // dense: every page, in order
    for (int i = threadIdx.x; i < n; i += blockDim.x) emit(i, i);
    if (threadIdx.x == 0) {
      a.sel_count[slot] = n;
      if (a.dbg_count) a.dbg_count[slot] = n;
    }
    return;
  }
  const int lo = a.n_sink, m = n - 1 - a.n_sink, k = K - 1 - a.n_sink;
  const int64_t srow = slot * a.max_pages;
  if (a.score_splits == 1) {
    float* dbg_s = a.dbg_scores ? a.dbg_scores + srow : nullptr;
    ScorePages<T, kD>(a, b, g, lo, n - 1, [&](int j, float s) {
      keys[j - lo] = OrderedKey(s);
      if (dbg_s) dbg_s[j] = s;
    });
  } else {
    for (int i = threadIdx.x; i < m; i += blockDim.x) keys[i] = OrderedKey(a.scores[srow + lo + i]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < a.n_sink; i += blockDim.x) emit(i, i);
  if (threadIdx.x == 0) {
    emit(K - 1, n - 1);  // the current page, always
    a.sel_count[slot] = K;
    if (a.dbg_count) a.dbg_count[slot] = K;
  }
  if (k == 0) return;
  uint32_t thr;
  int need_eq;
  BlockRadixSelect(keys, m, k, &thr, &need_eq);
  // Compaction in ascending page order: keys > thr, and the first need_eq keys == thr. One scan
  // per chunk counts both kinds at once (gt in the low 16 bits, eq in the high: <= 256 each).
  // Before key i there are gt_before keys > thr and eq_rank keys == thr, of which
  // min(eq_rank, need_eq) are selected, so its output position is their sum.
  int gt_base = 0, eq_base = 0;
  for (int base = 0; base < m; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const uint32_t key = i < m ? keys[i] : 0u;
    const bool gt = i < m && key > thr;
    const bool eq = i < m && key == thr;
    int total;
    const int before = BlockExclusiveScan((gt ? 1 : 0) | (eq ? 1 << 16 : 0), &total, scan_scratch);
    const int gt_before = gt_base + (before & 0xffff);
    const int eq_rank = eq_base + (before >> 16);
    const bool sel = gt || (eq && eq_rank < need_eq);
    if (sel) emit(lo + gt_before + min(eq_rank, need_eq), lo + i);
    gt_base += total & 0xffff;
    eq_base += total >> 16;
  }
}

template <typename T, int kD>
cudaError_t Launch(const SelectArgs& a, int batch, cudaStream_t stream) {
  const int hkv = a.layout.num_kv_heads;
  if (a.score_splits > 1) {
    LaunchKernel(QuestScoreKernel<T, kD>, dim3(a.score_splits, hkv, batch), kSelectThreads, 0,
                 stream, a);
    TS_RETURN_LAUNCH_ERROR();
  }
  const size_t smem = sizeof(uint32_t) * std::max(1, a.max_pages);
  // Once per instantiation, at the largest size LaunchQuestSelection accepts, so that calls
  // inside a CUDA graph capture change no function attribute.
  static const cudaError_t attr = cudaFuncSetAttribute(
      QuestSelectKernel<T, kD>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSelectSmem);
  if (attr != cudaSuccess) return attr;
  LaunchKernel(QuestSelectKernel<T, kD>, dim3(hkv, batch), kSelectThreads, smem, stream, a);
  TS_RETURN_LAUNCH_ERROR();
  return cudaSuccess;
}

}  // namespace

int ChooseScoreSplits(const DecodeAttentionParams& p) {
  if (p.score_splits > 0) return p.score_splits;
  const int ctas = p.batch * p.layout.num_kv_heads;
  const int sms = NumSms();
  if (ctas >= sms) return 1;
  const int want = (2 * sms + ctas - 1) / ctas;
  const int most = std::max(1, p.max_pages_per_seq / 64);  // >= 64 pages per scoring CTA
  return std::max(1, std::min(want, most));
}

cudaError_t LaunchQuestSelection(const DecodeAttentionParams& p, const DecodeWorkspace& ws,
                                 cudaStream_t stream) {
  TS_REQUIRE(p.max_pages_per_seq * sizeof(uint32_t) <= size_t{kMaxSelectSmem},
             "QuestDecodeAttention: max_pages_per_seq too large for one selection CTA");
  SelectArgs a{};
  a.q = p.q;
  a.q_stride = p.q_stride;
  a.kmin = p.kmin;
  a.kmax = p.kmax;
  a.layout = p.layout;
  a.group = p.num_q_heads / p.layout.num_kv_heads;
  a.page_indptr = p.page_indptr;
  a.page_indices = p.page_indices;
  a.seq_lens = p.seq_lens;
  a.max_pages = p.max_pages_per_seq;
  a.budget = p.budget_pages;
  a.n_sink = p.n_sink;
  a.aggregation = p.aggregation;
  a.score_splits = ChooseScoreSplits(p);
  a.scores = ws.scores;
  a.sel_pages = ws.sel_pages;
  a.sel_count = ws.sel_count;
  a.dbg_pages = p.selected_pages;
  a.dbg_count = p.selected_count;
  a.dbg_scores = p.page_scores;
  return TS_DISPATCH_DTYPE16(p.dtype, T, [&] {
    return TS_DISPATCH_HEAD_DIM(p.layout.head_dim, kD, [&] { return Launch<T, kD>(a, p.batch, stream); });
  });
}

}  // namespace tinyserve::cuda::internal
