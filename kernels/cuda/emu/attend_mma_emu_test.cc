// The tensor-core decode attend kernel (kernels/cuda/decode_attend_mma.cu), its own source, run
// on the CPU emulator (cuda_emu.h) against the CPU reference attention: dense page tables and
// quest-style page lists, f16 and bf16, head_dim 64 and 128, GQA groups 1 to 8, page sizes 8 to
// 32, several split counts, stale slots poisoned with NaN, and cp.async copies landing both as
// late (at the wait) and as early (at issue) as the hardware allows. This runs in CI, where no
// GPU is; the same kernel's GPU test is cuda_decode_attention_test.
#define TS_CUDA_EMU 1
#include "kernels/cuda/emu/cuda_emu.h"
// The kernel's translation unit itself.
#include "kernels/cuda/decode_attend_mma.cu"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/reference/attention_ref.h"

namespace tinyserve::cuda {
namespace {

template <typename T>
uint16_t ToBits(float x) {
  if constexpr (std::is_same_v<T, __half>) {
    return static_cast<__half_raw>(__float2half_rn(x)).x;
  } else {
    return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(x)).x;
  }
}
template <typename T>
float Round(float x) {
  return ts_emu::Bits16ToFloat<T>(ToBits<T>(x));
}

struct Case {
  int hq, hkv, page;
  std::vector<int> lens;
  int splits;
  int budget;  // > 0: random page lists of at most `budget` pages (the quest path)
};

std::string Describe(const Case& c, int d, const char* dtype, ts_emu::CpAsyncMode mode) {
  std::ostringstream o;
  o << dtype << " d=" << d << " Hq=" << c.hq << " Hkv=" << c.hkv << " P=" << c.page
    << " splits=" << c.splits << " budget=" << c.budget << " lens=";
  for (int l : c.lens) o << l << ",";
  o << (mode == ts_emu::CpAsyncMode::kAtWait ? " copies-at-wait" : " copies-at-issue");
  return o.str();
}

template <typename T, int kD>
void RunCase(const Case& c, const char* dtype, ts_emu::CpAsyncMode mode, std::mt19937& rng) {
  const int P = c.page, B = static_cast<int>(c.lens.size()), G = c.hq / c.hkv;
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  // Pool: every sequence's pages plus spares, shuffled; random (rounded) K/V everywhere.
  int total = 0;
  for (int L : c.lens) total += (L + P - 1) / P;
  ref::HostPagedKv kv;
  kv.Resize(total + 3, c.hkv, P, kD);
  for (float& x : kv.k) x = Round<T>(u(rng));
  for (float& x : kv.v) x = Round<T>(u(rng));
  std::vector<int32_t> perm(kv.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> indptr{0}, indices;
  int next = 0;
  for (int L : c.lens) {
    const int n = (L + P - 1) / P;
    tables.emplace_back(perm.begin() + next, perm.begin() + next + n);
    next += n;
    indices.insert(indices.end(), tables.back().begin(), tables.back().end());
    indptr.push_back(static_cast<int32_t>(indices.size()));
  }
  // Device-format caches; the stale slots of each last page hold NaN.
  std::vector<uint16_t> kbits(kv.k.size()), vbits(kv.v.size());
  for (size_t i = 0; i < kv.k.size(); ++i) kbits[i] = ToBits<T>(kv.k[i]), vbits[i] = ToBits<T>(kv.v[i]);
  for (int b = 0; b < B; ++b) {
    const int n = (c.lens[b] + P - 1) / P;
    for (int slot = c.lens[b] - (n - 1) * P; slot < P; ++slot)
      for (int h = 0; h < c.hkv; ++h)
        for (int e = 0; e < kD; ++e) {
          kbits[kv.Kv(tables[b][n - 1], h, slot) + e] = ToBits<T>(NAN);
          vbits[kv.Kv(tables[b][n - 1], h, slot) + e] = ToBits<T>(NAN);
        }
  }
  std::vector<float> q(size_t(B) * c.hq * kD);
  for (float& x : q) x = Round<T>(2.f * u(rng));
  std::vector<uint16_t> qbits(q.size());
  for (size_t i = 0; i < q.size(); ++i) qbits[i] = ToBits<T>(q[i]);

  // Page lists (quest path): ascending random subsets that end with the last page.
  std::vector<std::vector<std::vector<int>>> used(B, std::vector<std::vector<int>>(c.hkv));
  std::vector<int32_t> lists, counts;
  if (c.budget > 0) {
    lists.assign(size_t(B) * c.hkv * c.budget, -1);
    counts.assign(size_t(B) * c.hkv, 0);
    for (int b = 0; b < B; ++b) {
      const int n = (c.lens[b] + P - 1) / P;
      for (int g = 0; g < c.hkv; ++g) {
        std::vector<int> pick;
        if (n <= c.budget) {
          pick.resize(n);
          std::iota(pick.begin(), pick.end(), 0);
        } else {
          std::vector<int> cand(n - 1);
          std::iota(cand.begin(), cand.end(), 0);
          std::shuffle(cand.begin(), cand.end(), rng);
          pick.assign(cand.begin(), cand.begin() + (c.budget - 1));
          pick.push_back(n - 1);
          std::sort(pick.begin(), pick.end());
        }
        const size_t row = size_t(b) * c.hkv + g;
        counts[row] = static_cast<int32_t>(pick.size());
        for (size_t i = 0; i < pick.size(); ++i) lists[row * c.budget + i] = tables[b][pick[i]];
        used[b][g] = pick;
      }
    }
  }

  std::vector<float> partial_o(size_t(B) * c.hq * c.splits * kD, NAN);
  std::vector<float> partial_ml(size_t(B) * c.hq * c.splits * 2, NAN);
  internal::AttendArgs a{};
  a.q = qbits.data();
  a.q_stride = int64_t{c.hq} * kD;
  a.k_cache = kbits.data();
  a.v_cache = vbits.data();
  a.layout = PagedKvLayout{kv.num_pages, c.hkv, P, kD};
  a.group = G;
  a.seq_lens = c.lens.data();
  a.page_indptr = indptr.data();
  a.page_indices = indices.data();
  a.sel_pages = c.budget > 0 ? lists.data() : nullptr;
  a.sel_count = c.budget > 0 ? counts.data() : nullptr;
  a.budget = c.budget;
  a.splits = c.splits;
  const double scale = 1.0 / std::sqrt(double(kD));
  a.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  a.partial_o = partial_o.data();
  a.partial_ml = partial_ml.data();
  using Tile = internal::MmaTile<T, kD>;
  ts_emu::Launch(
      dim3(c.splits, c.hkv, B), dim3(Tile::kThreads), Tile::kSmemBytes,
      [&] { internal::PagedAttendMmaKernel<T, kD>(a); }, mode);

  // The merge (MergeSplitsKernel's formula), then the CPU reference.
  const std::string cfg = Describe(c, kD, dtype, mode);
  const float tol = std::is_same_v<T, __half> ? 2e-3f : 1.5e-2f;
  std::vector<float> want(q.size());
  for (int b = 0; b < B; ++b)
    for (int g = 0; g < c.hkv; ++g)
      ref::DecodeAttentionKvHead(kv, tables[b], c.lens[b], q.data() + size_t(b) * c.hq * kD, G, g,
                                 c.budget > 0 ? used[b][g] : std::vector<int>{}, scale,
                                 want.data() + size_t(b) * c.hq * kD);
  int bad = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < c.hq; ++h) {
      const size_t row = (size_t(b) * c.hq + h) * c.splits;
      float m = -INFINITY;
      for (int s = 0; s < c.splits; ++s) {
        ASSERT_FALSE(std::isnan(partial_ml[(row + s) * 2])) << cfg << " b=" << b << " h=" << h;
        m = std::max(m, partial_ml[(row + s) * 2]);
      }
      ASSERT_NE(m, -INFINITY) << cfg << ": no split attended b=" << b << " h=" << h;
      for (int e = 0; e < kD; ++e) {
        double num = 0, den = 0;
        for (int s = 0; s < c.splits; ++s) {
          const float ms = partial_ml[(row + s) * 2];
          if (ms == -INFINITY) continue;
          const double w = std::exp2(double(ms) - m);
          den += w * partial_ml[(row + s) * 2 + 1];
          num += w * partial_o[(row + s) * kD + e];
        }
        const float got = Round<T>(static_cast<float>(num / den));
        const float ref = want[(size_t(b) * c.hq + h) * kD + e];
        if (!(std::fabs(got - ref) <= tol + tol * std::fabs(ref)) && bad++ < 5)
          ADD_FAILURE() << cfg << " b=" << b << " h=" << h << " e=" << e << ": got " << got
                        << " want " << ref;
      }
    }
  EXPECT_EQ(bad, 0) << cfg;
}

std::vector<Case> Cases() {
  std::vector<Case> v;
  const int gqa[4][2] = {{4, 4}, {9, 3}, {8, 2}, {16, 2}};  // groups 1, 3, 4, 8
  for (const auto& h : gqa)
    for (int P : {8, 16, 32}) {
      // One token, a partial page, pages spanning tiles, and 520 tokens: at one split that is
      // 17 tiles of 32 tokens, more than 4 warps x 3 stages, so every warp reuses its stages.
      const std::vector<int> lens{1, 3 * P + 1, 520};
      v.push_back(Case{h[0], h[1], P, lens, 1, 0});
      v.push_back(Case{h[0], h[1], P, lens, 3, 0});
      v.push_back(Case{h[0], h[1], P, lens, 2, 5});  // page lists of at most 5 pages
    }
  return v;
}

template <typename T, int kD>
void RunAll(const char* dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  for (const Case& c : Cases())
    for (auto mode : {ts_emu::CpAsyncMode::kAtWait, ts_emu::CpAsyncMode::kAtIssue}) {
      RunCase<T, kD>(c, dtype, mode, rng);
      if (::testing::Test::HasFatalFailure()) return;
    }
}

TEST(AttendMmaEmuTest, F16HeadDim64) { RunAll<__half, 64>("f16", 1); }
TEST(AttendMmaEmuTest, F16HeadDim128) { RunAll<__half, 128>("f16", 2); }
TEST(AttendMmaEmuTest, Bf16HeadDim64) { RunAll<__nv_bfloat16, 64>("bf16", 3); }
TEST(AttendMmaEmuTest, Bf16HeadDim128) { RunAll<__nv_bfloat16, 128>("bf16", 4); }

// The emulator's mma computes A B + C when A and B are handed out in the PTX ISA's fragment
// layouts (this test and the emulator are both written from the ISA's tables; the kernel's use of
// the layouts matches public FlashAttention-2-style code).
TEST(AttendMmaEmuTest, EmulatedMmaMatchesAPlainProduct) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  float A[16][16], Bm[16][8];
  for (auto& r : A)
    for (float& x : r) x = Round<__half>(u(rng));
  for (auto& r : Bm)
    for (float& x : r) x = Round<__half>(u(rng));
  std::vector<float> got(16 * 8, NAN);
  ts_emu::Launch(dim3(1), dim3(32), 0, [&] {
    const int l = threadIdx.x, g = l / 4, t = l % 4;
    auto pack = [](float lo, float hi) {
      return uint32_t{ToBits<__half>(lo)} | (uint32_t{ToBits<__half>(hi)} << 16);
    };
    const uint32_t a[4] = {pack(A[g][2 * t], A[g][2 * t + 1]),
                           pack(A[g + 8][2 * t], A[g + 8][2 * t + 1]),
                           pack(A[g][2 * t + 8], A[g][2 * t + 9]),
                           pack(A[g + 8][2 * t + 8], A[g + 8][2 * t + 9])};
    const uint32_t b0 = pack(Bm[2 * t][g], Bm[2 * t + 1][g]);
    const uint32_t b1 = pack(Bm[2 * t + 8][g], Bm[2 * t + 9][g]);
    float c[4] = {0, 0, 0, 0};
    ts_emu::Mma16816<__half>(c, a, b0, b1);
    got[g * 8 + 2 * t] = c[0];
    got[g * 8 + 2 * t + 1] = c[1];
    got[(g + 8) * 8 + 2 * t] = c[2];
    got[(g + 8) * 8 + 2 * t + 1] = c[3];
  });
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      double s = 0;
      for (int k = 0; k < 16; ++k) s += double(A[i][k]) * Bm[k][j];
      EXPECT_NEAR(got[i * 8 + j], s, 1e-4) << i << "," << j;
    }
}

}  // namespace
}  // namespace tinyserve::cuda
