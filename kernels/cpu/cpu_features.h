// File: kernels/cpu/cpu_features.h
// Which SIMD instruction set the CPU matrix kernels use, chosen at run time.
//
// The kernels come in three builds: scalar (any x86-64 or other CPU), AVX2 (AVX2 + FMA + F16C)
// and AVX-512 (F, BW, VL, VNNI). Each SIMD build lives in its own translation unit compiled with
// its own -m flags, so the binary runs on machines without them; this file decides which one is
// safe and wanted. The environment variable TINYSERVE_CPU_ISA=scalar|avx2|avx512 (read once, at
// the first call of ActiveCpuIsa) forces a lower path; asking for more than the CPU has gives
// the best it has.
//
// Thread safety: ActiveCpuIsa may be called from any thread. SetActiveCpuIsa is for tests and
// benchmarks, called while no MatMul runs.
#pragma once

#include <string_view>

namespace tinyserve {

enum class CpuIsa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// The best path this CPU supports (cpuid).
CpuIsa DetectedCpuIsa();
// The path MatMul uses now: the detected one, lowered by TINYSERVE_CPU_ISA or SetActiveCpuIsa.
CpuIsa ActiveCpuIsa();
// Forces a path (clamped to DetectedCpuIsa()); returns the one in effect.
CpuIsa SetActiveCpuIsa(CpuIsa isa);
std::string_view CpuIsaName(CpuIsa isa);

}  // namespace tinyserve
