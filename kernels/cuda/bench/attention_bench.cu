// Decode attention microbenchmark (sparse-attention.md §7.2 item 2): device copy bandwidth, then
// dense vs Quest (select + attend, and select alone), each with the CUDA-core and the tensor-core
// attend kernel, over contexts, batches and budgets for the
// SmolLM2 (9/3/64) and 7B-like (32/8/128) geometries, page 16, f16. Synthetic K/V; every
// configuration rotates over enough copies of its cache (own pages, own tables, own queries) to
// exceed the L2 several times. Writes JSON lines to --out.
//
// Usage: cuda_attention_bench --out FILE [--quick] [--max-seconds S]
//        [--smoke]  (context 3000, batches 1 and 2, one repetition, a small copy: the code paths
//                    at a size the CPU CUDA emulator runs in CI)
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/cuda/bench/bench_util.cuh"
#include "kernels/cuda/decode_attention.cuh"

namespace tinyserve::cuda::bench {
namespace {

using T = __half;
constexpr DType kDType = DType::kF16;
constexpr int kPage = 16;

// Box of every (page, head) over all P slots (the synthetic caches fill every slot).
__global__ void FullPageBoxKernel(const T* k, T* kmin, T* kmax, int64_t page_heads, int P, int d) {
  for (int64_t ph = blockIdx.x; ph < page_heads; ph += gridDim.x)
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
      float mn = INFINITY, mx = -INFINITY;
      for (int s = 0; s < P; ++s) {
        const float x = __half2float(k[(ph * P + s) * d + e]);
        mn = fminf(mn, x);
        mx = fmaxf(mx, x);
      }
      kmin[ph * d + e] = __float2half_rn(mn);
      kmax[ph * d + e] = __float2half_rn(mx);
    }
}

struct Geometry {
  const char* name;
  int hq, hkv, d;
};

int g_warmup = 3;  // launches before the timed ones (1 with --smoke)

double CopyBandwidthGBs(JsonLines& out, size_t bytes) {
  void *a = nullptr, *b = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&a, bytes));
  TS_CUDA_CHECK(cudaMalloc(&b, bytes));
  FillUniform(static_cast<T*>(a), bytes / 2, 1, 1.f);
  const double ms = MedianMs(nullptr, g_warmup, g_warmup == 3 ? 15 : 1, [&](int i) {
    TS_CUDA_CHECK(cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice));
  });
  const double gbs = 2.0 * bytes / (ms * 1e-3) / 1e9;
  out.Write("{\"kind\":\"copy_bw\",\"bytes\":%zu,\"ms\":%.4f,\"GBps\":%.1f}", bytes, ms, gbs);
  TS_CUDA_CHECK(cudaFree(a));
  TS_CUDA_CHECK(cudaFree(b));
  return gbs;
}

