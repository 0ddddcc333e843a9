// Split-K paged decode attention (the attend and merge kernels) and the two entry points of
// decode_attention.cuh. The attend kernel reads a page list per (sequence, KV head): the page
// table itself (dense) or the selected pages (quest); the last list entry is always the
// sequence's last page, the only one that can be partial.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/decode_attention.cuh"
#include "kernels/cuda/decode_internal.cuh"
#include "kernels/cuda/device_utils.cuh"

namespace tinyserve::cuda {
namespace internal {

// Compile-time tile of the attend kernel.
// \tparam T   cache element type (16-bit)
// \tparam kD  head dim
// \tparam kG  register capacity for the GQA group (4 or 8): the group G <= kG. With kG = 4 each
//             thread owns two 16-byte columns of a row (kVecs = 2), so a row is reduced over half
//             as many lanes and each thread handles half as many rows: 2.7x fewer QK shuffles.
template <typename T, int kD, int kG>
struct AttendTile {
  static constexpr int kThreads = 128;
  static constexpr int kMinCtas = 3;                      // per SM: caps registers at 170
  static constexpr int kVecs = kG <= 4 ? 2 : 1;           // 16-byte columns per thread and row
  static constexpr int kChunks = kD / (8 * kVecs);        // lanes per token row
  static constexpr int kRowGroups = kThreads / kChunks;   // rows processed side by side
  static constexpr int kTileTokens = 4096 / kD;           // 8 KB of K (and of V) per stage
  static constexpr int kRowsPerThread = kTileTokens / kRowGroups;
  static constexpr int kStages = 3;                       // cp.async pipeline depth
  static constexpr int kStageElems = kTileTokens * kD;
  static constexpr size_t kKvBytes = 2ull * kStages * kStageElems * sizeof(T);
  static constexpr size_t kScoreBytes = sizeof(float) * kMaxGqaGroup * kTileTokens;
  static constexpr size_t kSmemBytes = kKvBytes + kScoreBytes + sizeof(float) * 3 * kMaxGqaGroup;
  static_assert(sizeof(T) == 2, "16-bit caches only");
  static_assert(kG == 4 || kG == 8, "group capacity 4 or 8");
  static_assert(kD % (8 * kVecs) == 0 && kThreads % kChunks == 0,
                "a row must split into lane vectors");
  static_assert(kChunks <= 32 && 32 % kChunks == 0, "a row group must sit inside one warp");
  static_assert(kRowsPerThread * kRowGroups == kTileTokens, "rows must split evenly");
  static_assert(sizeof(float) * kRowGroups * kG * kD <= kKvBytes,
                "the final cross-row-group reduction reuses the K/V stage buffers");
};

// One CTA per (split, kv head, sequence): online softmax over its share of the page list for all
// the group's query heads at once, so each K/V tile is loaded once for the group.
// Thread (rg, c): c = lane within a row, rg = row group; it owns the 16-byte columns c + v*kChunks
// (v < kVecs), i.e. elements [8(c + v*kChunks), +8), of the output of every group head, for the
// rows rg, rg + kRowGroups, ... of each tile. Consecutive lanes read consecutive 16-byte vectors.
template <typename T, int kD, int kG>
__global__ void __launch_bounds__(AttendTile<T, kD, kG>::kThreads, AttendTile<T, kD, kG>::kMinCtas)
    PagedAttendKernel(const AttendArgs a) {
  using Tile = AttendTile<T, kD, kG>;
  constexpr int kV = Tile::kVecs, kE = 8 * kV;                   // vectors, elements per thread
  TS_DYNAMIC_SMEM(unsigned char, smem);
  T* ks = reinterpret_cast<T*>(smem);                            // [kStages][kTileTokens][kD]
  T* vs = ks + Tile::kStages * Tile::kStageElems;                // [kStages][kTileTokens][kD]
  float* sc = reinterpret_cast<float*>(smem + Tile::kKvBytes);   // [kMaxGqaGroup][kTileTokens]
  float* m_run = sc + kMaxGqaGroup * Tile::kTileTokens;          // [kMaxGqaGroup]
  float* l_run = m_run + kMaxGqaGroup;                           // [kMaxGqaGroup]
  float* alpha = l_run + kMaxGqaGroup;                           // [kMaxGqaGroup]

  const int split = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, c = tid % Tile::kChunks, rg = tid / Tile::kChunks;
  const int warp = tid / 32, lane = tid % 32;
  const int G = a.group, hkv = a.layout.num_kv_heads, hq = hkv * G;
  const int P = a.layout.page_size, log2p = Log2Pow2(P);
  const int ppt = Tile::kTileTokens >> log2p;  // pages per tile
  const SplitShare sh = AttendShare(a, b, g, split, ppt);
  const int32_t* list = sh.list;
  const int count = sh.count, p0 = sh.p0, p1 = sh.p1, last_valid = sh.last_valid;
  const int ntiles = p0 < p1 ? (p1 - p0 + ppt - 1) / ppt : 0;

  // Row r of tile `it` is slot (r & (P-1)) of list entry p0 + it*ppt + (r >> log2p).
  auto row_valid = [&](int it, int r) {
    const int lp = p0 + it * ppt + (r >> log2p);
    return lp < p1 && (lp < count - 1 || (r & (P - 1)) < last_valid);
  };
  auto load_tile = [&](int it, int stage) {
    const T* kc = static_cast<const T*>(a.k_cache);
    const T* vc = static_cast<const T*>(a.v_cache);
    for (int id = tid; id < Tile::kTileTokens * (kD / 8); id += Tile::kThreads) {
      const int r = id / (kD / 8), cc = id % (kD / 8);
      const bool ok = row_valid(it, r);
      // Invalid rows are zero-filled, never read: stale slots may hold anything, even NaN.
      const int64_t off =
          ok ? a.layout.KvOffset(list[p0 + it * ppt + (r >> log2p)], g, r & (P - 1)) + cc * 8
             : 0;
      const int s_off = stage * Tile::kStageElems + r * kD + cc * 8;
      CpAsync16(ks + s_off, kc + off, ok ? 16 : 0);
      CpAsync16(vs + s_off, vc + off, ok ? 16 : 0);
    }
  };

  // Element e of a thread's kE is column col(e) = 8 * (c + (e / 8) * kChunks) + e % 8.
  auto col = [&](int v) { return 8 * (c + v * Tile::kChunks); };
  float qr[kG][kE];
  float acc[kG][kE];
  {
    const T* q = static_cast<const T*>(a.q) + b * a.q_stride + (g * G) * kD;
#pragma unroll
    for (int j = 0; j < kG; ++j) {
#pragma unroll
      for (int v = 0; v < kV; ++v) {
        float* qv = &qr[j][8 * v];
        if (j < G) {
          Unpack8<T>(*reinterpret_cast<const uint4*>(q + j * kD + col(v)),
                     *reinterpret_cast<float(*)[8]>(qv));
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) qv[e] = 0.f;
        }
      }
#pragma unroll
      for (int e = 0; e < kE; ++e) {
        qr[j][e] *= a.scale_log2;
        acc[j][e] = 0.f;
      }
    }
  }
  if (tid < kMaxGqaGroup) {
    m_run[tid] = -INFINITY;
    l_run[tid] = 0.f;
  }

#pragma unroll
  for (int s = 0; s < Tile::kStages - 1; ++s) {
    if (s < ntiles) load_tile(s, s);
    CpAsyncCommit();
  }
  for (int it = 0; it < ntiles; ++it) {
    const int ahead = it + Tile::kStages - 1;
    if (ahead < ntiles) load_tile(ahead, ahead % Tile::kStages);
    CpAsyncCommit();  // possibly empty: keeps the group count in step with `it`
    CpAsyncWait<Tile::kStages - 1>();
    __syncthreads();
    const T* kt = ks + (it % Tile::kStages) * Tile::kStageElems;
    const T* vt = vs + (it % Tile::kStages) * Tile::kStageElems;

    // Scores (log2 units) of this tile: sc[j][r] = q_j . k_r * scale * log2(e), -inf if masked.
#pragma unroll
    for (int i = 0; i < Tile::kRowsPerThread; ++i) {
      const int r = rg + i * Tile::kRowGroups;
      float kv[kE];
#pragma unroll
      for (int v = 0; v < kV; ++v)
        Unpack8<T>(*reinterpret_cast<const uint4*>(kt + r * kD + col(v)),
                   *reinterpret_cast<float(*)[8]>(&kv[8 * v]));
      const bool ok = row_valid(it, r);
#pragma unroll
      for (int j = 0; j < kG; ++j) {
        if (j < G) {
          float s = 0.f;
#pragma unroll
          for (int e = 0; e < kE; ++e) s = fmaf(qr[j][e], kv[e], s);
          s = GroupSum<Tile::kChunks>(s);
          if (c == 0) sc[j * Tile::kTileTokens + r] = ok ? s : -INFINITY;
        }
      }
    }
    __syncthreads();

    // Online softmax update, one warp per head: new max, rescale factor, p = 2^(s - max).
    for (int j = warp; j < G; j += Tile::kThreads / 32) {
      float* row = sc + j * Tile::kTileTokens;
      float mx = -INFINITY;
      for (int t = lane; t < Tile::kTileTokens; t += 32) mx = fmaxf(mx, row[t]);
      mx = WarpMax(mx);
      const float m_old = m_run[j];
      const float m_new = fmaxf(m_old, mx);
      // While every score so far is masked m_new is -inf; subtracting 0 instead keeps
      // 2^(-inf - m) at 0 rather than NaN (the accumulators are still 0 then).
      const float m_ref = m_new == -INFINITY ? 0.f : m_new;
      float sum = 0.f;
      for (int t = lane; t < Tile::kTileTokens; t += 32) {
        const float pr = exp2f(row[t] - m_ref);
        row[t] = pr;
        sum += pr;
      }
      sum = WarpSum(sum);
      if (lane == 0) {
        const float al = exp2f(m_old - m_ref);
        alpha[j] = al;
        l_run[j] = l_run[j] * al + sum;
        m_run[j] = m_new;
      }
    }
    __syncthreads();

    // acc = acc * alpha + P V over this thread's rows and columns.
#pragma unroll
    for (int j = 0; j < kG; ++j) {
      if (j < G) {
        const float al = alpha[j];
#pragma unroll
        for (int e = 0; e < kE; ++e) acc[j][e] *= al;
      }
    }
#pragma unroll
    for (int i = 0; i < Tile::kRowsPerThread; ++i) {
      const int r = rg + i * Tile::kRowGroups;
      float vv[kE];
#pragma unroll
      for (int v = 0; v < kV; ++v)
        Unpack8<T>(*reinterpret_cast<const uint4*>(vt + r * kD + col(v)),
                   *reinterpret_cast<float(*)[8]>(&vv[8 * v]));
#pragma unroll
      for (int j = 0; j < kG; ++j) {
        if (j < G) {
          const float pr = sc[j * Tile::kTileTokens + r];
#pragma unroll
          for (int e = 0; e < kE; ++e) acc[j][e] = fmaf(pr, vv[e], acc[j][e]);
        }
      }
    }
    __syncthreads();  // the next iteration's copy overwrites this stage and sc
  }
  CpAsyncWait<0>();
  __syncthreads();

