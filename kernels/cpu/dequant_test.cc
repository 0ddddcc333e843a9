// Dequantizers against golden values from the `gguf` Python package
// (scripts/make_dequant_goldens.py writes tests/golden/dequant/), and the reference quantizers
// against gguf's quantizer bytes.
//
// Comparison: bit-identical for every type. gguf computes each element in float32 with the same
// operation order as dequant.cc (Q4_1/Q5_1: d*q + m; Q4_K: (d*sc)*q - dmin*m; Q6_K:
// (d*sc)*q), and the build does not contract to FMA (-std=c++20 sets -ffp-contract=off), so no
// ulp slack is needed. Should a future SIMD path fuse multiply-adds, Q4_1, Q5_1 and Q4_K are the
// types that would move by up to 1 ulp.
#include "kernels/cpu/dequant.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/fp16.h"
#include "gtest/gtest.h"

namespace tinyserve {
namespace {

constexpr int kN = 512;
const char kGoldenDir[] = "tests/golden/dequant/";

std::vector<uint8_t> ReadFile(const std::string& name) {
  std::ifstream f(kGoldenDir + name, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

std::vector<float> ReadFloats(const std::string& name) {
  const std::vector<uint8_t> bytes = ReadFile(name);
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

struct Case {
  GgmlType type;
  const char* name;
};

class DequantGoldenTest : public ::testing::TestWithParam<Case> {};

TEST_P(DequantGoldenTest, MatchesGgufBitForBit) {
  const Case& c = GetParam();
  const std::vector<uint8_t> blocks = ReadFile(std::string(c.name) + ".blocks");
  const std::vector<float> want = ReadFloats(std::string(c.name) + ".dequant.f32");
  ASSERT_EQ(want.size(), static_cast<size_t>(kN)) << "missing golden for " << c.name
                                                  << " (run from the source root)";
  ASSERT_EQ(blocks.size(), GgmlRowBytes(c.type, kN));
  std::vector<float> got(kN, -1.0f);
  ASSERT_TRUE(DequantizeRow(c.type, blocks.data(), got.data(), kN).ok());
  int mismatches = 0;
  for (int i = 0; i < kN; ++i) {
    if (FloatToBits(got[i]) != FloatToBits(want[i]) && ++mismatches <= 5)
      ADD_FAILURE() << c.name << " element " << i << ": got " << got[i] << " want " << want[i];
  }
  EXPECT_EQ(mismatches, 0);

  // Any whole number of blocks works as a row: the second half alone gives the same values.
  const GgmlTypeInfo* info = GetGgmlTypeInfo(c.type);
  std::vector<float> half(kN / 2);
  ASSERT_TRUE(DequantizeRow(c.type, blocks.data() + blocks.size() / 2, half.data(), kN / 2).ok());
  EXPECT_EQ(0, std::memcmp(half.data(), got.data() + kN / 2, half.size() * 4));
  if (info->block_size > 1) {
    EXPECT_FALSE(DequantizeRow(c.type, blocks.data(), got.data(), info->block_size + 1).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, DequantGoldenTest,
    ::testing::Values(Case{GgmlType::kF32, "F32"}, Case{GgmlType::kF16, "F16"},
                      Case{GgmlType::kBF16, "BF16"}, Case{GgmlType::kQ8_0, "Q8_0"},
                      Case{GgmlType::kQ4_0, "Q4_0"}, Case{GgmlType::kQ4_1, "Q4_1"},
                      Case{GgmlType::kQ5_0, "Q5_0"}, Case{GgmlType::kQ5_1, "Q5_1"},
                      Case{GgmlType::kQ4_K, "Q4_K"}, Case{GgmlType::kQ6_K, "Q6_K"},
                      Case{GgmlType::kQ2_K, "Q2_K"}, Case{GgmlType::kQ3_K, "Q3_K"},
                      Case{GgmlType::kQ5_K, "Q5_K"}, Case{GgmlType::kIQ4_NL, "IQ4_NL"},
                      Case{GgmlType::kIQ4_XS, "IQ4_XS"}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

using QuantizeFn = void (*)(const float*, void*, int64_t);

void ExpectQuantizerMatches(QuantizeFn fn, GgmlType type, const char* name) {
  const std::vector<float> x = ReadFloats("input.f32");
  ASSERT_EQ(x.size(), static_cast<size_t>(kN));
  const std::vector<uint8_t> want = ReadFile(std::string(name) + ".blocks");
  std::vector<uint8_t> got(GgmlRowBytes(type, kN), 0xAA);
  ASSERT_EQ(got.size(), want.size());
  fn(x.data(), got.data(), kN);
  const int block_bytes = GetGgmlTypeInfo(type)->block_bytes;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << name << " byte " << i << " (block " << i / block_bytes
                               << ", offset " << i % block_bytes << ")";
  }
}

TEST(QuantizeTest, Q4_0MatchesGguf) { ExpectQuantizerMatches(QuantizeRowQ4_0, GgmlType::kQ4_0, "Q4_0"); }
TEST(QuantizeTest, Q4_1MatchesGguf) { ExpectQuantizerMatches(QuantizeRowQ4_1, GgmlType::kQ4_1, "Q4_1"); }
TEST(QuantizeTest, Q8_0MatchesGguf) { ExpectQuantizerMatches(QuantizeRowQ8_0, GgmlType::kQ8_0, "Q8_0"); }

TEST(QuantizeTest, Q8_1IsQ8_0PlusSum) {
  const std::vector<float> x = ReadFloats("input.f32");
  ASSERT_EQ(x.size(), static_cast<size_t>(kN));
  std::vector<uint8_t> q8_0(GgmlRowBytes(GgmlType::kQ8_0, kN));
  std::vector<uint8_t> q8_1(GgmlRowBytes(GgmlType::kQ8_1, kN));
  QuantizeRowQ8_0(x.data(), q8_0.data(), kN);
  QuantizeRowQ8_1(x.data(), q8_1.data(), kN);
  for (int b = 0; b < kN / 32; ++b) {
    const uint8_t* a = q8_0.data() + 34 * b;
    const uint8_t* c = q8_1.data() + 36 * b;
    EXPECT_EQ(0, std::memcmp(a, c, 2)) << "block " << b;            // d
    EXPECT_EQ(0, std::memcmp(a + 2, c + 4, 32)) << "block " << b;   // qs
    int sum = 0;
    for (int j = 0; j < 32; ++j) sum += static_cast<int8_t>(c[4 + j]);
    uint16_t d_bits, s_bits;
    std::memcpy(&d_bits, c, 2);
    std::memcpy(&s_bits, c + 2, 2);
    // ggml: s = d * sum with d the unrounded float scale, so compare in fp16 with slack.
    EXPECT_NEAR(Fp16ToFloat(s_bits), Fp16ToFloat(d_bits) * sum,
                std::fabs(Fp16ToFloat(d_bits) * sum) * 2e-3 + 1e-6)
        << "block " << b;
  }
}

TEST(DequantTest, Q8_1IsRefused) {
  std::vector<uint8_t> block(36, 0);
  float out[32];
  EXPECT_FALSE(DequantizeRow(GgmlType::kQ8_1, block.data(), out, 32).ok());
}

TEST(DequantTest, UnknownTypeIsRefused) {
  float out[1];
  const uint8_t in[4] = {};
  EXPECT_FALSE(DequantizeRow(static_cast<GgmlType>(99), in, out, 1).ok());
}

}  // namespace
}  // namespace tinyserve