void RunConfig(JsonLines& out, const Geometry& g, int batch, int context,
               const std::vector<int>& budgets, int reps) {
  const int len = context - 5;  // a partial last page, as in real decoding
  const int n = (len + kPage - 1) / kPage;
  const size_t set_tokens = size_t(batch) * n * kPage;
  const size_t kv_bytes_set = set_tokens * g.hkv * g.d * 2 * sizeof(T);
  const size_t l2_target = size_t(400) << 20;  // > 6x the 60 MB L2
  const int sets = static_cast<int>(std::min<size_t>(8, std::max<size_t>(1, l2_target / kv_bytes_set + 1)));
  const int pages = n * batch * sets;
  PagedKvLayout lay{pages, g.hkv, kPage, g.d};
  T *k, *v, *kmin, *kmax, *q, *o;
  int32_t *indptr, *indices, *lens;
  TS_CUDA_CHECK(cudaMalloc(&k, lay.KvElements() * sizeof(T)));
  TS_CUDA_CHECK(cudaMalloc(&v, lay.KvElements() * sizeof(T)));
  TS_CUDA_CHECK(cudaMalloc(&kmin, lay.MetaElements() * sizeof(T)));
  TS_CUDA_CHECK(cudaMalloc(&kmax, lay.MetaElements() * sizeof(T)));
  const size_t q_elems = size_t(batch) * g.hq * g.d;
  TS_CUDA_CHECK(cudaMalloc(&q, q_elems * sets * sizeof(T)));
  TS_CUDA_CHECK(cudaMalloc(&o, q_elems * sizeof(T)));
  FillUniform(k, lay.KvElements(), 11, 1.f);
  FillUniform(v, lay.KvElements(), 12, 1.f);
  FillUniform(q, q_elems * sets, 13, 1.f);
  LaunchKernel(FullPageBoxKernel, 4096, g.d, 0, nullptr, k, kmin, kmax, int64_t{pages} * g.hkv,
               kPage, g.d);
  TS_CUDA_CHECK(cudaGetLastError());
  // Tables: set r owns pages [r*batch*n, (r+1)*batch*n), shuffled inside the set.
  std::mt19937 rng(context + batch);
  std::vector<int32_t> h_indptr(size_t(sets) * (batch + 1));
  std::vector<int32_t> h_idx(static_cast<size_t>(pages));
  std::vector<int32_t> h_lens(batch, len);
  for (int r = 0; r < sets; ++r) {
    std::vector<int32_t> perm(size_t(batch) * n);
    std::iota(perm.begin(), perm.end(), r * batch * n);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::copy(perm.begin(), perm.end(), h_idx.begin() + size_t(r) * batch * n);
    for (int b = 0; b <= batch; ++b) h_indptr[size_t(r) * (batch + 1) + b] = b * n;
  }
  TS_CUDA_CHECK(cudaMalloc(&indptr, h_indptr.size() * 4));
  TS_CUDA_CHECK(cudaMalloc(&indices, h_idx.size() * 4));
  TS_CUDA_CHECK(cudaMalloc(&lens, h_lens.size() * 4));
  TS_CUDA_CHECK(cudaMemcpy(indptr, h_indptr.data(), h_indptr.size() * 4, cudaMemcpyHostToDevice));
  TS_CUDA_CHECK(cudaMemcpy(indices, h_idx.data(), h_idx.size() * 4, cudaMemcpyHostToDevice));
  TS_CUDA_CHECK(cudaMemcpy(lens, h_lens.data(), h_lens.size() * 4, cudaMemcpyHostToDevice));

  DecodeAttentionParams base;
  base.dtype = kDType;
  base.layout = lay;
  base.batch = batch;
  base.num_q_heads = g.hq;
  base.q_stride = int64_t{g.hq} * g.d;
  base.out = o;
  base.out_stride = base.q_stride;
  base.k_cache = k;
  base.v_cache = v;
  base.kmin = kmin;
  base.kmax = kmax;
  base.seq_lens = lens;
  base.max_pages_per_seq = n;
  size_t ws_bytes = DecodeWorkspaceBytes(base, false);
  for (int bt : budgets) {
    DecodeAttentionParams p = base;
    p.budget_pages = bt / kPage;
    ws_bytes = std::max(ws_bytes, DecodeWorkspaceBytes(p, true));
  }
  void* ws;
  TS_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  base.workspace = ws;
  base.workspace_bytes = ws_bytes;
  auto for_set = [&](DecodeAttentionParams p, int i) {
    const int r = i % sets;
    p.q = q + size_t(r) * q_elems;
    p.page_indptr = indptr + size_t(r) * (batch + 1);  // relative: b * n
    p.page_indices = indices + size_t(r) * batch * n;
    return p;
  };
  const double kv_token_bytes = 2.0 * g.hkv * g.d * sizeof(T);  // K and V of one token, all heads
  const double dense_bytes = double(batch) * len * kv_token_bytes;
  const int dense_splits = ChooseNumSplits(base, n);
  // Both attend kernels: "dense"/"quest" on the CUDA cores (the names of earlier runs),
  // "dense_tc"/"quest_tc" on the tensor cores (quest_tc at the 2048 budget of the targets only).
  for (AttendKernel ak : {AttendKernel::kCudaCores, AttendKernel::kTensorCores}) {
    const bool tc = ak == AttendKernel::kTensorCores;
    base.attend_kernel = ak;
    const double dense_ms = MedianMs(nullptr, g_warmup, reps, [&](int i) {
      TS_CUDA_CHECK(DenseDecodeAttention(for_set(base, i), nullptr));
    });
    out.Write("{\"kind\":\"decode_attn\",\"geom\":\"%s\",\"hq\":%d,\"hkv\":%d,\"d\":%d,"
              "\"batch\":%d,\"context\":%d,\"variant\":\"%s\",\"budget\":0,\"us\":%.2f,"
              "\"bytes\":%.0f,\"GBps\":%.1f,\"splits\":%d,\"sets\":%d}",
              g.name, g.hq, g.hkv, g.d, batch, context, tc ? "dense_tc" : "dense", dense_ms * 1e3,
              dense_bytes, dense_bytes / (dense_ms * 1e-3) / 1e9, dense_splits, sets);
    for (int bt : budgets) {
      DecodeAttentionParams p = base;
      p.budget_pages = bt / kPage;
      if (p.budget_pages >= n) continue;  // the budget covers the context: the dense path
      if (tc && bt != 2048) continue;
      const double total_ms = MedianMs(nullptr, g_warmup, reps, [&](int i) {
        TS_CUDA_CHECK(QuestDecodeAttention(for_set(p, i), nullptr));
      });
      const double select_ms = MedianMs(nullptr, g_warmup, reps, [&](int i) {
        TS_CUDA_CHECK(QuestSelectOnly(for_set(p, i), nullptr));
      });
      const double sel_tokens = std::min(len, p.budget_pages * kPage);
      const double bytes = double(batch) * (sel_tokens * kv_token_bytes +
                                            double(n - 1) * 2.0 * g.hkv * g.d * sizeof(T));
      out.Write("{\"kind\":\"decode_attn\",\"geom\":\"%s\",\"hq\":%d,\"hkv\":%d,\"d\":%d,"
                "\"batch\":%d,\"context\":%d,\"variant\":\"%s\",\"budget\":%d,\"us\":%.2f,"
                "\"select_us\":%.2f,\"bytes\":%.0f,\"GBps\":%.1f,\"splits\":%d,"
                "\"score_splits\":%d,\"speedup_vs_dense\":%.3f,\"sets\":%d}",
                g.name, g.hq, g.hkv, g.d, batch, context, tc ? "quest_tc" : "quest", bt,
                total_ms * 1e3, select_ms * 1e3, bytes, bytes / (total_ms * 1e-3) / 1e9,
                ChooseNumSplits(p, p.budget_pages), p.score_splits, dense_ms / total_ms, sets);
    }
  }
  for (void* ptr : std::initializer_list<void*>{k, v, kmin, kmax, q, o, indptr, indices, lens, ws})
    TS_CUDA_CHECK(cudaFree(ptr));
}

}  // namespace
}  // namespace tinyserve::cuda::bench