  // Sum the row groups' partial accumulators (reusing the stage buffers), write the split.
  float* red = reinterpret_cast<float*>(smem);  // [kRowGroups][kG][kD]
#pragma unroll
  for (int j = 0; j < kG; ++j) {
    if (j < G) {
#pragma unroll
      for (int v = 0; v < kV; ++v) {
        float* dst = red + (rg * kG + j) * kD + col(v);
        const float* x = &acc[j][8 * v];
        *reinterpret_cast<float4*>(dst) = make_float4(x[0], x[1], x[2], x[3]);
        *reinterpret_cast<float4*>(dst + 4) = make_float4(x[4], x[5], x[6], x[7]);
      }
    }
  }
  __syncthreads();
  for (int i = tid; i < G * kD; i += Tile::kThreads) {
    const int j = i / kD, d = i % kD;
    float s = 0.f;
#pragma unroll 4
    for (int r = 0; r < Tile::kRowGroups; ++r) s += red[(r * kG + j) * kD + d];
    const int64_t row = (static_cast<int64_t>(b) * hq + g * G + j) * a.splits + split;
    a.partial_o[row * kD + d] = s;
  }
  if (tid < G) {
    const int64_t row = (static_cast<int64_t>(b) * hq + g * G + tid) * a.splits + split;
    a.partial_ml[row * 2] = m_run[tid];
    a.partial_ml[row * 2 + 1] = l_run[tid];
  }
}

// out[b][h] = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s. grid (H_q, batch), block d threads.
// \tparam T  output element type
template <typename T>
__global__ void MergeSplitsKernel(const float* __restrict__ partial_o,   // [B][H_q][S][d]
                                  const float* __restrict__ partial_ml,  // [B][H_q][S][2]
                                  int splits, int head_dim, T* out,      // [B][H_q][d]
                                  int64_t out_stride) {
  const int h = blockIdx.x, b = blockIdx.y, d = threadIdx.x, hq = gridDim.x;
  const int64_t row = (static_cast<int64_t>(b) * hq + h) * splits;
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, partial_ml[(row + s) * 2]);
  float num = 0.f, den = 0.f;
  if (m != -INFINITY) {
    for (int s = 0; s < splits; ++s) {
      const float ms = partial_ml[(row + s) * 2];
      if (ms == -INFINITY) continue;  // an empty split: weight 0, and avoids -inf - -inf
      const float w = exp2f(ms - m);
      den = fmaf(w, partial_ml[(row + s) * 2 + 1], den);
      num = fmaf(w, partial_o[(row + s) * head_dim + d], num);
    }
  }
  // den > 0 whenever any token was attended (the max token contributes 1); else write 0.
  out[b * out_stride + h * head_dim + d] = FromF32<T>(den > 0.f ? num / den : 0.f);
}

