// Load-time weight conversion (weight_convert.h) on the dequantizer goldens' blocks
// (tests/golden/dequant/, random codes and scales of every type): the converted row, read back
// through its own dequantizer, equals the original within the bound weight_convert.h states
// (fp16-rounded scales: Q4_K, Q5_K, IQ4_XS; requantized: the rest). And
// PrepareMatrix's product on the converted matrix equals the float product of the original
// within that bound plus the activations' int8 rounding.
#include "kernels/cpu/weight_convert.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/fp16.h"
#include "gtest/gtest.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/matmul.h"

namespace tinyserve {
namespace {

constexpr int kN = 512;

std::vector<uint8_t> Blocks(const std::string& name) {
  std::ifstream f("tests/golden/dequant/" + name + ".blocks", std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

std::vector<float> Dequant(GgmlType type, const uint8_t* row, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  EXPECT_TRUE(DequantizeRow(type, row, y.data(), n).ok());
  return y;
}

float F16At(const uint8_t* p) {
  fp16_t h;
  std::memcpy(&h, p, 2);
  return Fp16ToFloat(h);
}

// The largest |converted - original| weight_convert.h allows at element i of the row.
using BoundFn = float (*)(const uint8_t* blocks, const std::vector<float>& x, int i);

// Q4_K -> Q4_1 (Q5_K -> Q5_1): q·fp16(d·sc) + fp16(−dmin·m), codes q <= kMaxCode; each scale
// off by at most 2^-11 of itself.
template <int kBlockBytes, int kMaxCode>
float KQuantBound(const uint8_t* b, const std::vector<float>&, int i) {
  const uint8_t* sb = b + kBlockBytes * (i / 256);
  int sc, mn;
  ScaleMinK4((i % 256) / 32, sb + 4, &sc, &mn);
  const float ds = F16At(sb) * sc, dm = F16At(sb + 2) * mn;
  return std::ldexp(kMaxCode * std::fabs(ds) + std::fabs(dm), -11) * 1.0001f;
}

// IQ4_XS -> IQ4_NL: level · fp16(d·(ls − 32)); levels are at most 127 in magnitude.
float Iq4XsBound(const uint8_t* b, const std::vector<float>&, int i) {
  const uint8_t* sb = b + 136 * (i / 256);
  const int ib = (i % 256) / 32;
  uint16_t scales_h;
  std::memcpy(&scales_h, sb + 2, 2);
  const int ls = ((sb[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
  return std::ldexp(127 * std::fabs(F16At(sb) * (ls - 32)), -11) * 1.0001f;
}

// Requantized to Q8_0: half a step (amax / 254) plus the fp16 rounding of the step (127 steps
// of 2^-11 relative error).
float RequantBound(const uint8_t*, const std::vector<float>& x, int i) {
  float amax = 0;
  for (int j = i / 32 * 32; j < i / 32 * 32 + 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  return amax * (1.0f / 254 + std::ldexp(1.0f, -11)) * 1.0001f;
}

struct Case {
  GgmlType type;
  const char* name;
  GgmlType to;
  BoundFn bound;
};

class WeightConvertTest : public ::testing::TestWithParam<Case> {};

TEST_P(WeightConvertTest, RowReadsBackWithinBound) {
  const Case& c = GetParam();
  const std::vector<uint8_t> blocks = Blocks(c.name);
  ASSERT_EQ(blocks.size(), GgmlRowBytes(c.type, kN)) << "run from the source root";
  ASSERT_EQ(ConvertedType(c.type), c.to);
  std::vector<uint8_t> converted(GgmlRowBytes(c.to, kN), 0xAA);
  ASSERT_TRUE(ConvertRow(c.type, blocks.data(), converted.data(), kN));
  const std::vector<float> want = Dequant(c.type, blocks.data(), kN);
  const std::vector<float> got = Dequant(c.to, converted.data(), kN);
  float worst = 0;
  for (int i = 0; i < kN; ++i) {
    const float err = std::fabs(got[i] - want[i]);
    ASSERT_TRUE(std::isfinite(got[i])) << i;
    ASSERT_LE(err, c.bound(blocks.data(), want, i))
        << c.name << " element " << i << ": " << got[i] << " vs " << want[i];
    worst = std::max(worst, err);
  }
  EXPECT_GT(worst, 0.0f) << "a lossy conversion that loses nothing on random codes: not run?";
}

TEST_P(WeightConvertTest, PreparedMatrixMultipliesLikeTheOriginal) {
  const Case& c = GetParam();
  const std::vector<uint8_t> row = Blocks(c.name);
  ASSERT_EQ(row.size(), GgmlRowBytes(c.type, kN));
  // 8 rows: the golden row with its blocks rotated by r, so rows differ.
  const int64_t rows = 8;
  const size_t bb = GetGgmlTypeInfo(c.type)->block_bytes, nb = row.size() / bb;
  std::vector<uint8_t> data;
  for (int64_t r = 0; r < rows; ++r)
    for (size_t b = 0; b < nb; ++b)
      data.insert(data.end(), row.begin() + ((b + r) % nb) * bb,
                  row.begin() + ((b + r) % nb + 1) * bb);
  auto prepared = PrepareMatrix(MatrixView(c.type, rows, kN, data.data()));
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_EQ(prepared->type, c.to);
  EXPECT_EQ(prepared->layout, RepackEnabled() ? MatrixLayout::kSplit : MatrixLayout::kGgml);

  std::vector<float> x(kN);
  for (int i = 0; i < kN; ++i) x[i] = std::sin(0.37f * i) + 0.25f;
  std::vector<float> y(rows);
  MatMul(*prepared, x.data(), 1, y.data(), nullptr);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> w = Dequant(c.type, data.data() + r * row.size(), kN);
    double want = 0, mag = 0, conv = 0;
    for (int i = 0; i < kN; ++i) {
      want += static_cast<double>(w[i]) * x[i];
      mag += std::fabs(static_cast<double>(w[i]) * x[i]);
      conv += c.bound(data.data() + r * row.size(), w, i) * std::fabs(x[i]);
    }
    // Activations rounded to int8 per block of 32: about 1e-2 of Σ|w·x| at worst (matmul.h).
    EXPECT_NEAR(y[r], want, conv + 1.5e-2 * mag + 1e-6) << c.name << " row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, WeightConvertTest,
    ::testing::Values(Case{GgmlType::kQ4_K, "Q4_K", GgmlType::kQ4_1, KQuantBound<144, 15>},
                      Case{GgmlType::kQ5_K, "Q5_K", GgmlType::kQ5_1, KQuantBound<176, 31>},
                      Case{GgmlType::kIQ4_XS, "IQ4_XS", GgmlType::kIQ4_NL, Iq4XsBound},
                      Case{GgmlType::kQ2_K, "Q2_K", GgmlType::kQ8_0, RequantBound},
                      Case{GgmlType::kQ3_K, "Q3_K", GgmlType::kQ8_0, RequantBound},
                      Case{GgmlType::kQ6_K, "Q6_K", GgmlType::kQ8_0, RequantBound}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// The types with their own kernels are not converted: PrepareMatrix keeps them, and its product
// is the golden row's within the activations' rounding.
TEST(WeightConvertTest, KernelTypesStayAsTheyAre) {
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                        GgmlType::kQ8_0, GgmlType::kIQ4_NL}) {
    EXPECT_EQ(ConvertedType(type), type) << GgmlTypeName(type);
  }
  for (GgmlType type : {GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kIQ4_NL}) {
    const std::string name(GgmlTypeName(type));
    const std::vector<uint8_t> row = Blocks(name);
    ASSERT_EQ(row.size(), GgmlRowBytes(type, kN)) << "run from the source root";
    auto prepared = PrepareMatrix(MatrixView(type, 1, kN, row.data()));
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    EXPECT_EQ(prepared->type, type);
    std::vector<float> x(kN), y(1);
    for (int i = 0; i < kN; ++i) x[i] = std::cos(0.21f * i) - 0.1f;
    MatMul(*prepared, x.data(), 1, y.data(), nullptr);
    const std::vector<float> w = Dequant(type, row.data(), kN);
    double want = 0, mag = 0;
    for (int i = 0; i < kN; ++i) {
      want += static_cast<double>(w[i]) * x[i];
      mag += std::fabs(static_cast<double>(w[i]) * x[i]);
    }
    EXPECT_NEAR(y[0], want, 1.5e-2 * mag) << name;
  }
}

TEST(WeightConvertTest, ScaleBeyondFp16FallsBackToF32) {
  // One Q4_K super-block whose d·sc (60000 · 63) no fp16 holds.
  std::vector<uint8_t> b(144, 0x11);
  const fp16_t d = FloatToFp16(60000.0f), dmin = FloatToFp16(1.0f);
  std::memcpy(b.data(), &d, 2);
  std::memcpy(b.data() + 2, &dmin, 2);
  b[4] = 63;  // sub-block 0's scale
  std::vector<uint8_t> out(GgmlRowBytes(GgmlType::kQ4_1, 256));
  EXPECT_FALSE(ConvertRow(GgmlType::kQ4_K, b.data(), out.data(), 256));
  auto prepared = PrepareMatrix(MatrixView(GgmlType::kQ4_K, 1, 256, b.data()));
  ASSERT_TRUE(prepared.ok());
  EXPECT_EQ(prepared->type, GgmlType::kF32);
  std::vector<float> got(256);
  MatrixRowToFloat(*prepared, 0, got.data());
  EXPECT_EQ(got, Dequant(GgmlType::kQ4_K, b.data(), 256));
}

}  // namespace
}  // namespace tinyserve
