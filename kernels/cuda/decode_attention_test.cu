// GPU vs CPU tests of decode attention (dense and Quest) and of the page selection itself.
// Inputs are random and rounded to the kernel dtype; stale slots of partial pages hold NaN, so a
// kernel that reads past a sequence's length fails; outputs are poisoned with NaN before each run.
#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include "kernels/cuda/decode_attention.cuh"
#include "kernels/cuda/reference/attention_ref.h"
#include "kernels/cuda/test_util.cuh"

namespace tinyserve::cuda {
namespace {

using testing::AllClose;
using testing::DeviceBuffer;
using testing::Tol;

struct Shape {
  DType dtype;
  int head_dim, hq, hkv, page;
  std::vector<int> lens;
};

std::string Describe(const Shape& s) {
  std::ostringstream o;
  o << DTypeName(s.dtype) << " d=" << s.head_dim << " Hq=" << s.hq << " Hkv=" << s.hkv
    << " P=" << s.page << " lens=";
  for (int l : s.lens) o << l << ",";
  return o.str();
}

// A batch on the device and its host mirror.
struct Batch {
  Shape shape;
  ref::HostPagedKv kv;
  std::vector<std::vector<int32_t>> tables;
  std::vector<float> q;  // [B][Hq][d]
  DeviceBuffer k, v, kmin, kmax, indptr, indices, lens, qd, out, ws;
  int max_pages = 0;

  Batch(const Shape& s, std::mt19937& rng) : shape(s) {
    const int P = s.page, d = s.head_dim, B = static_cast<int>(s.lens.size());
    int total = 0;
    for (int L : s.lens) {
      const int n = (L + P - 1) / P;
      max_pages = std::max(max_pages, n + 1);
      total += n + 1;  // one spare listed page per sequence: tables may be longer than needed
    }
    const int pool = total + 3;
    std::vector<int32_t> perm(pool);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    kv.Resize(pool, s.hkv, P, d);
    // Random K/V everywhere (stale pages included), then the sequences' real tokens.
    kv.k = testing::RandomRounded(rng, s.dtype, kv.k.size(), -1.f, 1.f);
    kv.v = testing::RandomRounded(rng, s.dtype, kv.v.size(), -1.f, 1.f);
    std::vector<int32_t> ip{0}, idx;
    int next = 0;
    for (int L : s.lens) {
      const int n = (L + P - 1) / P;
      std::vector<int32_t> t(perm.begin() + next, perm.begin() + next + n + 1);
      next += n + 1;
      const auto kn = testing::RandomRounded(rng, s.dtype, size_t(L) * s.hkv * d, -1.f, 1.f);
      const auto vn = testing::RandomRounded(rng, s.dtype, size_t(L) * s.hkv * d, -1.f, 1.f);
      ref::AppendKv(kv, t, 0, kn.data(), vn.data(), L);
      for (int slot = L - (n - 1) * P; slot < P; ++slot)  // stale slots of the last page: NaN
        for (int h = 0; h < s.hkv; ++h)
          for (int e = 0; e < d; ++e) {
            kv.k[kv.Kv(t[n - 1], h, slot) + e] = NAN;
            kv.v[kv.Kv(t[n - 1], h, slot) + e] = NAN;
          }
      idx.insert(idx.end(), t.begin(), t.end());
      ip.push_back(static_cast<int32_t>(idx.size()));
      tables.push_back(t);
    }
    q = testing::RandomRounded(rng, s.dtype, size_t(B) * s.hq * d, -2.f, 2.f);
    testing::Upload(k, s.dtype, kv.k);
    testing::Upload(v, s.dtype, kv.v);
    testing::Upload(kmin, s.dtype, kv.kmin);
    testing::Upload(kmax, s.dtype, kv.kmax);
    testing::Upload(qd, s.dtype, q);
    testing::UploadInts(indptr, ip);
    testing::UploadInts(indices, idx);
    testing::UploadInts(lens, s.lens);
    out.Resize(size_t(B) * s.hq * d * DTypeBytes(s.dtype));
  }

  DecodeAttentionParams Params() {
    DecodeAttentionParams p;
    p.dtype = shape.dtype;
    p.layout = PagedKvLayout{kv.num_pages, shape.hkv, shape.page, shape.head_dim};
    p.batch = static_cast<int>(shape.lens.size());
    p.num_q_heads = shape.hq;
    p.q = qd.get();
    p.q_stride = int64_t{shape.hq} * shape.head_dim;
    p.out = out.get();
    p.out_stride = p.q_stride;
    p.k_cache = k.get();
    p.v_cache = v.get();
    p.kmin = kmin.get();
    p.kmax = kmax.get();
    p.page_indptr = indptr.get<int32_t>();
    p.page_indices = indices.get<int32_t>();
    p.seq_lens = lens.get<int32_t>();
    p.max_pages_per_seq = max_pages;
    return p;
  }

