#include "common/fp16.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace tinyserve {
namespace {

TEST(Fp16, KnownValues) {
  EXPECT_EQ(Fp16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(Fp16ToFloat(0xc000), -2.0f);
  EXPECT_EQ(Fp16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(Fp16ToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(Fp16ToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(Fp16ToFloat(0x7e00)));
  EXPECT_EQ(FloatToFp16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(1e6f), 0x7c00);
  EXPECT_EQ(FloatToFp16(-0.0f), 0x8000);
}

TEST(Fp16, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7fff) > 0x7c00) continue;  // NaN payloads
    EXPECT_EQ(FloatToFp16(Fp16ToFloat(static_cast<fp16_t>(h))), h) << std::hex << h;
  }
}

TEST(Fp16, RoundsToNearest) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-70000.f, 70000.f);
  for (int i = 0; i < 100000; ++i) {
    float x = d(rng) * (i % 3 == 0 ? 1e-6f : 1.0f);
    float y = Fp16ToFloat(FloatToFp16(x));
    if (std::fabs(x) > 65504.f) continue;
    // Relative error of binary16 rounding is at most 2^-11 for normals.
    EXPECT_LE(std::fabs(y - x), std::max(std::fabs(x) * 0x1.0p-11f, 0x1.0p-25f)) << x;
  }
}

// Directed rounding: Down(f) <= f <= Up(f), each the nearest such fp16 (equal to f when exact).
TEST(Fp16, DirectedRoundingBoundsTheValue) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-70000.0f, 70000.0f);
  std::uniform_real_distribution<float> small(-1e-4f, 1e-4f);
  for (int i = 0; i < 200000; ++i) {
    const float f = (i % 2) ? u(rng) : small(rng);
    const fp16_t lo = FloatToFp16Down(f), hi = FloatToFp16Up(f);
    ASSERT_LE(Fp16ToFloat(lo), f) << f;
    ASSERT_GE(Fp16ToFloat(hi), f) << f;
    if (Fp16ToFloat(FloatToFp16(f)) == f) {
      ASSERT_EQ(Fp16ToFloat(lo), f);
      ASSERT_EQ(Fp16ToFloat(hi), f);
    } else if (std::fabs(f) < 65504.0f) {
      // Adjacent: nothing in fp16 strictly between them.
      const float mid_lo = Fp16ToFloat(FloatToFp16Up(std::nextafter(Fp16ToFloat(lo), 1e9f)));
      ASSERT_EQ(mid_lo, Fp16ToFloat(hi)) << f;
    }
  }
  EXPECT_EQ(Fp16ToFloat(FloatToFp16Down(1e6f)), 65504.0f);
  EXPECT_TRUE(std::isinf(Fp16ToFloat(FloatToFp16Up(1e6f))));
  EXPECT_EQ(Fp16ToFloat(FloatToFp16Up(-1e6f)), -65504.0f);
  EXPECT_LT(Fp16ToFloat(FloatToFp16Down(-1e-9f)), 0.0f);
  EXPECT_GT(Fp16ToFloat(FloatToFp16Up(1e-9f)), 0.0f);
}

TEST(Bf16, RoundTrip) {
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.5f)), 1.5f);
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
}

}  // namespace
}  // namespace tinyserve
