// File: kernels/cpu/cpu_features.h
// Which SIMD instruction set the CPU matrix kernels use, chosen at run time.
//
// The kernels come in four builds: scalar (any x86-64 or other CPU), AVX2 (AVX2 + FMA + F16C),
// AVX-512 (F, BW, VL, VNNI) and AMX (AVX-512 plus the AMX-BF16 tile unit of Sapphire Rapids and
// later Xeons, for products of many tokens, in bf16; fewer tokens still take the AVX-512 kernels).
// Each SIMD build lives in its own translation unit compiled with its own -m flags, so the binary
// runs on machines without them; this file decides which one is safe and wanted. AMX counts as
// present only when cpuid reports it, the OS enables its register state (XCR0) and Linux grants
// this process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM). The environment variable
// TINYSERVE_CPU_ISA=scalar|avx2|avx512|amx (read once, at the first call of ActiveCpuIsa) forces
// a lower path; asking for more than the CPU has gives the best it has.
//
// Thread safety: ActiveCpuIsa may be called from any thread. SetActiveCpuIsa is for tests and
// benchmarks, called while no MatMul runs.
#pragma once

#include <string_view>

namespace tinyserve {

enum class CpuIsa { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };

// The best path this CPU supports (cpuid).
CpuIsa DetectedCpuIsa();
// The path MatMul uses now: the detected one, lowered by TINYSERVE_CPU_ISA or SetActiveCpuIsa.
CpuIsa ActiveCpuIsa();
// Forces a path (clamped to DetectedCpuIsa()); returns the one in effect.
CpuIsa SetActiveCpuIsa(CpuIsa isa);
std::string_view CpuIsaName(CpuIsa isa);

}  // namespace tinyserve