int NumSms() {
  static const int sms = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
      cudaGetLastError();
      return 132;
    }
    return n;
  }();
  return sms;
}

namespace {

size_t Align256(size_t x) { return (x + 255) & ~size_t{255}; }
int TileTokens(int head_dim) { return 4096 / head_dim; }

int ListPages(const DecodeAttentionParams& p, bool quest) {
  return quest ? std::min(p.budget_pages, p.max_pages_per_seq) : p.max_pages_per_seq;
}

int SplitsFor(const DecodeAttentionParams& p, bool quest) {
  return p.num_splits > 0 ? p.num_splits : ChooseNumSplits(p, ListPages(p, quest));
}

cudaError_t Validate(const DecodeAttentionParams& p, bool quest) {
  const PagedKvLayout& l = p.layout;
  TS_REQUIRE(l.Valid(), "DecodeAttention: invalid layout");
  TS_REQUIRE(l.head_dim == 64 || l.head_dim == 128, "DecodeAttention: head_dim must be 64 or 128");
  TS_REQUIRE(l.page_size <= TileTokens(l.head_dim), "DecodeAttention: page_size too large");
  TS_REQUIRE(p.batch > 0 && p.batch <= 65535, "DecodeAttention: batch out of range");
  TS_REQUIRE(l.num_kv_heads <= 65535, "DecodeAttention: too many kv heads");
  TS_REQUIRE(p.num_q_heads > 0 && p.num_q_heads % l.num_kv_heads == 0 &&
                 p.num_q_heads / l.num_kv_heads <= kMaxGqaGroup,
             "DecodeAttention: H_q must be a multiple of H_kv with a group of at most 8");
  TS_REQUIRE(p.q_stride >= int64_t{p.num_q_heads} * l.head_dim && p.q_stride % 8 == 0,
             "DecodeAttention: q_stride must be >= H_q*d and a multiple of 8");
  TS_REQUIRE(p.out_stride >= int64_t{p.num_q_heads} * l.head_dim,
             "DecodeAttention: out_stride must be >= H_q*d");
  TS_REQUIRE(p.q && p.out && p.k_cache && p.v_cache && p.page_indptr && p.page_indices &&
                 p.seq_lens,
             "DecodeAttention: null pointer");
  TS_REQUIRE((reinterpret_cast<uintptr_t>(p.q) & 15) == 0 &&
                 (reinterpret_cast<uintptr_t>(p.k_cache) & 15) == 0 &&
                 (reinterpret_cast<uintptr_t>(p.v_cache) & 15) == 0 &&
                 (reinterpret_cast<uintptr_t>(p.kmin) & 15) == 0 &&
                 (reinterpret_cast<uintptr_t>(p.kmax) & 15) == 0,
             "DecodeAttention: q, caches and boxes must be 16-byte aligned");
  TS_REQUIRE(p.max_pages_per_seq > 0, "DecodeAttention: max_pages_per_seq must be > 0");
  TS_REQUIRE(p.num_splits >= 0 && p.num_splits <= 4096, "DecodeAttention: num_splits out of range");
  TS_REQUIRE(static_cast<int>(p.attend_kernel) >= 0 &&
                 p.attend_kernel <= AttendKernel::kTensorCores,
             "DecodeAttention: unknown attend_kernel");
  if (quest) {
    TS_REQUIRE(p.kmin && p.kmax, "QuestDecodeAttention: kmin/kmax are required");
    TS_REQUIRE(p.n_sink >= 0 && p.budget_pages >= p.n_sink + 1,
               "QuestDecodeAttention: budget_pages must be >= n_sink + 1");
    TS_REQUIRE(p.score_splits >= 0 && p.score_splits <= 1024,
               "QuestDecodeAttention: score_splits out of range");
  }
  TS_REQUIRE(p.workspace != nullptr && p.workspace_bytes >= DecodeWorkspaceBytes(p, quest) &&
                 (reinterpret_cast<uintptr_t>(p.workspace) & 255) == 0,
             "DecodeAttention: workspace missing, too small or not 256-byte aligned");
  return cudaSuccess;
}

template <typename T, int kD, int kG>
cudaError_t LaunchAttendSimt(const AttendArgs& a, int batch, cudaStream_t stream) {
  using Tile = AttendTile<T, kD, kG>;
  static_assert(Tile::kSmemBytes <= 227 * 1024, "shared memory budget");
  // Once per instantiation (and so outside any later graph capture): above 48 KB a kernel's
  // dynamic shared memory must be opted into.
  static const cudaError_t attr = cudaFuncSetAttribute(
      PagedAttendKernel<T, kD, kG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(Tile::kSmemBytes));
  if (attr != cudaSuccess) return attr;
  const dim3 grid(a.splits, a.layout.num_kv_heads, batch);
  LaunchKernel(PagedAttendKernel<T, kD, kG>, grid, Tile::kThreads, Tile::kSmemBytes, stream, a);
  TS_RETURN_LAUNCH_ERROR();
  return cudaSuccess;
}

std::atomic<int64_t>& AttendLaunchCounter(AttendKernel k) {
  static std::atomic<int64_t> counters[3];
  return counters[static_cast<int>(k)];
}

AttendKernel ResolveAttendKernel(AttendKernel k) {
  if (k != AttendKernel::kAuto) return k;
  static const AttendKernel from_env = [] {
    const char* e = std::getenv("TINYSERVE_CUDA_ATTEND");
    const bool tensor = e != nullptr && (std::strcmp(e, "tensor") == 0 ||
                                         std::strcmp(e, "tensor_cores") == 0);
    return tensor ? AttendKernel::kTensorCores : AttendKernel::kCudaCores;
  }();
  return from_env;
}

cudaError_t RunAttend(const DecodeAttentionParams& p, const DecodeWorkspace& ws, int splits,
                      bool quest, cudaStream_t stream) {
  AttendArgs a{};
  a.q = p.q;
  a.q_stride = p.q_stride;
  a.k_cache = p.k_cache;
  a.v_cache = p.v_cache;
  a.layout = p.layout;
  a.group = p.num_q_heads / p.layout.num_kv_heads;
  a.seq_lens = p.seq_lens;
  a.page_indptr = p.page_indptr;
  a.page_indices = p.page_indices;
  a.sel_pages = quest ? ws.sel_pages : nullptr;
  a.sel_count = quest ? ws.sel_count : nullptr;
  a.budget = p.budget_pages;
  a.splits = splits;
  const float scale = p.sm_scale > 0.f ? p.sm_scale : 1.0f / std::sqrt(float(p.layout.head_dim));
  a.scale_log2 = scale * 1.4426950408889634f;
  a.partial_o = ws.partial_o;
  a.partial_ml = ws.partial_ml;
  const bool tensor = ResolveAttendKernel(p.attend_kernel) == AttendKernel::kTensorCores;
  AttendLaunchCounter(tensor ? AttendKernel::kTensorCores : AttendKernel::kCudaCores)++;
  return TS_DISPATCH_DTYPE16(p.dtype, T, [&] {
    return TS_DISPATCH_HEAD_DIM(p.layout.head_dim, kD, [&]() -> cudaError_t {
      const cudaError_t e = tensor         ? LaunchAttendMma<T, kD>(a, p.batch, stream)
                            : a.group <= 4 ? LaunchAttendSimt<T, kD, 4>(a, p.batch, stream)
                                           : LaunchAttendSimt<T, kD, 8>(a, p.batch, stream);
      if (e != cudaSuccess) return e;
      LaunchKernel(MergeSplitsKernel<T>, dim3(p.num_q_heads, p.batch), kD, 0, stream, a.partial_o,
                   a.partial_ml, a.splits, kD, static_cast<T*>(p.out), p.out_stride);
      TS_RETURN_LAUNCH_ERROR();
      return cudaSuccess;
    });
  });
}

}  // namespace

