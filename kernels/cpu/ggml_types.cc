#include "kernels/cpu/ggml_types.h"

namespace tinyserve {

const GgmlTypeInfo* GetGgmlTypeInfo(uint32_t code) {
  static const GgmlTypeInfo kF32{"F32", 1, 4}, kF16{"F16", 1, 2}, kQ4_0{"Q4_0", 32, 18},
      kQ4_1{"Q4_1", 32, 20}, kQ5_0{"Q5_0", 32, 22}, kQ5_1{"Q5_1", 32, 24}, kQ8_0{"Q8_0", 32, 34},
      kQ8_1{"Q8_1", 32, 36}, kQ2_K{"Q2_K", 256, 84}, kQ3_K{"Q3_K", 256, 110},
      kQ4_K{"Q4_K", 256, 144}, kQ5_K{"Q5_K", 256, 176}, kQ6_K{"Q6_K", 256, 210},
      kIQ4_NL{"IQ4_NL", 32, 18}, kIQ4_XS{"IQ4_XS", 256, 136}, kBF16{"BF16", 1, 2};
  switch (static_cast<GgmlType>(code)) {
    case GgmlType::kF32: return &kF32;
    case GgmlType::kF16: return &kF16;
    case GgmlType::kQ4_0: return &kQ4_0;
    case GgmlType::kQ4_1: return &kQ4_1;
    case GgmlType::kQ5_0: return &kQ5_0;
    case GgmlType::kQ5_1: return &kQ5_1;
    case GgmlType::kQ8_0: return &kQ8_0;
    case GgmlType::kQ8_1: return &kQ8_1;
    case GgmlType::kQ2_K:
      return &kQ2_K;
    case GgmlType::kQ3_K:
      return &kQ3_K;
    case GgmlType::kQ4_K: return &kQ4_K;
    case GgmlType::kQ5_K:
      return &kQ5_K;
    case GgmlType::kQ6_K: return &kQ6_K;
    case GgmlType::kIQ4_NL:
      return &kIQ4_NL;
    case GgmlType::kIQ4_XS:
      return &kIQ4_XS;
    case GgmlType::kBF16: return &kBF16;
  }
  return nullptr;
}

std::string_view GgmlTypeName(GgmlType t) {
  const GgmlTypeInfo* info = GetGgmlTypeInfo(t);
  return info ? info->name : "unknown";
}

size_t GgmlRowBytes(GgmlType t, int64_t n) {
  const GgmlTypeInfo* info = GetGgmlTypeInfo(t);
  return static_cast<size_t>(n / info->block_size) * info->block_bytes;
}

}  // namespace tinyserve
