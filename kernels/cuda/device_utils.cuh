// File: kernels/cuda/device_utils.cuh
// Small device helpers shared by the attention kernels: cp.async 16-byte copies (sm_80+), warp
// reductions, a block-wide exclusive scan and the float -> ordered-uint32 key used by radix select.
// Under TS_CUDA_EMU (kernels/cuda/emu/cuda_emu.h, CPU tests) cp.async goes to the emulator.
#pragma once

#include <cstdint>
#include <cstring>

namespace tinyserve::cuda {

// Copies 16 bytes global -> shared asynchronously; src_bytes = 0 writes 16 zero bytes instead
// (no global read happens, but src must still be a valid address).
#ifdef TS_CUDA_EMU
__device__ inline void CpAsync16(void* smem_dst, const void* gmem_src, int src_bytes) {
  ts_emu::CpAsync16(smem_dst, gmem_src, src_bytes);
}
__device__ inline void CpAsyncCommit() { ts_emu::CpAsyncCommit(); }
template <int kPending>
__device__ inline void CpAsyncWait() {
  ts_emu::CpAsyncWait(kPending);
}
#else
__device__ inline void CpAsync16(void* smem_dst, const void* gmem_src, int src_bytes) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes));
}
__device__ inline void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ inline void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}
#endif

// The running kernel's dynamic shared memory as `type* name`.
#ifdef TS_CUDA_EMU
#define TS_DYNAMIC_SMEM(type, name) type* name = reinterpret_cast<type*>(::ts_emu::DynamicSmem())
#else
#define TS_DYNAMIC_SMEM(type, name)                                       \
  extern __shared__ __align__(16) unsigned char name##_dynamic_smem_[]; \
  type* name = reinterpret_cast<type*>(name##_dynamic_smem_)
#endif

__device__ inline float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ inline float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Sum over aligned groups of kLanes consecutive lanes (all 32 lanes must call).
template <int kLanes>
__device__ inline float GroupSum(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Exclusive prefix sum of v over the block (blockDim.x a multiple of 32, <= 1024); *total gets
// the block sum. scratch: 33 ints of shared memory. Every thread must call.
__device__ inline int BlockExclusiveScan(int v, int* total, int* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0;
    for (int w = 0; w < nwarps; ++w) {
      const int t = scratch[w];
      scratch[w] = run;
      run += t;
    }
    scratch[32] = run;
  }
  __syncthreads();
  const int result = scratch[warp] + incl - v;
  *total = scratch[32];
  __syncthreads();  // scratch may be reused by the next call
  return result;
}

// Monotone map float -> uint32 (a < b implies key(a) < key(b)); NaN maps to 0 (below -inf).
__host__ __device__ inline uint32_t OrderedKey(float f) {
  if (f != f) return 0u;
#if defined(__CUDA_ARCH__)
  const uint32_t u = __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
#endif
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Radix select over n keys in shared or global memory, by the whole block (blockDim.x a multiple
// of 32). REQUIRES 1 <= k <= n. On return (in every thread) *threshold is the k-th largest key and
// *need_eq the number of keys equal to it that belong to the top k (>= 1): the top k are the keys
// > threshold plus the first need_eq keys == threshold in whichever order the caller chooses.
__device__ inline void BlockRadixSelect(const uint32_t* keys, int n, int k, uint32_t* threshold,
                                        int* need_eq) {
  __shared__ int hist[256];
  __shared__ uint32_t s_prefix;
  __shared__ int s_remaining;
  const int lane = threadIdx.x & 31;
  uint32_t prefix = 0, mask = 0;
  int remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    // Warp-aggregated counts: scores of one magnitude share their top key bits, so without this
    // most lanes of a warp hit the same bin and their shared atomics serialise.
    for (int base = 0; base < n; base += blockDim.x) {  // warp-uniform trip count
      const int i = base + threadIdx.x;
      const uint32_t key = i < n ? keys[i] : 0u;
      const bool hit = i < n && (key & mask) == prefix;
      const uint32_t bin = (key >> shift) & 255u;
      const unsigned peers = __match_any_sync(0xffffffffu, hit ? bin : 0xffffffffu);
      if (hit && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l owns bins 255-8l down to 248-8l: lane order is descending key order.
      int cnt[8], s = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        cnt[e] = hist[255 - 8 * lane - e];
        s += cnt[e];
      }
      int incl = s;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      const unsigned hit = __ballot_sync(0xffffffffu, incl >= remaining);
      if (lane == __ffs(hit) - 1) {
        int above = incl - s;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if (above + cnt[e] >= remaining) {
            s_prefix = prefix | (static_cast<uint32_t>(255 - 8 * lane - e) << shift);
            s_remaining = remaining - above;
            break;
          }
          above += cnt[e];
        }
      }
    }
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    mask |= 255u << shift;
  }
  *threshold = prefix;
  *need_eq = remaining;
  __syncthreads();  // s_prefix / hist may be reused by a later call
}

}  // namespace tinyserve::cuda