DecodeWorkspace CarveWorkspace(const DecodeAttentionParams& p, int splits, bool quest,
                               void* base) {
  DecodeWorkspace ws;
  const size_t rows = size_t(p.batch) * p.num_q_heads * splits;
  const size_t kv_rows = size_t(p.batch) * p.layout.num_kv_heads;
  char* ptr = static_cast<char*>(base);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    char* r = ptr ? ptr + off : nullptr;
    off += Align256(bytes);
    return r;
  };
  ws.partial_o = reinterpret_cast<float*>(take(rows * p.layout.head_dim * sizeof(float)));
  ws.partial_ml = reinterpret_cast<float*>(take(rows * 2 * sizeof(float)));
  if (quest) {
    ws.sel_pages = reinterpret_cast<int32_t*>(
        take(kv_rows * std::max(1, p.budget_pages) * sizeof(int32_t)));
    ws.sel_count = reinterpret_cast<int32_t*>(take(kv_rows * sizeof(int32_t)));
    ws.scores = reinterpret_cast<float*>(take(kv_rows * p.max_pages_per_seq * sizeof(float)));
  }
  ws.bytes = off;
  return ws;
}

}  // namespace internal

int64_t AttendKernelLaunches(AttendKernel k) {
  return internal::AttendLaunchCounter(k).load(std::memory_order_relaxed);
}

