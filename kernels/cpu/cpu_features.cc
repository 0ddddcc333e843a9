#include "kernels/cpu/cpu_features.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include "common/log.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace tinyserve {
namespace {

#if defined(__x86_64__) && defined(TINYSERVE_AMX_KERNELS)
// AMX-TILE, AMX-BF16 and AVX512-BF16 in cpuid, the tile state enabled in XCR0 (bits 17, 18), and
// the tile data state granted to this process (Linux 5.16+; without it the first tile
// instruction faults).
bool AmxUsable() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if ((d & (1u << 24)) == 0 || (d & (1u << 22)) == 0) return false;  // AMX-TILE, AMX-BF16
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || (a & (1u << 5)) == 0)
    return false;                                                              // AVX512-BF16
  if (!__get_cpuid(1, &a, &b, &c, &d) || (c & (1u << 27)) == 0) return false;  // OSXSAVE
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0x60000u) != 0x60000u) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

#if defined(__x86_64__) || defined(__i386__)
// F16C from cpuid (leaf 1, ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c".
bool HasF16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}
#endif

CpuIsa Detect() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512vnni");
#if defined(TINYSERVE_AMX_KERNELS)
  if (avx512 && AmxUsable()) return CpuIsa::kAmx;
#endif
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
  } else if (v == "amx") {
    want = CpuIsa::kAmx;
  } else {
    TS_LOG(WARNING) << "TINYSERVE_CPU_ISA=" << v << " not understood (scalar, avx2, avx512, amx)";
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
    case CpuIsa::kAmx:
      return "amx";
  }
  return "?";
}

}  // namespace tinyserve
