// The tensor-core attend kernel (AttendKernel::kTensorCores). Same grid, page lists, split ranges
// and partial outputs as the CUDA-core kernel in decode_attention.cu, so selection and merge are
// shared; only the way a CTA turns its K/V tiles into (o, m, l) differs.
//
// Why: decode attention reads each K/V element once and does 2G flops with it (G = GQA group).
// On CUDA cores every element costs a conversion to fp32, FMAs and shuffles, which kept the
// CUDA-core kernel at 38-46 % of copy bandwidth on an H200. Here the products run on the tensor
// cores straight from the 16-bit tiles (FlashInfer's decode-with-tensor-cores layout):
//
//   S[16 x T] = Q[16 x d] K^T   mma.m16n8k16, the group's query heads are rows 0..G-1 of M
//                               (rows G..15 are zero), K tiles are the "col" B operand
//   online softmax on S's accumulator fragments (row max over the 4 lanes of a quad)
//   O[16 x d] += P[16 x T] V    P rounded to the cache dtype, reused from S's fragments as the
//                               A operand (FlashAttention-2's register layout); V through
//                               ldmatrix.trans
//
// Each of the 4 warps runs its own cp.async pipeline over every 4th tile of the CTA's token range
// and keeps its own (m, l, O): there is no block barrier in the loop. The warps' states are merged
// through shared memory at the end. Tiles are T = 2048/d tokens (4 KB of K and 4 KB of V per
// stage), 3 stages per warp: 96 KB of shared memory, 2 CTAs per SM. Rows are stored with their
// 16-byte chunks XOR-swizzled by (row % 8), so ldmatrix's 8 row reads hit 8 different bank groups.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with 16-bit inputs; g = lane / 4, t = lane % 4):
//   A (4 x b32): a0 = (row g, k 2t..2t+1), a1 = (row g+8, same k), a2 = (row g, k 2t+8..+9),
//                a3 = (row g+8, k 2t+8..+9)
//   B (2 x b32): b0 = (k 2t..2t+1, col g), b1 = (k 2t+8..+9, col g)
//   C (4 x f32): c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g+8, cols 2t, 2t+1)
//   the lower 16 bits of a b32 hold the element of the lower k (or column) index.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/decode_internal.cuh"
#include "kernels/cuda/device_utils.cuh"

namespace tinyserve::cuda::internal {
namespace {

#ifdef TS_CUDA_EMU
// The CPU emulator's versions (kernels/cuda/emu/cuda_emu.h).
template <typename T>
inline void Mma16816(float (&c)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  const uint32_t a[4] = {a0, 0u, a2, 0u};
  ts_emu::Mma16816<T>(c, a, b0, b1);
}
template <bool kTrans>
inline void LdMatrixX4(uint32_t (&r)[4], const void* row) {
  ts_emu::LdMatrixX4(r, row, kTrans);
}
#else
template <typename T>
__device__ inline void Mma16816(float (&c)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1);

// Rows 8..15 of A are the zero padding of the query group: a1 = a3 = 0.
template <>
__device__ inline void Mma16816<__half>(float (&c)[4], uint32_t a0, uint32_t a2, uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
template <>
__device__ inline void Mma16816<__nv_bfloat16>(float (&c)[4], uint32_t a0, uint32_t a2,
                                               uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

// Four 8x8 16-bit matrices from shared memory; lanes 8i..8i+7 give the row addresses of matrix i,
// register i receives matrix i (transposed with kTrans).
template <bool kTrans>
__device__ inline void LdMatrixX4(uint32_t (&r)[4], const void* row) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
  }
}
#endif

template <typename T>
__device__ inline uint32_t PackPair(float lo, float hi) {
  uint32_t u;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&u, &h, 4);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    memcpy(&u, &h, 4);
  }
  return u;
}

