#include "kernels/cpu/weight_convert.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/fp16.h"
#include "kernels/cpu/dequant.h"

namespace tinyserve {
namespace {

float LoadF16(const uint8_t* p) {
  fp16_t h;
  std::memcpy(&h, p, 2);
  return Fp16ToFloat(h);
}

// Stores f as fp16; false when it does not fit.
bool StoreF16(uint8_t* p, float f) {
  const fp16_t h = FloatToFp16(f);
  std::memcpy(p, &h, 2);
  return std::isfinite(Fp16ToFloat(h));
}

// One Q8_0 block from a fp16 scale and 32 int8 codes.
bool Q8Block(float d, const int8_t* q, uint8_t* out) {
  std::memcpy(out + 2, q, 32);
  return StoreF16(out, d);
}

bool Q5_0ToQ8_0(const uint8_t* b, uint8_t* out) {
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  int8_t q[32];
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>(((qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16);
    q[j + 16] = static_cast<int8_t>(((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
  }
  std::memcpy(out, b, 2);  // the same fp16 scale
  std::memcpy(out + 2, q, 32);
  return true;
}

bool Iq4NlToQ8_0(const uint8_t* b, uint8_t* out) {
  const uint8_t* qs = b + 2;
  int8_t q[32];
  for (int j = 0; j < 16; ++j) {
    q[j] = kIq4nlValues[qs[j] & 0xF];
    q[j + 16] = kIq4nlValues[qs[j] >> 4];
  }
  std::memcpy(out, b, 2);
  std::memcpy(out + 2, q, 32);
  return true;
}

// 8 Q4_1 blocks from one Q4_K super-block.
bool Q4_KToQ4_1(const uint8_t* b, uint8_t* out) {
  const float d = LoadF16(b), dmin = LoadF16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  bool ok = true;
  for (int s = 0; s < 8; ++s, out += 20) {
    int sc, mn;
    ScaleMinK4(s, scales, &sc, &mn);
    ok &= StoreF16(out, d * static_cast<float>(sc));
    ok &= StoreF16(out + 2, -(dmin * static_cast<float>(mn)));
    // Sub-block s is the low (even s) or high (odd s) nibbles of qs[32·(s / 2) + l].
    const uint8_t* src = qs + 32 * (s / 2);
    const int shift = 4 * (s % 2);
    for (int j = 0; j < 16; ++j)
      out[4 + j] =
          static_cast<uint8_t>(((src[j] >> shift) & 0xF) | (((src[j + 16] >> shift) & 0xF) << 4));
  }
  return ok;
}

// 8 Q8_0 blocks from one IQ4_XS super-block.
bool Iq4XsToQ8_0(const uint8_t* b, uint8_t* out) {
  const float d = LoadF16(b);
  uint16_t scales_h;
  std::memcpy(&scales_h, b + 2, 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  bool ok = true;
  for (int ib = 0; ib < 8; ++ib, qs += 16, out += 34) {
    const int ls =
        ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
    int8_t q[32];
    for (int j = 0; j < 16; ++j) {
      q[j] = kIq4nlValues[qs[j] & 0xF];
      q[j + 16] = kIq4nlValues[qs[j] >> 4];
    }
    ok &= Q8Block(d * static_cast<float>(ls - 32), q, out);
  }
  return ok;
}

}  // namespace

bool WeightConversionEnabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("TINYSERVE_WEIGHTS_EXACT");
    return env == nullptr || std::string(env) != "1";
  }();
  return enabled;
}

GgmlType ConvertedType(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_K:
      return GgmlType::kQ4_1;
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kIQ4_NL:
    case GgmlType::kIQ4_XS:
      return GgmlType::kQ8_0;
    default:
      return type;
  }
}

bool ConvertRow(GgmlType type, const uint8_t* src, uint8_t* dst, int64_t n) {
  const GgmlTypeInfo* in = GetGgmlTypeInfo(type);
  const GgmlTypeInfo* out = GetGgmlTypeInfo(ConvertedType(type));
  const int64_t nb = n / in->block_size;
  // Bytes written per input block.
  const int64_t out_bytes =
      static_cast<int64_t>(in->block_size / out->block_size) * out->block_bytes;
  bool (*block)(const uint8_t*, uint8_t*) = nullptr;  // one input block's conversion
  switch (type) {
    case GgmlType::kQ5_0:
      block = Q5_0ToQ8_0;
      break;
    case GgmlType::kIQ4_NL:
      block = Iq4NlToQ8_0;
      break;
    case GgmlType::kQ4_K:
      block = Q4_KToQ4_1;
      break;
    case GgmlType::kIQ4_XS:
      block = Iq4XsToQ8_0;
      break;
    default:
      break;
  }
  bool ok = true;
  if (block != nullptr) {
    for (int64_t i = 0; i < nb; ++i) ok &= block(src + i * in->block_bytes, dst + i * out_bytes);
    return ok;
  }
  // Requantized: dequantize, then the reference Q8_0 quantizer (|error| <= amax / 254).
  std::vector<float> row(static_cast<size_t>(n));
  if (!DequantizeRow(type, src, row.data(), n).ok()) return false;
  QuantizeRowQ8_0(row.data(), dst, n);
  for (int64_t b = 0; b < n / 32; ++b) ok &= std::isfinite(LoadF16(dst + 34 * b));
  return ok;
}

}  // namespace tinyserve