  // Sizes the workspace for p and poisons the output.
  void Prepare(DecodeAttentionParams& p, bool quest) {
    const size_t need = DecodeWorkspaceBytes(p, quest);
    if (ws.bytes() < need) ws.Resize(need);
    ws.Poison();
    p.workspace = ws.get();
    p.workspace_bytes = ws.bytes();
    out.Poison();
  }

  std::vector<float> Output() {
    return testing::Download(out.get(), shape.dtype, shape.lens.size() * shape.hq * shape.head_dim);
  }

  // Dense attention with the given kernel and split count (0 = chosen), downloaded.
  std::vector<float> Dense(AttendKernel ak, int splits) {
    DecodeAttentionParams p = Params();
    p.num_splits = splits;
    p.attend_kernel = ak;
    Prepare(p, false);
    EXPECT_EQ(DenseDecodeAttention(p, nullptr), cudaSuccess) << LastLaunchError();
    TS_CUDA_CHECK(cudaDeviceSynchronize());
    return Output();
  }

  // CPU attention; pages[b][g] lists logical pages (empty = dense).
  std::vector<float> Reference(const std::vector<std::vector<std::vector<int>>>& pages) {
    const int d = shape.head_dim, G = shape.hq / shape.hkv;
    std::vector<float> r(q.size());
    for (size_t b = 0; b < shape.lens.size(); ++b)
      for (int g = 0; g < shape.hkv; ++g)
        ref::DecodeAttentionKvHead(kv, tables[b], shape.lens[b], q.data() + b * shape.hq * d, G,
                                   g, pages.empty() ? std::vector<int>{} : pages[b][g],
                                   1.0 / std::sqrt(double(d)), r.data() + b * shape.hq * d);
    return r;
  }
};

std::vector<Shape> Shapes() {
  std::vector<Shape> v;
#ifdef TS_CUDA_EMU
  // On the CPU emulator (orders of magnitude slower): one shape per dtype x head_dim, covering
  // groups 1, 3, 4 and 8 and pages 8 to 32, each with a sequence past one 256-key compaction chunk.
  const Shape few[] = {{DType::kF16, 64, 9, 3, 16, {}}, {DType::kBF16, 128, 32, 4, 32, {}},
                       {DType::kF16, 128, 8, 2, 8, {}}, {DType::kBF16, 64, 4, 4, 16, {}}};
  for (Shape s : few) {
    s.lens = {1, 3 * s.page + 1, 260 * s.page + 3};
    v.push_back(s);
  }
  return v;
#endif
  const int gqa[4][2] = {{4, 4}, {9, 3}, {8, 2}, {32, 4}};  // groups 1, 3, 4, 8
  for (DType t : {DType::kF16, DType::kBF16})
    for (int d : {64, 128})
      for (const auto& h : gqa)
        for (int P : {8, 16, 32}) {
          if (t == DType::kBF16 && P == 8) continue;  // keep the grid modest
          // 260 * P + 3 tokens: 261 pages, more than one 256-key chunk of selection compaction.
          v.push_back(Shape{t, d, h[0], h[1], P, {1, 3 * P + 1, 40 * P - 5, 613, 260 * P + 3}});
        }
  return v;
}

// Every attention test runs both attend kernels; each must match the CPU on its own, and the
// bit-identity checks (quest vs dense, page lists vs dense) hold within one kernel.
constexpr AttendKernel kKernels[] = {AttendKernel::kCudaCores, AttendKernel::kTensorCores};

class DecodeAttentionTest : public testing::CudaTest {};

TEST_F(DecodeAttentionTest, DenseMatchesReference) {
  std::mt19937 rng(1234);
  for (const Shape& s : Shapes()) {
    Batch batch(s, rng);
    const auto want = batch.Reference({});
    for (AttendKernel ak : kKernels)
      for (int splits : {0, 1, 5})
        EXPECT_TRUE(AllClose(Describe(s) + " dense " + AttendKernelName(ak) +
                                 " splits=" + std::to_string(splits),
                             batch.Dense(ak, splits), want, Tol(s.dtype), Tol(s.dtype)));
  }
}

// Quest: selection equals the CPU rule (up to fp32 near-ties), equals the exact rule applied to
// the GPU's own scores, scores bound every q.k of their page, and attention over the selected
// pages matches the CPU; a budget >= the context equals dense bit for bit.
TEST_F(DecodeAttentionTest, QuestSelectionAndAttention) {
  std::mt19937 rng(99);
  struct Budget {
    int pages, sinks;
    GqaAggregation agg;
    int score_splits;
  };
  const Budget budgets[] = {{2, 0, GqaAggregation::kKvMax, 1},
                            {6, 1, GqaAggregation::kKvMax, 3},
                            {9, 2, GqaAggregation::kKvSum, 0},
                            {1000, 0, GqaAggregation::kKvMax, 1}};
  for (const Shape& s : Shapes()) {
    Batch batch(s, rng);
    const int B = static_cast<int>(s.lens.size()), G = s.hq / s.hkv, d = s.head_dim;
    for (const Budget& bu : budgets)
      for (AttendKernel ak : kKernels) {
        const std::string cfg = Describe(s) + " budget=" + std::to_string(bu.pages) + " sinks=" +
                                std::to_string(bu.sinks) + " agg=" +
                                (bu.agg == GqaAggregation::kKvMax ? "max" : "sum") +
                                " score_splits=" + std::to_string(bu.score_splits) + " " +
                                AttendKernelName(ak);
        DecodeAttentionParams p = batch.Params();
        p.attend_kernel = ak;
        p.budget_pages = bu.pages;
        p.n_sink = bu.sinks;
        p.aggregation = bu.agg;
        p.score_splits = bu.score_splits;
        p.num_splits = 3;
        DeviceBuffer sel(size_t(B) * s.hkv * bu.pages * 4), cnt(size_t(B) * s.hkv * 4),
            scores(size_t(B) * s.hkv * batch.max_pages * 4);
        sel.Poison();
        cnt.Poison();
        scores.Poison();
        p.selected_pages = sel.get<int32_t>();
        p.selected_count = cnt.get<int32_t>();
        p.page_scores = scores.get<float>();
        batch.Prepare(p, true);
        ASSERT_EQ(QuestDecodeAttention(p, nullptr), cudaSuccess)
            << cfg << ": " << LastLaunchError();
        TS_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = batch.Output();
        const auto gsel = testing::DownloadInts<int32_t>(sel.get(), sel.bytes() / 4);
        const auto gcnt = testing::DownloadInts<int32_t>(cnt.get(), cnt.bytes() / 4);
        const auto gsc = testing::Download(scores.get(), DType::kF32, scores.bytes() / 4);

        std::vector<std::vector<std::vector<int>>> used(B, std::vector<std::vector<int>>(s.hkv));
        for (int b = 0; b < B; ++b) {
          const int L = s.lens[b], n = (L + s.page - 1) / s.page;
          for (int g = 0; g < s.hkv; ++g) {
            const size_t slot = size_t(b) * s.hkv + g;
            const std::string where = cfg + " b=" + std::to_string(b) + " g=" + std::to_string(g);
            ASSERT_EQ(gcnt[slot], std::min(n, bu.pages)) << where;
            std::vector<int> mine(gsel.begin() + slot * bu.pages,
                                  gsel.begin() + slot * bu.pages + gcnt[slot]);
            used[b][g] = mine;
            const float* qb = batch.q.data() + size_t(b) * s.hq * d;
            std::vector<double> cpu(n, 0.0), gpu(n, 0.0);
            for (int j = bu.sinks; j < n - 1 && n > bu.pages; ++j) {
              cpu[j] = ref::PageScore(batch.kv, batch.tables[b], j, g, qb, G,
                                      bu.agg == GqaAggregation::kKvSum);
              gpu[j] = gsc[slot * batch.max_pages + j];
              const double tol = 1e-4 * (1.0 + std::fabs(cpu[j]));
              ASSERT_NEAR(gpu[j], cpu[j], tol) << where << " page " << j;
              // Upper bound: every valid key of the page, every head of the group.
              if (bu.agg == GqaAggregation::kKvMax) {
                for (int slot_i = 0; slot_i < s.page && j * s.page + slot_i < L; ++slot_i)
                  for (int h = g * G; h < (g + 1) * G; ++h) {
                    double dot = 0;
                    const size_t off = batch.kv.Kv(batch.tables[b][j], g, slot_i);
                    for (int e = 0; e < d; ++e) dot += double(qb[h * d + e]) * batch.kv.k[off + e];
                    ASSERT_GE(gpu[j] + tol, dot) << where << " page " << j << " slot " << slot_i;
                  }
              }
            }
            // Exact rule on the GPU's own scores.
            EXPECT_EQ(ref::SelectPages(gpu, n, bu.pages, bu.sinks), mine) << where;
            // CPU rule on CPU scores: equal sets, or differences only at fp32 near-ties.
            const auto want = ref::SelectPages(cpu, n, bu.pages, bu.sinks);
            if (want != mine) {
              std::vector<int> diff;
              std::set_symmetric_difference(want.begin(), want.end(), mine.begin(), mine.end(),
                                            std::back_inserter(diff));
              double kth = 1e300;
              for (int j : want)
                if (j >= bu.sinks && j < n - 1) kth = std::min(kth, cpu[j]);
              for (int j : diff)
                EXPECT_NEAR(cpu[j], kth, 1e-4 * (1.0 + std::fabs(kth))) << where << " page " << j;
            }
          }
        }
        EXPECT_TRUE(AllClose(cfg, got, batch.Reference(used), Tol(s.dtype), Tol(s.dtype)));
        if (bu.pages >= batch.max_pages) {  // dense equivalence, bit for bit at equal splits
          const auto dense = batch.Dense(ak, p.num_splits);
          EXPECT_EQ(0, std::memcmp(dense.data(), got.data(), got.size() * sizeof(float)))
              << cfg << ": quest with budget >= context differs from dense";
        }
      }
  }
}

// AttendPageLists: random ascending page lists per (sequence, KV head), always ending with the
// current page, named by physical ids, against the CPU over the same pages; with every page
// listed and budget = max_pages it equals the dense kernel bit for bit.
TEST_F(DecodeAttentionTest, AttendPageListsMatchesReference) {
  std::mt19937 rng(7);
  for (const Shape& s : Shapes()) {
    Batch batch(s, rng);
    const int B = static_cast<int>(s.lens.size());
    for (int budget : {3, 11, batch.max_pages})
      for (AttendKernel ak : kKernels) {
        std::vector<int32_t> lists(size_t(B) * s.hkv * budget, -1), counts(size_t(B) * s.hkv);
        std::vector<std::vector<std::vector<int>>> used(B, std::vector<std::vector<int>>(s.hkv));
        for (int b = 0; b < B; ++b) {
          const int n = (s.lens[b] + s.page - 1) / s.page;
          for (int g = 0; g < s.hkv; ++g) {
            std::vector<int> pick;
            if (budget >= n) {
              for (int j = 0; j < n; ++j) pick.push_back(j);
            } else {
              std::vector<int> cand(n - 1);
              std::iota(cand.begin(), cand.end(), 0);
              std::shuffle(cand.begin(), cand.end(), rng);
              pick.assign(cand.begin(), cand.begin() + (budget - 1));
              pick.push_back(n - 1);
              std::sort(pick.begin(), pick.end());
            }
            const size_t row = size_t(b) * s.hkv + g;
            counts[row] = static_cast<int32_t>(pick.size());
            for (size_t i = 0; i < pick.size(); ++i)
              lists[row * budget + i] = batch.tables[b][pick[i]];
            used[b][g] = pick;
          }
        }
        DeviceBuffer dl, dc;
        testing::UploadInts(dl, lists);
        testing::UploadInts(dc, counts);
        DecodeAttentionParams p = batch.Params();
        p.budget_pages = budget;
        p.num_splits = budget == batch.max_pages ? 0 : 2;
        p.attend_kernel = ak;
        batch.Prepare(p, true);
        const std::string cfg =
            Describe(s) + " lists budget=" + std::to_string(budget) + " " + AttendKernelName(ak);
        ASSERT_EQ(AttendPageLists(p, dl.get<int32_t>(), dc.get<int32_t>(), nullptr), cudaSuccess)
            << cfg << ": " << LastLaunchError();
        TS_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = batch.Output();
        EXPECT_TRUE(AllClose(cfg, got, batch.Reference(used), Tol(s.dtype), Tol(s.dtype)));
        if (budget == batch.max_pages) {
          const auto dense = batch.Dense(ak, 0);
          EXPECT_EQ(0, std::memcmp(dense.data(), got.data(), got.size() * sizeof(float)))
              << cfg << ": every page listed differs from dense";
        }
      }
  }
}

TEST_F(DecodeAttentionTest, RejectsBadArguments) {
  DecodeAttentionParams p;
  EXPECT_EQ(DenseDecodeAttention(p, nullptr), cudaErrorInvalidValue);
  p.layout = PagedKvLayout{8, 2, 16, 96};
  p.batch = 1;
  p.num_q_heads = 4;
  EXPECT_EQ(DenseDecodeAttention(p, nullptr), cudaErrorInvalidValue);
  EXPECT_STRNE(LastLaunchError(), "");
}

}  // namespace
}  // namespace tinyserve::cuda