int main(int argc, char** argv) {
  using namespace tinyserve::cuda;
  using namespace tinyserve::cuda::bench;
  if (!HaveDevice()) return 2;
  JsonLines out(Arg(argc, argv, "--out"));
  const bool quick = Flag(argc, argv, "--quick"), smoke = Flag(argc, argv, "--smoke");
  if (smoke) g_warmup = 1;
  const Deadline deadline(argc, argv);
  cudaDeviceProp prop;
  TS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  out.Write("{\"kind\":\"device\",\"name\":\"%s\",\"sms\":%d,\"l2_bytes\":%d}", prop.name,
            prop.multiProcessorCount, prop.l2CacheSize);
  CopyBandwidthGBs(out, smoke ? size_t(16) << 20 : size_t(2) << 30);
  const Geometry geoms[] = {{"smollm2", 9, 3, 64}, {"7b", 32, 8, 128}};
  const std::vector<int> contexts =
      smoke   ? std::vector<int>{3000}
      : quick ? std::vector<int>{8192, 32768}
              : std::vector<int>{4096, 8192, 32768, 131072};
  const std::vector<int> batches = smoke   ? std::vector<int>{1, 2}
                                   : quick ? std::vector<int>{1, 16}
                                           : std::vector<int>{1, 16, 64};
  const std::vector<int> budgets = {256, 512, 1024, 2048, 4096};
  const double max_bytes = 24e9;  // keep every configuration (with its rotation) under ~24 GB
  for (const Geometry& g : geoms)
    for (int ctx : contexts)
      for (int b : batches) {
        const double kv = double(b) * ctx * 2.0 * g.hkv * g.d * 2;
        if (kv > max_bytes) continue;
        if (deadline.Passed()) {
          std::fprintf(stderr, "time limit reached; stopping the sweep\n");
          return 0;
        }
        RunConfig(out, g, b, ctx, budgets, smoke ? 1 : quick ? 10 : 20);
      }
  return 0;
}