template <typename T, int kD>
struct MmaTile {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kTokens = 2048 / kD;           // per warp tile: 4 KB of K, 4 KB of V
  static constexpr int kStages = 3;                   // per warp
  static constexpr int kChunks = kD / 8;              // 16-byte chunks per row
  static constexpr int kStageElems = kTokens * kD;
  static constexpr int kWarpElems = 2 * kStages * kStageElems;
  static constexpr size_t kSmemBytes = sizeof(T) * kWarps * kWarpElems;
  static constexpr int kSTiles = kTokens / 8;         // n-tiles of S (8 tokens each)
  static constexpr int kQSteps = kD / 16;             // k-steps of Q K^T
  static constexpr int kOTiles = kD / 8;              // n-tiles of O (8 channels each)
  static constexpr int kPSteps = kTokens / 16;        // k-steps of P V
  static_assert(kTokens % 16 == 0 && kQSteps % 2 == 0 && kOTiles % 2 == 0, "tile shape");
  static_assert(kChunks >= 8, "the swizzle permutes 8 chunks");
  static_assert(sizeof(float) * kWarps * kMaxGqaGroup * (kD + 2) <= kSmemBytes,
                "the final cross-warp merge reuses the stage buffers");
};

// Element offset of (row, 16-byte chunk) in a swizzled [rows][kD] tile.
template <int kChunks>
__device__ inline int Swz(int row, int chunk) {
  return (row * kChunks + (chunk ^ (row & 7))) * 8;
}

