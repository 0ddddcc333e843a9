// The vectorized elementwise ops (RmsNorm, SwiGlu, fp16 rows and boxes) and the RoPE table
// against plain-loop and double-precision references; ctest also runs it with
// TINYSERVE_ATTENTION_ISA=scalar.
#include "kernels/cpu/ops.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/fp16.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"

namespace tinyserve {
namespace {

// Sizes around the 8-lane vectors: empty, tails only, whole vectors, vectors plus a tail.
constexpr int kSizes[] = {0, 1, 7, 8, 9, 64, 576, 1539};

// The table grows with the positions reserved and gives, at every position, the rotation of a
// double-precision reference (with YaRN's scale on cos and sin); the first reservation does not
// cover the model's whole context.
TEST(RopeTable, GrowsOnDemandAndMatchesTheFormula) {
  const int d = 8, max_pos = 1 << 30;  // a context no table could hold up front
  const std::vector<float> factors = {1.0f, 1.5f, 4.0f, 4.0f};
  RopeTable t(d, max_pos, 10000.0f, 0.5f, factors, 1.25f);
  EXPECT_EQ(t.max_pos(), max_pos);
  for (int64_t pos : {int64_t{0}, int64_t{5}, int64_t{4095}, int64_t{4096}, int64_t{100000}}) {
    t.Reserve(pos + 1);
    for (bool adjacent : {false, true}) {
      float x[d] = {1, -2, 3, 0.5f, -1, 2, 0.25f, 4};
      double want[d];
      for (int i = 0; i < d; ++i) want[i] = x[i];
      for (int i = 0; i < d / 2; ++i) {
        const double a = pos * 0.5 * std::pow(10000.0, -2.0 * i / d) / factors[i];
        const int i0 = adjacent ? 2 * i : i, i1 = adjacent ? 2 * i + 1 : i + d / 2;
        const double x0 = x[i0], x1 = x[i1];
        want[i0] = 1.25 * (x0 * std::cos(a) - x1 * std::sin(a));
        want[i1] = 1.25 * (x0 * std::sin(a) + x1 * std::cos(a));
      }
      t.Apply(x, pos, adjacent);
      for (int i = 0; i < d; ++i) EXPECT_NEAR(x[i], want[i], 2e-6 * 8) << pos << " " << i;
    }
  }
}

TEST(RmsNorm, MatchesDoubleReference) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 2.0f);
  for (int n : kSizes) {
    if (n == 0) continue;
    std::vector<float> x(n), w(n), y(n, NAN);
    for (auto& v : x) v = nd(rng);
    for (auto& v : w) v = 1.0f + 0.1f * nd(rng);
    RmsNorm(x.data(), w.data(), n, 1e-5f, y.data());
    double ss = 0;
    for (float v : x) ss += static_cast<double>(v) * v;
    const double inv = 1.0 / std::sqrt(ss / n + 1e-5);
    for (int i = 0; i < n; ++i)
      ASSERT_NEAR(y[i], x[i] * inv * w[i], 1e-6 * (1 + std::fabs(x[i] * inv * w[i])))
          << "n " << n << " i " << i;
  }
}

TEST(SwiGlu, MatchesDoubleReferenceIncludingTheClampedRange) {
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0, 4.0f);
  for (int n : kSizes) {
    std::vector<float> g(n), up(n);
    for (auto& v : g) v = nd(rng);
    for (auto& v : up) v = nd(rng);
    // Arguments past the exp's clamp at both ends.
    if (n >= 8) g[1] = 120.0f, g[2] = -120.0f, g[3] = 88.5f, g[4] = -87.5f;
    std::vector<float> out = g;
    SwiGlu(out.data(), up.data(), n);
    for (int i = 0; i < n; ++i) {
      const double ref = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * up[i];
      ASSERT_NEAR(out[i], ref, 1e-6 * std::fabs(ref) + 1e-30) << "n " << n << " g " << g[i];
    }
  }
}

// The vector SwiGlu does the scalar loop's float operations with exp(-g) rounded from double, so
// it gives the scalar loop's bits wherever libm's expf is correctly rounded (nearly everywhere):
// the model's outputs do not move with it.
TEST(SwiGlu, GivesTheScalarLoopsBitsNearlyEverywhere) {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0, 4.0f);
  const int n = 100000;
  std::vector<float> g(n), up(n);
  for (auto& v : g) v = nd(rng);
  for (auto& v : up) v = nd(rng);
  std::vector<float> out = g;
  SwiGlu(out.data(), up.data(), n);
  int differ = 0;
  for (int i = 0; i < n; ++i) {
    const float ref = g[i] / (1.0f + std::exp(-g[i])) * up[i];
    int32_t a, b;
    std::memcpy(&a, &ref, 4);
    std::memcpy(&b, &out[i], 4);
    if (a == b) continue;
    ++differ;
    ASSERT_LE(std::abs(a - b), 4) << "g " << g[i] << " up " << up[i];
  }
  EXPECT_LE(differ, n / 1000);
}

TEST(Fp16Rows, ConversionAndBoxGiveTheScalarBits) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 1.0f);
  std::uniform_int_distribution<int> pick(0, 5);
  for (int n : kSizes) {
    // Normal values, fp16 subnormals, overflow, exact ties, signed zeros, infinities.
    std::vector<float> x(n);
    for (auto& v : x) {
      switch (pick(rng)) {
        case 0:
          v = nd(rng) * 1e-6f;
          break;
        case 1:
          v = nd(rng) * 7e4f;
          break;
        case 2:
          v = 1.0f + (2 * (rng() % 1024) + 1) * 0x1p-11f;
          break;  // halfway to fp16
        case 3:
          v = (rng() % 2) ? -0.0f : std::numeric_limits<float>::infinity();
          break;
        default:
          v = nd(rng) * 10.0f;
      }
    }
    std::vector<fp16_t> h(n);
    FloatToFp16Row(x.data(), h.data(), n);
    for (int i = 0; i < n; ++i) ASSERT_EQ(h[i], FloatToFp16(x[i])) << "x " << x[i];

    std::vector<fp16_t> mn(n), mx(n);
    for (int i = 0; i < n; ++i) {
      mn[i] = FloatToFp16(nd(rng));
      mx[i] = FloatToFp16(Fp16ToFloat(mn[i]) + std::fabs(nd(rng)));
    }
    // Ties between signed zeros (-0 is neither below +0 nor above it) and equal values.
    for (int i = 0; i + 3 < n; i += 5) {
      h[i] = 0x8000u, mn[i] = 0x0000u;
      h[i + 1] = 0x0000u, mx[i + 1] = 0x8000u, mn[i + 1] = 0x8000u;
      h[i + 2] = mn[i + 2];
    }
    std::vector<fp16_t> mn_ref = mn, mx_ref = mx;
    for (int i = 0; i < n; ++i) {
      const float v = Fp16ToFloat(h[i]);
      if (v < Fp16ToFloat(mn_ref[i])) mn_ref[i] = h[i];
      if (v > Fp16ToFloat(mx_ref[i])) mx_ref[i] = h[i];
    }
    WidenFp16Box(h.data(), mn.data(), mx.data(), n);
    EXPECT_EQ(mn, mn_ref) << "n " << n;
    EXPECT_EQ(mx, mx_ref) << "n " << n;
  }
}

}  // namespace
}  // namespace tinyserve
