#include "kernels/cpu/cpu_features.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include "common/log.h"

namespace tinyserve {
namespace {

CpuIsa Detect() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512vnni");
  if (avx512) return CpuIsa::kAvx512;
  if (avx2) return CpuIsa::kAvx2;
#endif
  return CpuIsa::kScalar;
}

CpuIsa FromEnv(CpuIsa detected) {
  const char* env = std::getenv("TINYSERVE_CPU_ISA");
  if (env == nullptr || *env == '\0') return detected;
  const std::string v(env);
  CpuIsa want = detected;
  if (v == "scalar") {
    want = CpuIsa::kScalar;
  } else if (v == "avx2") {
    want = CpuIsa::kAvx2;
  } else if (v == "avx512") {
    want = CpuIsa::kAvx512;
  } else {
    TS_LOG(WARNING) << "TINYSERVE_CPU_ISA=" << v << " not understood (scalar, avx2, avx512)";
  }
  return std::min(want, detected);
}

std::atomic<int>& ActiveSlot() {
  static std::atomic<int> slot{static_cast<int>(FromEnv(DetectedCpuIsa()))};
  return slot;
}

}  // namespace

CpuIsa DetectedCpuIsa() {
  static const CpuIsa detected = Detect();
  return detected;
}

CpuIsa ActiveCpuIsa() { return static_cast<CpuIsa>(ActiveSlot().load(std::memory_order_relaxed)); }

CpuIsa SetActiveCpuIsa(CpuIsa isa) {
  const CpuIsa effective = std::min(isa, DetectedCpuIsa());
  ActiveSlot().store(static_cast<int>(effective), std::memory_order_relaxed);
  return effective;
}

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

}  // namespace tinyserve