template <typename T, int kD>
__global__ void __launch_bounds__(MmaTile<T, kD>::kThreads, 2)
    PagedAttendMmaKernel(const AttendArgs a) {
  using Tile = MmaTile<T, kD>;
  constexpr int kC = Tile::kChunks;
  TS_DYNAMIC_SMEM(unsigned char, smem);
  const int split = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int qg = lane / 4, qt = lane % 4;  // fragment row group and thread-in-group
  T* ks = reinterpret_cast<T*>(smem) + warp * Tile::kWarpElems;  // [kStages][kTokens][kD]
  T* vs = ks + Tile::kStages * Tile::kStageElems;                // [kStages][kTokens][kD]

  const int G = a.group, hkv = a.layout.num_kv_heads, hq = hkv * G;
  const int P = a.layout.page_size, log2p = Log2Pow2(P);
  // This split's entries [p0, p1) of the list are tokens [t0, t1) of the concatenated list.
  // Tiles map tokens, not pages, so the split size needs no rounding (rounding it to whole CTA
  // tiles left up to a quarter of the chosen splits empty).
  const SplitShare sh = AttendShare(a, b, g, split, 1);
  const int32_t* list = sh.list;
  const int t0 = sh.p0 << log2p;
  const int t1 = sh.p0 >= sh.p1 ? t0
                 : sh.p1 == sh.count ? ((sh.count - 1) << log2p) + sh.last_valid
                                     : sh.p1 << log2p;
  const int tiles = (t1 - t0 + Tile::kTokens - 1) / Tile::kTokens;
  const int mine = tiles > warp ? (tiles - warp + Tile::kWarps - 1) / Tile::kWarps : 0;
  // Tile i of this warp covers tokens [start(i), start(i) + kTokens); tokens >= t1 are masked.
  auto start = [&](int i) { return t0 + (warp + i * Tile::kWarps) * Tile::kTokens; };
  auto load_tile = [&](int i, int stage) {
    const T* kc = static_cast<const T*>(a.k_cache);
    const T* vc = static_cast<const T*>(a.v_cache);
    T* kd = ks + stage * Tile::kStageElems;
    T* vd = vs + stage * Tile::kStageElems;
    const int ts = start(i);
#pragma unroll
    for (int id = lane; id < Tile::kTokens * kC; id += 32) {
      const int r = id / kC, cc = id % kC, t = ts + r;
      const bool ok = t < t1;
      // Invalid rows are zero-filled, never read: stale slots may hold anything, even NaN.
      const int64_t off =
          ok ? a.layout.KvOffset(list[t >> log2p], g, t & (P - 1)) + cc * 8 : 0;
      CpAsync16(kd + Swz<kC>(r, cc), kc + off, ok ? 16 : 0);
      CpAsync16(vd + Swz<kC>(r, cc), vc + off, ok ? 16 : 0);
    }
  };

  // Q as A fragments: row qg is query head g*G + qg (zero for qg >= G).
  uint32_t qa[Tile::kQSteps][2];
  {
    const T* q = static_cast<const T*>(a.q) + b * a.q_stride + (g * G + qg) * kD + 2 * qt;
#pragma unroll
    for (int s = 0; s < Tile::kQSteps; ++s) {
      qa[s][0] = qg < G ? *reinterpret_cast<const uint32_t*>(q + 16 * s) : 0u;
      qa[s][1] = qg < G ? *reinterpret_cast<const uint32_t*>(q + 16 * s + 8) : 0u;
    }
  }
  float o[Tile::kOTiles][4];
#pragma unroll
  for (int j = 0; j < Tile::kOTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_run = -INFINITY;  // running max of row qg (log2 units), equal across the quad
  float l_run = 0.f;        // this thread's share of row qg's running sum

#pragma unroll
  for (int s = 0; s < Tile::kStages - 1; ++s) {
    if (s < mine) load_tile(s, s);
    CpAsyncCommit();
  }
  for (int i = 0; i < mine; ++i) {
    const int ahead = i + Tile::kStages - 1;
    if (ahead < mine) load_tile(ahead, ahead % Tile::kStages);
    CpAsyncCommit();  // possibly empty: keeps the group count in step with i
    CpAsyncWait<Tile::kStages - 1>();
    __syncwarp();  // every lane's copies of tile i are visible to the whole warp
    const T* kt = ks + (i % Tile::kStages) * Tile::kStageElems;
    const T* vt = vs + (i % Tile::kStages) * Tile::kStageElems;

    // S = Q K^T: n-tile j is tokens 8j..8j+7; one ldmatrix.x4 gives the B fragments of two
    // k-steps (chunks 4s..4s+3 of the 8 token rows).
    float sc[Tile::kSTiles][4];
#pragma unroll
    for (int j = 0; j < Tile::kSTiles; ++j) {
      sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
      const int row = 8 * j + (lane & 7);
#pragma unroll
      for (int s = 0; s < Tile::kQSteps / 2; ++s) {
        uint32_t kb[4];
        LdMatrixX4<false>(kb, kt + Swz<kC>(row, 4 * s + (lane >> 3)));
        Mma16816<T>(sc[j], qa[2 * s][0], qa[2 * s][1], kb[0], kb[1]);
        Mma16816<T>(sc[j], qa[2 * s + 1][0], qa[2 * s + 1][1], kb[2], kb[3]);
      }
    }

    // Online softmax on row qg: this thread holds tokens 8j + 2qt + {0, 1}.
    const int ts = start(i);
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < Tile::kSTiles; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float s = ts + 8 * j + 2 * qt + e < t1 ? sc[j][e] * a.scale_log2 : -INFINITY;
        sc[j][e] = s;
        mx = fmaxf(mx, s);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_run, mx);
    // While every score so far is masked m_new is -inf; subtracting 0 instead keeps
    // 2^(-inf - m) at 0 rather than NaN (the accumulators are still 0 then).
    const float m_ref = m_new == -INFINITY ? 0.f : m_new;
    const float alpha = exp2f(m_run - m_ref);
    m_run = m_new;
    l_run *= alpha;
#pragma unroll
    for (int j = 0; j < Tile::kOTiles; ++j) {
      o[j][0] *= alpha;
      o[j][1] *= alpha;
    }
    uint32_t pa[Tile::kSTiles];  // P of row qg as A halves: tokens 8j + 2qt + {0, 1}
#pragma unroll
    for (int j = 0; j < Tile::kSTiles; ++j) {
      const float e0 = exp2f(sc[j][0] - m_ref), e1 = exp2f(sc[j][1] - m_ref);
      l_run += e0 + e1;
      pa[j] = PackPair<T>(e0, e1);
    }

    // O += P V: k-step kk is tokens 16kk..16kk+15 (A = P n-tiles 2kk, 2kk+1); one
    // ldmatrix.x4.trans gives the B fragments of two 8-channel n-tiles.
#pragma unroll
    for (int kk = 0; kk < Tile::kPSteps; ++kk) {
      const int row = 16 * kk + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
      for (int c = 0; c < Tile::kOTiles / 2; ++c) {
        uint32_t vb[4];
        LdMatrixX4<true>(vb, vt + Swz<kC>(row, 2 * c + (lane >> 4)));
        Mma16816<T>(o[2 * c], pa[2 * kk], pa[2 * kk + 1], vb[0], vb[1]);
        Mma16816<T>(o[2 * c + 1], pa[2 * kk], pa[2 * kk + 1], vb[2], vb[3]);
      }
    }
    __syncwarp();  // every lane is done with this stage before the next copy overwrites it
  }
  CpAsyncWait<0>();
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  __syncthreads();  // every warp is done with its stages: reuse them for the merge

  // Merge the warps: M = max_w m_w, o = sum_w 2^(m_w - M) o_w, l likewise.
  float* red = reinterpret_cast<float*>(smem);              // [kWarps][kMaxGqaGroup][kD]
  float* wm = red + Tile::kWarps * kMaxGqaGroup * kD;       // [kWarps][kMaxGqaGroup]
  float* wl = wm + Tile::kWarps * kMaxGqaGroup;             // [kWarps][kMaxGqaGroup]
  if (qg < G) {
    float* dst = red + (warp * kMaxGqaGroup + qg) * kD + 2 * qt;
#pragma unroll
    for (int j = 0; j < Tile::kOTiles; ++j)
      *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[j][0], o[j][1]);
    if (qt == 0) {
      wm[warp * kMaxGqaGroup + qg] = m_run;
      wl[warp * kMaxGqaGroup + qg] = l_run;
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * kD; idx += Tile::kThreads) {
    const int j = idx / kD, d = idx % kD;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < Tile::kWarps; ++w) m = fmaxf(m, wm[w * kMaxGqaGroup + j]);
    float s = 0.f, l = 0.f;
#pragma unroll
    for (int w = 0; w < Tile::kWarps; ++w) {
      const float mw = wm[w * kMaxGqaGroup + j];
      if (mw == -INFINITY) continue;  // a warp without tiles
      const float f = exp2f(mw - m);
      s = fmaf(f, red[(w * kMaxGqaGroup + j) * kD + d], s);
      l = fmaf(f, wl[w * kMaxGqaGroup + j], l);
    }
    const int64_t row = (static_cast<int64_t>(b) * hq + g * G + j) * a.splits + split;
    a.partial_o[row * kD + d] = s;
    if (d == 0) {
      a.partial_ml[row * 2] = m;
      a.partial_ml[row * 2 + 1] = l;
    }
  }
}

}  // namespace

