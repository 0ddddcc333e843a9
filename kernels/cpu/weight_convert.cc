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

// 8 Q4_1 (Q5_1) blocks from one Q4_K (Q5_K) super-block: per 32-element sub-block s, the scale
// d·sc and minimum −dmin·m each rounded once to fp16, and the file's codes: element l of s is
// nibble s % 2 of qs[32·(s / 2) + l], with its fifth bit (Q5_K) bit s of qh[l].
template <bool kQ5>
bool KQuantToType1(const uint8_t* b, uint8_t* out) {
  const float d = LoadF16(b), dmin = LoadF16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;  // Q5_K only
  const uint8_t* qs = b + (kQ5 ? 48 : 16);
  constexpr int kOutBytes = kQ5 ? 24 : 20, kOutQs = kQ5 ? 8 : 4;
  bool ok = true;
  for (int s = 0; s < 8; ++s, out += kOutBytes) {
    int sc, mn;
    ScaleMinK4(s, scales, &sc, &mn);
    ok &= StoreF16(out, d * static_cast<float>(sc));
    ok &= StoreF16(out + 2, -(dmin * static_cast<float>(mn)));
    const uint8_t* src = qs + 32 * (s / 2);
    const int shift = 4 * (s % 2);
    if constexpr (kQ5) {
      uint32_t bits = 0;
      for (int l = 0; l < 32; ++l) bits |= static_cast<uint32_t>((qh[l] >> s) & 1) << l;
      std::memcpy(out + 4, &bits, 4);
    }
    for (int j = 0; j < 16; ++j)
      out[kOutQs + j] =
          static_cast<uint8_t>(((src[j] >> shift) & 0xF) | (((src[j + 16] >> shift) & 0xF) << 4));
  }
  return ok;
}

// 8 IQ4_NL blocks from one IQ4_XS super-block: the same nibbles, the scale d·(ls − 32) in fp16.
bool Iq4XsToIq4Nl(const uint8_t* b, uint8_t* out) {
  const float d = LoadF16(b);
  uint16_t scales_h;
  std::memcpy(&scales_h, b + 2, 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  bool ok = true;
  for (int ib = 0; ib < 8; ++ib, qs += 16, out += 18) {
    const int ls =
        ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
    ok &= StoreF16(out, d * static_cast<float>(ls - 32));
    std::memcpy(out + 2, qs, 16);
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
    case GgmlType::kQ5_K:
      return GgmlType::kQ5_1;
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ6_K:
      return GgmlType::kQ8_0;
    case GgmlType::kIQ4_XS:
      return GgmlType::kIQ4_NL;
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
    case GgmlType::kQ5_K:
      block = KQuantToType1<true>;
      break;
    case GgmlType::kQ4_K:
      block = KQuantToType1<false>;
      break;
    case GgmlType::kIQ4_XS:
      block = Iq4XsToIq4Nl;
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