const char* AttendKernelName(AttendKernel k) {
  switch (k) {
    case AttendKernel::kCudaCores: return "cuda_cores";
    case AttendKernel::kTensorCores: return "tensor_cores";
    default: return "auto";
  }
}

int ChooseNumSplits(const DecodeAttentionParams& p, int max_list_pages) {
  const int ctas = std::max(1, p.batch * p.layout.num_kv_heads);
  const int target = 4 * internal::NumSms();  // about 4 resident CTAs per SM
  const int want = (target + ctas - 1) / ctas;
  const int tokens = std::max(1, max_list_pages) * p.layout.page_size;
  const int most = std::max(1, tokens / 128);  // at least ~128 tokens per split
  return std::max(1, std::min(want, most));
}

size_t DecodeWorkspaceBytes(const DecodeAttentionParams& p, bool quest) {
  return internal::CarveWorkspace(p, internal::SplitsFor(p, quest), quest, nullptr).bytes;
}

cudaError_t DenseDecodeAttention(const DecodeAttentionParams& p, cudaStream_t stream) {
  if (cudaError_t e = internal::Validate(p, false); e != cudaSuccess) return e;
  const int splits = internal::SplitsFor(p, false);
  const internal::DecodeWorkspace ws = internal::CarveWorkspace(p, splits, false, p.workspace);
  return internal::RunAttend(p, ws, splits, false, stream);
}