template <typename T, int kD>
cudaError_t LaunchAttendMma(const AttendArgs& a, int batch, cudaStream_t stream) {
  using Tile = MmaTile<T, kD>;
  static_assert(2 * Tile::kSmemBytes <= 227 * 1024, "two CTAs per SM");
  // Once per instantiation, outside any later graph capture (see LaunchAttendSimt).
  static const cudaError_t attr = [] {
    cudaError_t e = cudaFuncSetAttribute(PagedAttendMmaKernel<T, kD>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(Tile::kSmemBytes));
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(PagedAttendMmaKernel<T, kD>,
                               cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
    return e;
  }();
  if (attr != cudaSuccess) return attr;
  const dim3 grid(a.splits, a.layout.num_kv_heads, batch);
  LaunchKernel(PagedAttendMmaKernel<T, kD>, grid, Tile::kThreads, Tile::kSmemBytes, stream, a);
  TS_RETURN_LAUNCH_ERROR();
  return cudaSuccess;
}

template cudaError_t LaunchAttendMma<__half, 64>(const AttendArgs&, int, cudaStream_t);
template cudaError_t LaunchAttendMma<__half, 128>(const AttendArgs&, int, cudaStream_t);
template cudaError_t LaunchAttendMma<__nv_bfloat16, 64>(const AttendArgs&, int, cudaStream_t);
template cudaError_t LaunchAttendMma<__nv_bfloat16, 128>(const AttendArgs&, int, cudaStream_t);

}  // namespace tinyserve::cuda::internal
