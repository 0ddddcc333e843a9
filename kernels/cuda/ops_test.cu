// GPU vs CPU tests of the elementwise kernels: norms, RoPE (plain, scaled, with Qwen3's per-head
// norms), bias add, SwiGLU,
// GELU, embedding, sampling.
#include <random>
#include <sstream>

#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/reference/ops_ref.h"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/sampling.cuh"
#include "kernels/cuda/test_util.cuh"

namespace tinyserve::cuda {
namespace {

using testing::AllClose;
using testing::DeviceBuffer;
using testing::Download;
using testing::RandomRounded;
using testing::Tol;
using testing::Upload;

class OpsTest : public testing::CudaTest {};

std::string Cfg(const char* what, DType t, int a, int b) {
  std::ostringstream o;
  o << what << " " << DTypeName(t) << " " << a << "x" << b;
  return o.str();
}

TEST_F(OpsTest, RmsNormAndLayerNorm) {
  std::mt19937 rng(1);
  for (DType t : {DType::kF16, DType::kBF16})
    for (int n : {64, 576, 2048}) {
      const int rows = 5;
      const auto x = RandomRounded(rng, t, size_t(rows) * n, -2, 2);
      const auto res = RandomRounded(rng, t, size_t(rows) * n, -2, 2);
      const auto w = RandomRounded(rng, t, n, 0.5f, 1.5f);
      const auto bias = RandomRounded(rng, t, n, -0.5f, 0.5f);
      DeviceBuffer xd, rd, wd, bd, od;
      Upload(xd, t, x);
      Upload(rd, t, res);
      Upload(wd, t, w);
      Upload(bd, t, bias);
      od.Resize(x.size() * 2);
      std::vector<float> want(x.size());
      // Plain RMSNorm.
      od.Poison();
      ASSERT_EQ(RmsNorm(t, xd.get(), wd.get(), od.get(), nullptr, rows, n, 1e-5f, nullptr),
                cudaSuccess);
      ref::RmsNorm(x.data(), w.data(), want.data(), nullptr, rows, n, 1e-5f);
      EXPECT_TRUE(AllClose(Cfg("rmsnorm", t, rows, n), Download(od.get(), t, x.size()), want,
                           Tol(t), Tol(t)));
      // Fused residual add.
      od.Poison();
      auto res_ref = res;
      ASSERT_EQ(RmsNorm(t, xd.get(), wd.get(), od.get(), rd.get(), rows, n, 1e-5f, nullptr),
                cudaSuccess);
      ref::RmsNorm(x.data(), w.data(), want.data(), res_ref.data(), rows, n, 1e-5f);
      EXPECT_TRUE(AllClose(Cfg("rmsnorm+res", t, rows, n), Download(od.get(), t, x.size()), want,
                           2 * Tol(t), 2 * Tol(t)));
      EXPECT_TRUE(AllClose(Cfg("rmsnorm residual", t, rows, n), Download(rd.get(), t, x.size()),
                           res_ref, Tol(t), Tol(t)));
      // LayerNorm.
      od.Poison();
      ASSERT_EQ(LayerNorm(t, xd.get(), wd.get(), bd.get(), od.get(), rows, n, 1e-5f, nullptr),
                cudaSuccess);
      ref::LayerNorm(x.data(), w.data(), bias.data(), want.data(), rows, n, 1e-5f);
      EXPECT_TRUE(AllClose(Cfg("layernorm", t, rows, n), Download(od.get(), t, x.size()), want,
                           Tol(t), Tol(t)));
    }
}

// RoPE over the Q and K heads of fused QKV rows ([tokens][hq + 2 hkv][d]) in `qkv`.
RopeParams FusedQkvRope(DType t, DeviceBuffer& qkv, DeviceBuffer& positions, int tokens, int hq,
                        int hkv, int d, RopeStyle style, float theta) {
  RopeParams p;
  p.dtype = t;
  p.q = qkv.get();
  p.q_stride = (hq + 2 * hkv) * d;
  p.k = static_cast<char*>(qkv.get()) + size_t(hq) * d * 2;
  p.k_stride = p.q_stride;
  p.positions = positions.get<int32_t>();
  p.tokens = tokens;
  p.num_q_heads = hq;
  p.num_kv_heads = hkv;
  p.head_dim = d;
  p.theta = theta;
  p.style = style;
  return p;
}

TEST_F(OpsTest, RopeBothStyles) {
  std::mt19937 rng(2);
  for (DType t : {DType::kF16, DType::kBF16})
    for (int d : {64, 128})
      for (RopeStyle style : {RopeStyle::kAdjacentPairs, RopeStyle::kRotateHalf})
        for (bool scaled : {false, true}) {  // linear scale, Llama 3 factors, YaRN's factor
          const int tokens = 4, hq = 9, hkv = 3, stride = (hq + 2 * hkv) * d;  // fused QKV rows
          auto qkv = RandomRounded(rng, t, size_t(tokens) * stride, -1, 1);
          const std::vector<int32_t> pos = {0, 1, 4097, 131071};
          DeviceBuffer buf, posd;
          Upload(buf, t, qkv);
          testing::UploadInts(posd, pos);
          RopeParams p = FusedQkvRope(t, buf, posd, tokens, hq, hkv, d, style, 10000.f);
          std::vector<float> factors(d / 2);
          std::uniform_real_distribution<float> u(1.f, 8.f);
          for (float& f : factors) f = u(rng);
          DeviceBuffer factors_d;
          if (scaled) {
            factors_d.Resize(factors.size() * sizeof(float));
            ASSERT_EQ(cudaMemcpy(factors_d.get(), factors.data(), factors.size() * sizeof(float),
                                 cudaMemcpyHostToDevice),
                      cudaSuccess);
            p.freq_scale = 0.25f;
            p.freq_factors = factors_d.get<float>();
            p.attn_factor = 1.25f;
          }
          ASSERT_EQ(ApplyRope(p, nullptr), cudaSuccess) << LastLaunchError();
          auto want = qkv;
          for (int i = 0; i < tokens; ++i)
            for (int h = 0; h < hq + hkv; ++h)
              ref::RopeRow(want.data() + size_t(i) * stride + h * d, d, pos[i], 10000.0,
                           style == RopeStyle::kAdjacentPairs, scaled ? 0.25 : 1.0,
                           scaled ? factors.data() : nullptr, scaled ? 1.25 : 1.0);
          EXPECT_TRUE(AllClose(
              Cfg(style == RopeStyle::kRotateHalf ? (scaled ? "rope half scaled" : "rope half")
                                                  : (scaled ? "rope adj scaled" : "rope adj"),
                  t, d, tokens),
              Download(buf.get(), t, qkv.size()), want, Tol(t), Tol(t)));
        }
}

// Qwen3's per-head Q/K norms fused into RoPE, with a partial rotary_dim (the tail is
// normalised, not rotated) and K left without a norm in one case.
TEST_F(OpsTest, RopeWithPerHeadNorms) {
  std::mt19937 rng(3);
  for (DType t : {DType::kF16, DType::kBF16})
    for (int d : {64, 128})
      for (RopeStyle style : {RopeStyle::kAdjacentPairs, RopeStyle::kRotateHalf})
        for (int variant = 0; variant < 2; ++variant) {  // 1: rotary_dim d/2, no K norm
          const int tokens = 3, hq = 16, hkv = 8, stride = (hq + 2 * hkv) * d;
          const int rot = variant == 1 ? d / 2 : d;
          auto qkv = RandomRounded(rng, t, size_t(tokens) * stride, -3, 3);
          const auto qn = RandomRounded(rng, t, d, 0.5f, 1.5f);
          const auto kn = RandomRounded(rng, t, d, 0.5f, 1.5f);
          const std::vector<int32_t> pos = {0, 7, 40000};
          DeviceBuffer buf, posd, qnd, knd;
          Upload(buf, t, qkv);
          Upload(qnd, t, qn);
          Upload(knd, t, kn);
          testing::UploadInts(posd, pos);
          RopeParams p = FusedQkvRope(t, buf, posd, tokens, hq, hkv, d, style, 1000000.f);
          p.rotary_dim = rot;
          p.q_norm = qnd.get();
          p.k_norm = variant == 1 ? nullptr : knd.get();
          p.norm_eps = 1e-6f;
          ASSERT_EQ(ApplyRope(p, nullptr), cudaSuccess) << LastLaunchError();
          auto want = qkv;
          for (int i = 0; i < tokens; ++i)
            for (int h = 0; h < hq + hkv; ++h) {
              float* row = want.data() + size_t(i) * stride + h * d;
              const bool is_q = h < hq;
              if (is_q || variant == 0)
                ref::RmsNorm(row, is_q ? qn.data() : kn.data(), row, nullptr, 1, d, 1e-6f);
              ref::RopeRow(row, rot, pos[i], 1000000.0, style == RopeStyle::kAdjacentPairs);
            }
          EXPECT_TRUE(AllClose(
              Cfg(variant == 1 ? "rope+qnorm rot/2" : "rope+qknorm", t, d, static_cast<int>(style)),
              Download(buf.get(), t, qkv.size()), want, 2 * Tol(t), 2 * Tol(t)));
        }
}

TEST_F(OpsTest, AddBias) {
  std::mt19937 rng(7);
  for (DType t : {DType::kF16, DType::kBF16})
    for (int n : {64, 576, 1000}) {
      const int rows = 7, stride = n + 32;  // e.g. the Q/K/V part of wider rows
      auto y = RandomRounded(rng, t, size_t(rows) * stride, -2, 2);
      const auto bias = RandomRounded(rng, t, n, -1, 1);
      DeviceBuffer yd, bd;
      Upload(yd, t, y);
      Upload(bd, t, bias);
      ASSERT_EQ(AddBias(t, yd.get(), stride, bd.get(), rows, n, nullptr), cudaSuccess)
          << LastLaunchError();
      ref::AddBias(y.data(), stride, bias.data(), rows, n);  // the 32 tail columns unchanged
      EXPECT_TRUE(AllClose(Cfg("add bias", t, rows, n), Download(yd.get(), t, y.size()), y, Tol(t),
                           Tol(t)));
    }
}

TEST_F(OpsTest, SwiGluAndGelu) {
  std::mt19937 rng(3);
  for (DType t : {DType::kF16, DType::kBF16}) {
    const int rows = 3, n = 1000;
    const auto gu = RandomRounded(rng, t, size_t(rows) * 2 * n, -4, 4);  // [rows][gate|up]
    DeviceBuffer gud, od;
    Upload(gud, t, gu);
    od.Resize(size_t(rows) * n * 2);
    od.Poison();
    ASSERT_EQ(SwiGlu(t, gud.get(), 2 * n, static_cast<char*>(gud.get()) + size_t(n) * 2, 2 * n,
                     od.get(), n, rows, n, nullptr),
              cudaSuccess);
    std::vector<float> want(size_t(rows) * n);
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < n; ++i)
        want[r * n + i] = ref::Silu(gu[r * 2 * n + i]) * gu[r * 2 * n + n + i];
    EXPECT_TRUE(AllClose(Cfg("swiglu", t, rows, n), Download(od.get(), t, want.size()), want,
                         Tol(t), Tol(t)));
    od.Poison();
    ASSERT_EQ(GeluTanh(t, gud.get(), od.get(), int64_t{rows} * n, nullptr), cudaSuccess);
    for (int i = 0; i < rows * n; ++i) want[i] = ref::GeluTanh(gu[i]);
    EXPECT_TRUE(AllClose(Cfg("gelu", t, rows, n), Download(od.get(), t, want.size()), want,
                         Tol(t), Tol(t)));
  }
}

TEST_F(OpsTest, EmbeddingLookup) {
  std::mt19937 rng(4);
  const int vocab = 100, dim = 64;
  const DType t = DType::kBF16;
  const auto table = RandomRounded(rng, t, size_t(vocab) * dim, -1, 1);
  const std::vector<int32_t> ids = {0, 99, 7, -1, 100, 42};
  DeviceBuffer td, idd, od(ids.size() * dim * 2);
  Upload(td, t, table);
  testing::UploadInts(idd, ids);
  od.Poison();
  ASSERT_EQ(EmbeddingLookup(t, td.get(), idd.get<int32_t>(), od.get(), 6, vocab, dim, nullptr),
            cudaSuccess);
  std::vector<float> want(ids.size() * dim, 0.f);
  for (size_t r = 0; r < ids.size(); ++r)
    if (ids[r] >= 0 && ids[r] < vocab)
      for (int e = 0; e < dim; ++e) want[r * dim + e] = table[size_t(ids[r]) * dim + e];
  EXPECT_TRUE(AllClose("embedding", Download(od.get(), t, want.size()), want, 0, 0));
}

TEST_F(OpsTest, ArgmaxAndSoftmaxTopK) {
  std::mt19937 rng(6);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    const int rows = 4, vocab = 32000;
    auto logits = RandomRounded(rng, t, size_t(rows) * vocab, -10, 10);
    logits[5] = logits[77] = 50.f;               // row 0: a tie, lower index wins
    logits[vocab + 31999] = 60.f;                // row 1: last element
    logits[2 * vocab + 3] = NAN;                 // row 2: NaN never wins
    DeviceBuffer ld, od(rows * 4), pd(size_t(rows) * vocab * 4);
    Upload(ld, t, logits);
    od.Poison();
    ASSERT_EQ(ArgmaxRows(t, ld.get(), rows, vocab, od.get<int32_t>(), nullptr), cudaSuccess);
    const auto got = testing::DownloadInts<int32_t>(od.get(), rows);
    for (int r = 0; r < rows; ++r)
      EXPECT_EQ(got[r], ref::Argmax(logits.data() + size_t(r) * vocab, vocab))
          << DTypeName(t) << " row " << r;
    for (int k : {0, 1, 40}) {
      pd.Poison();
      ASSERT_EQ(SoftmaxTopK(t, ld.get(), rows, vocab, 0.7f, k, pd.get<float>(), nullptr),
                cudaSuccess);
      std::vector<float> want(size_t(rows) * vocab);
      for (int r = 0; r < rows; ++r) {
        if (r == 2) continue;  // NaN row: only checked for the argmax
        ref::SoftmaxTopK(logits.data() + size_t(r) * vocab, vocab, 0.7f, k,
                         want.data() + size_t(r) * vocab);
      }
      auto probs = Download(pd.get(), DType::kF32, want.size());
      std::fill(probs.begin() + 2 * vocab, probs.begin() + 3 * vocab, 0.f);
      EXPECT_TRUE(AllClose(Cfg("softmax_topk", t, k, vocab), probs, want, 1e-4f, 1e-6f));
    }
  }
}

}  // namespace
}  // namespace tinyserve::cuda