cudaError_t QuestSelectOnly(const DecodeAttentionParams& p, cudaStream_t stream) {
  if (cudaError_t e = internal::Validate(p, true); e != cudaSuccess) return e;
  const int splits = internal::SplitsFor(p, true);
  const internal::DecodeWorkspace ws = internal::CarveWorkspace(p, splits, true, p.workspace);
  return internal::LaunchQuestSelection(p, ws, stream);
}

cudaError_t AttendPageLists(const DecodeAttentionParams& p, const int32_t* lists,
                            const int32_t* counts, cudaStream_t stream) {
  DecodeAttentionParams v = p;
  v.kmin = v.kmin ? v.kmin : v.k_cache;  // unused here; Validate wants Quest's pointers set
  v.kmax = v.kmax ? v.kmax : v.k_cache;
  if (cudaError_t e = internal::Validate(v, true); e != cudaSuccess) return e;
  TS_REQUIRE(lists != nullptr && counts != nullptr, "AttendPageLists: lists and counts required");
  const int splits = internal::SplitsFor(v, true);
  internal::DecodeWorkspace ws = internal::CarveWorkspace(v, splits, true, v.workspace);
  ws.sel_pages = const_cast<int32_t*>(lists);
  ws.sel_count = const_cast<int32_t*>(counts);
  return internal::RunAttend(v, ws, splits, true, stream);
}

cudaError_t QuestDecodeAttention(const DecodeAttentionParams& p, cudaStream_t stream) {
  if (cudaError_t e = internal::Validate(p, true); e != cudaSuccess) return e;
  const int splits = internal::SplitsFor(p, true);
  const internal::DecodeWorkspace ws = internal::CarveWorkspace(p, splits, true, p.workspace);
  if (cudaError_t e = internal::LaunchQuestSelection(p, ws, stream); e != cudaSuccess) return e;
  return internal::RunAttend(p, ws, splits, true, stream);
}

}  // namespace tinyserve::cuda
