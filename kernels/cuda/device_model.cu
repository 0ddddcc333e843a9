#include "kernels/cuda/device_model.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>
#include <tuple>

#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/decode_attention.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/kv_append.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/page_residency.h"
#include "kernels/cuda/prefill_attention.cuh"
#include "kernels/cuda/random_fill.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/step_plan.h"

namespace tinyserve::cuda {
namespace {

// dst[r] = src[rows[r]], r < n_rows; rows of `n` 16-bit elements (n % 8 == 0).
__global__ void GatherRowsKernel(const uint4* src, const int32_t* rows, uint4* dst, int n_vec) {
  const int r = blockIdx.x;
  const uint4* s = src + static_cast<int64_t>(rows[r]) * n_vec;
  uint4* d = dst + static_cast<int64_t>(r) * n_vec;
  for (int i = threadIdx.x; i < n_vec; i += blockDim.x) d[i] = s[i];
}

// out[s][d] = sum of rows [spans[2s], spans[2s] + spans[2s + 1]) of src, in f32: a pooled
// sequence's hidden states (the sum for mean pooling, one row for last).
template <typename T>
__global__ void PoolRowsKernel(const T* src, const int32_t* spans, float* out, int n) {
  const int s = blockIdx.x;
  const int first = spans[2 * s], rows = spans[2 * s + 1];
  for (int d = threadIdx.x; d < n; d += blockDim.x) {
    float sum = 0.f;
    for (int r = 0; r < rows; ++r) sum += ToF32<T>(src[static_cast<int64_t>(first + r) * n + d]);
    out[static_cast<int64_t>(s) * n + d] = sum;
  }
}

// Copies whole pages (all KV heads of one layer) from home to device slots: pair i moves page
// pairs[2i] of (home_k, home_v) to slot pairs[2i+1] of (slot_k, slot_v). page_vec: 16-byte
// vectors per page.
__global__ void CopyPagesKernel(const uint4* home_k, const uint4* home_v, uint4* slot_k,
                                uint4* slot_v, const int32_t* pairs, int64_t page_vec) {
  const int i = blockIdx.x;
  const uint4* src = (blockIdx.y == 0 ? home_k : home_v) + pairs[2 * i] * page_vec;
  uint4* dst = (blockIdx.y == 0 ? slot_k : slot_v) + pairs[2 * i + 1] * page_vec;
  for (int64_t j = threadIdx.x; j < page_vec; j += blockDim.x) dst[j] = src[j];
}

std::string CudaError(const char* what, cudaError_t e) {
  std::string s = std::string(what) + ": " + cudaGetErrorString(e);
  const char* why = LastLaunchError();
  if (why != nullptr && *why != '\0') s += std::string(" (") + why + ")";
  return s;
}

// Converts count floats to f16 or bf16 bits (~3 ns per element on one core: seconds for a 1B
// model), on up to hardware_concurrency threads of 16K elements each at least.
std::vector<uint16_t> ConvertTo16(const float* data, int64_t count, bool bf16) {
  std::vector<uint16_t> conv(static_cast<size_t>(count));
  auto convert = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (bf16) {
        const __nv_bfloat16 v = __float2bfloat16_rn(data[i]);
        std::memcpy(&conv[i], &v, 2);
      } else {
        const __half v = __float2half_rn(data[i]);
        std::memcpy(&conv[i], &v, 2);
      }
    }
  };
  const int64_t n_threads =
      std::clamp<int64_t>(count >> 14, 1, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (int64_t t = 1; t < n_threads; ++t)
    threads.emplace_back(convert, count * t / n_threads, count * (t + 1) / n_threads);
  convert(0, count / n_threads);
  for (std::thread& t : threads) t.join();
  return conv;
}

// A graph is keyed by the decode groups of a decode-only step and its LoRA runs.
struct GraphKey {
  std::vector<DecodeGroup> groups;
  std::vector<LoraRun> lora_runs;
  bool operator<(const GraphKey& o) const {
    if (lora_runs.size() != o.lora_runs.size()) return lora_runs.size() < o.lora_runs.size();
    for (size_t i = 0; i < lora_runs.size(); ++i) {
      const LoraRun &a = lora_runs[i], &b = o.lora_runs[i];
      if (!(a == b))
        return std::make_tuple(a.lora, a.row0, a.rows) < std::make_tuple(b.lora, b.row0, b.rows);
    }
    if (groups.size() != o.groups.size()) return groups.size() < o.groups.size();
    for (size_t i = 0; i < groups.size(); ++i) {
      const DecodeGroup &a = groups[i], &b = o.groups[i];
      auto t = [](const DecodeGroup& g) {
        return std::make_tuple(g.begin, g.size, g.att.quest, g.att.budget_pages,
                               g.att.sink_pages, g.att.dense_layers, g.att.gqa_max);
      };
      if (t(a) != t(b)) return t(a) < t(b);
    }
    return false;
  }
};

struct GraphEntry {
  int seen = 0;
  cudaGraphExec_t exec = nullptr;
};

constexpr int kMaxGraphs = 64;

}  // namespace

struct DeviceModel::Impl {
  DeviceModelConfig c;
  DType dt = DType::kF16;
  size_t elt = 2;
  int qdim = 0, kdim = 0, qkv_dim = 0;
  PagedKvLayout pool_layout, slot_layout;
  cudaStream_t stream = nullptr;
  CublasGemm gemm;
  std::vector<void*> device_allocs;
  std::vector<void*> host_allocs;
  bool uploads_pending = false;  // SetWeight copies the next step must wait for

  struct Layer {
    void *attn_norm, *wqkv, *wo, *ffn_norm, *wgu, *wdown;
    void* bqkv = nullptr;              // [qkv_dim] with config qkv_bias
    void *q_norm = nullptr, *k_norm = nullptr;  // [head_dim] each, with config qk_norm
    void *k, *v, *kmin, *kmax;         // k/v: device, or home (mapped host) when tiered
    void *slot_k = nullptr, *slot_v = nullptr;  // tiered: device slots
    std::unique_ptr<PageResidency> residency;    // tiered only
  };
  std::vector<Layer> layers;
  void *embed = nullptr, *out_norm = nullptr, *lm_head = nullptr;
  float* rope_factors = nullptr;  // [head_dim / 2] with config rope_freq_factors

  // LoRA adapters: per layer and product, a [rank][in] and b [out][rank] in one device block.
  struct LoraProduct {
    int rank = 0;
    void *a = nullptr, *b = nullptr;
  };
  struct LoraLayerDev {
    LoraProduct qkv, o, gate_up, down;
  };
  struct Lora {
    void* block = nullptr;  // null once removed
    std::vector<LoraLayerDev> layers;
  };
  std::vector<Lora> loras;       // [id - 1]
  void* lora_tmp = nullptr;      // [max_tokens][lora_tmp_rank]: x·aᵀ of one run
  int lora_tmp_rank = 0;

  // Activations.
  void *x, *h, *qkv, *attn, *tmp, *gu, *act, *hsel;
  float* hidden_dev = nullptr;   // embeddings: [max_batch][dim] pooled rows of h
  float* hidden_host = nullptr;  // pinned
  float* logits_dev = nullptr;
  float* logits_host = nullptr;  // pinned
  void* workspace = nullptr;
  size_t workspace_bytes = 0;

  // Per-step integers: one pinned host block mirrored by one device block.
  struct StepLayout {
    size_t ids, positions, new_indptr, seq_lens, page_indptr, page_indices, q_indptr, logit_rows,
        hidden_spans, total;
  } sl{};
  int32_t* step_host = nullptr;
  int32_t* step_dev = nullptr;
  // Quest selection outputs: [n_layers][max_batch][H_kv] counts, and (tiered) lists.
  int32_t *sel_count_dev = nullptr, *sel_count_host = nullptr;
  int32_t *sel_pages_dev = nullptr, *sel_pages_host = nullptr;
  // Tiered: page lists in slot ids, their counts, and copy pairs (device + pinned staging).
  int32_t *slot_lists_dev = nullptr, *slot_lists_host = nullptr;
  int32_t *slot_counts_dev = nullptr, *slot_counts_host = nullptr;
  int32_t *pairs_dev = nullptr, *pairs_host = nullptr;

  std::map<GraphKey, GraphEntry> graphs;
  DeviceStepStats stats;

  ~Impl() {
    cudaSetDevice(c.device);  // the frees below act on the current device
    for (auto& [k, g] : graphs)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    for (Lora& a : loras) cudaFree(a.block);
    cudaFree(lora_tmp);
    for (void* p : device_allocs) cudaFree(p);
    for (void* p : host_allocs) cudaFreeHost(p);
    if (stream) cudaStreamDestroy(stream);
  }

  bool Alloc(void** p, size_t bytes, std::string* error) {
    cudaError_t e = cudaMalloc(p, std::max<size_t>(bytes, 256));
    if (e != cudaSuccess) {
      *error = CudaError("cudaMalloc", e) + " for " + std::to_string(bytes) + " bytes";
      return false;
    }
    device_allocs.push_back(*p);
    return true;
  }
  bool AllocHost(void** p, size_t bytes, unsigned flags, std::string* error) {
    cudaError_t e = cudaHostAlloc(p, std::max<size_t>(bytes, 256), flags);
    if (e != cudaSuccess) {
      *error = CudaError("cudaHostAlloc", e) + " for " + std::to_string(bytes) + " bytes";
      return false;
    }
    host_allocs.push_back(*p);
    return true;
  }
  bool Tiered(int layer) const { return c.device_pages > 0 && layer >= c.resident_layers; }
  // Destroys the captured graphs (all, or those naming adapter `lora`).
  void DropGraphs(int lora = 0) {
    for (auto it = graphs.begin(); it != graphs.end();) {
      const auto& runs = it->first.lora_runs;
      if (lora == 0 || std::any_of(runs.begin(), runs.end(),
                                   [lora](const LoraRun& r) { return r.lora == lora; })) {
        if (it->second.exec) cudaGraphExecDestroy(it->second.exec);
        it = graphs.erase(it);
      } else {
        ++it;
      }
    }
  }
  int AddLora(const std::vector<DeviceLoraLayer>& layers, std::string* error);
  // y[rows of each run] += (x·aᵀ)·bᵀ for the runs' adapters' `product` of layer l (x [T][K],
  // y [T][N]).
  cudaError_t AddLoraUpdates(const StepPlan& plan, int l, LoraProduct LoraLayerDev::*product,
                             const void* x, int K, void* y, int N);
  int64_t PageBytes() const {  // K + V of one page of one layer
    return 2 * int64_t{c.n_kv_heads} * c.page_size * c.head_dim * static_cast<int64_t>(elt);
  }

  bool Init(std::string* error);
  bool Run(const std::vector<DeviceSeq>& batch, std::vector<float>* logits, std::string* error,
           std::vector<float>* hidden);
  // Enqueues the whole step on `stream` (no host synchronisation unless tiered).
  cudaError_t Enqueue(const StepPlan& plan, std::string* where);
  cudaError_t DecodeAttention(int layer, const DecodeGroup& g, const StepPlan& plan,
                              std::string* where);
  DecodeAttentionParams DecodeParams(int layer, const DecodeGroup& g) const;
  // The append of qkv's K and V rows into `layer` through the step tables in step_dev.
  KvAppendParams AppendParams(int layer, int batch, int max_new) const;
  bool FillKvRandom(const int32_t* pages, int n_pages, int64_t n_tokens, uint64_t seed,
                    std::string* error);
  StepPlan plan;  // the current step's (reused across steps)
};

bool DeviceModel::Impl::Init(std::string* error) {
  if (CudaDeviceCount() == 0) {
    *error = "no CUDA device is available";
    return false;
  }
  if (c.n_layers <= 0 || c.dim <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.ffn_dim <= 0 ||
      c.vocab <= 0) {
    *error = "model shape must be positive";
    return false;
  }
  if (c.head_dim != 64 && c.head_dim != 128) {
    *error = "head_dim " + std::to_string(c.head_dim) + " is not supported on CUDA (64 or 128)";
    return false;
  }
  if (c.n_heads % c.n_kv_heads != 0 || c.n_heads / c.n_kv_heads > kMaxGqaGroup) {
    *error = "query heads per KV head must be an integer <= 8 on CUDA";
    return false;
  }
  if (c.qk_norm && c.n_heads + c.n_kv_heads > kMaxNormHeads) {
    *error = "per-head Q/K norms need n_heads + n_kv_heads <= " + std::to_string(kMaxNormHeads);
    return false;
  }
  if (c.dim % 8 != 0 || c.ffn_dim % 8 != 0) {
    *error = "dim and ffn_dim must be multiples of 8 on CUDA";
    return false;
  }
  if (c.page_size <= 0 || c.page_size > 32 || (c.page_size & (c.page_size - 1)) != 0) {
    *error = "page_size must be a power of two <= 32 on CUDA";
    return false;
  }
  if (c.num_pages <= 0 || c.max_batch <= 0 || c.max_tokens < c.max_batch ||
      c.max_pages_per_seq <= 0) {
    *error = "num_pages, max_batch, max_tokens (>= max_batch) and max_pages_per_seq must be > 0";
    return false;
  }
  if (c.device_pages < 0 || c.resident_layers < 0) {
    *error = "device_pages and resident_layers must be >= 0";
    return false;
  }
  if (cudaError_t e = cudaSetDevice(c.device); e != cudaSuccess) {
    *error = CudaError("cudaSetDevice", e);
    return false;
  }
  dt = c.bf16 ? DType::kBF16 : DType::kF16;
  elt = 2;
  qdim = c.n_heads * c.head_dim;
  kdim = c.n_kv_heads * c.head_dim;
  qkv_dim = qdim + 2 * kdim;
  pool_layout = PagedKvLayout{c.num_pages, c.n_kv_heads, c.page_size, c.head_dim};
  slot_layout = PagedKvLayout{std::max(1, c.device_pages), c.n_kv_heads, c.page_size, c.head_dim};
  if (!pool_layout.Valid()) {
    *error = "KV layout is invalid (too many pages?)";
    return false;
  }
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    *error = CudaError("cudaStreamCreate", e);
    return false;
  }
  if (!gemm.Init()) {
    *error = std::string("cuBLAS: ") + LastLaunchError();
    return false;
  }
  if (!c.rope_freq_factors.empty() &&
      c.rope_freq_factors.size() != static_cast<size_t>(c.head_dim / 2)) {
    *error = "rope_freq_factors must hold head_dim / 2 values";
    return false;
  }
  const size_t D = c.dim, F = c.ffn_dim, V = c.vocab, M = c.max_tokens;
  bool ok = Alloc(&embed, V * D * elt, error) && Alloc(&out_norm, D * elt, error) &&
            Alloc(&lm_head, V * D * elt, error);
  if (ok && !c.rope_freq_factors.empty()) {
    const size_t bytes = c.rope_freq_factors.size() * sizeof(float);
    ok = Alloc(reinterpret_cast<void**>(&rope_factors), bytes, error);
    if (ok && cudaMemcpy(rope_factors, c.rope_freq_factors.data(), bytes, cudaMemcpyHostToDevice) !=
                  cudaSuccess) {
      *error = "uploading the RoPE factors failed";
      ok = false;
    }
  }
  layers.resize(c.n_layers);
  const size_t kv_bytes = pool_layout.KvElements() * elt, meta = pool_layout.MetaElements() * elt;
  for (int l = 0; ok && l < c.n_layers; ++l) {
    Layer& L = layers[l];
    ok = Alloc(&L.attn_norm, D * elt, error) && Alloc(&L.wqkv, size_t(qkv_dim) * D * elt, error) &&
         Alloc(&L.wo, D * qdim * elt, error) && Alloc(&L.ffn_norm, D * elt, error) &&
         Alloc(&L.wgu, 2 * F * D * elt, error) && Alloc(&L.wdown, D * F * elt, error) &&
         Alloc(&L.kmin, meta, error) && Alloc(&L.kmax, meta, error) &&
         cudaMemset(L.kmin, 0, meta) == cudaSuccess && cudaMemset(L.kmax, 0, meta) == cudaSuccess;
    if (ok && c.qkv_bias)
      ok = Alloc(&L.bqkv, size_t(qkv_dim) * elt, error) &&
           cudaMemset(L.bqkv, 0, size_t(qkv_dim) * elt) == cudaSuccess;
    if (ok && c.qk_norm)
      ok = Alloc(&L.q_norm, size_t(c.head_dim) * elt, error) &&
           Alloc(&L.k_norm, size_t(c.head_dim) * elt, error);
    if (!ok) break;
    if (Tiered(l)) {
      void *hk, *hv;
      ok = AllocHost(&hk, kv_bytes, cudaHostAllocMapped, error) &&
           AllocHost(&hv, kv_bytes, cudaHostAllocMapped, error) &&
           Alloc(&L.slot_k, slot_layout.KvElements() * elt, error) &&
           Alloc(&L.slot_v, slot_layout.KvElements() * elt, error);
      if (!ok) break;
      std::memset(hk, 0, kv_bytes);
      std::memset(hv, 0, kv_bytes);
      if (cudaHostGetDevicePointer(&L.k, hk, 0) != cudaSuccess ||
          cudaHostGetDevicePointer(&L.v, hv, 0) != cudaSuccess) {
        *error = "cudaHostGetDevicePointer failed (mapped pinned memory unsupported?)";
        return false;
      }
      L.residency = std::make_unique<PageResidency>(c.device_pages);
    } else {
      ok = Alloc(&L.k, kv_bytes, error) && Alloc(&L.v, kv_bytes, error);
      if (ok) ok = cudaMemset(L.k, 0, kv_bytes) == cudaSuccess &&
                   cudaMemset(L.v, 0, kv_bytes) == cudaSuccess;
    }
  }
  ok = ok && Alloc(&x, M * D * elt, error) && Alloc(&h, M * D * elt, error) &&
       Alloc(&qkv, M * qkv_dim * elt, error) && Alloc(&attn, M * qdim * elt, error) &&
       Alloc(&tmp, M * D * elt, error) && Alloc(&gu, M * 2 * F * elt, error) &&
       Alloc(&act, M * F * elt, error) && Alloc(&hsel, M * D * elt, error) &&
       Alloc(reinterpret_cast<void**>(&hidden_dev), size_t(c.max_batch) * D * 4, error) &&
       AllocHost(reinterpret_cast<void**>(&hidden_host), size_t(c.max_batch) * D * 4, 0, error) &&
       Alloc(reinterpret_cast<void**>(&logits_dev), M * V * sizeof(float), error) &&
       AllocHost(reinterpret_cast<void**>(&logits_host), M * V * sizeof(float), 0, error);
  if (!ok) return false;

  // Step integers.
  const size_t B = c.max_batch, W = c.max_pages_per_seq;
  size_t off = 0;
  auto take = [&](size_t n) {
    const size_t r = off;
    off += (n + 63) / 64 * 64;  // 256-byte aligned pieces
    return r;
  };
  sl.ids = take(M);
  sl.positions = take(M);
  sl.new_indptr = take(B + 1);
  sl.seq_lens = take(B);
  sl.page_indptr = take(B + 1);
  sl.page_indices = take(B * W);
  sl.q_indptr = take(B + 1);
  sl.logit_rows = take(M);
  sl.hidden_spans = take(2 * B);
  sl.total = off;
  ok = AllocHost(reinterpret_cast<void**>(&step_host), off * 4, 0, error) &&
       Alloc(reinterpret_cast<void**>(&step_dev), off * 4, error);
  const size_t counts = size_t(c.n_layers) * B * c.n_kv_heads;
  ok = ok && Alloc(reinterpret_cast<void**>(&sel_count_dev), counts * 4, error) &&
       AllocHost(reinterpret_cast<void**>(&sel_count_host), counts * 4, 0, error);
  if (ok && c.device_pages > 0) {
    const size_t lists = B * c.n_kv_heads * W;
    ok = Alloc(reinterpret_cast<void**>(&sel_pages_dev), lists * 4, error) &&
         AllocHost(reinterpret_cast<void**>(&sel_pages_host), lists * 4, 0, error) &&
         Alloc(reinterpret_cast<void**>(&slot_lists_dev), lists * 4, error) &&
         AllocHost(reinterpret_cast<void**>(&slot_lists_host), lists * 4, 0, error) &&
         Alloc(reinterpret_cast<void**>(&slot_counts_dev), B * c.n_kv_heads * 4, error) &&
         AllocHost(reinterpret_cast<void**>(&slot_counts_host), B * c.n_kv_heads * 4, 0, error) &&
         Alloc(reinterpret_cast<void**>(&pairs_dev), 2 * size_t(c.device_pages) * 4, error) &&
         AllocHost(reinterpret_cast<void**>(&pairs_host), 2 * size_t(c.device_pages) * 4, 0,
                   error);
  }
  if (!ok) return false;

  // Decode workspace: the largest any batch size, dense or Quest at the largest budget, needs.
  for (int b = 1; b <= c.max_batch; ++b) {
    DecodeAttentionParams p;
    p.dtype = dt;
    p.layout = pool_layout;
    p.batch = b;
    p.num_q_heads = c.n_heads;
    p.max_pages_per_seq = c.max_pages_per_seq;
    p.budget_pages = c.max_pages_per_seq;
    workspace_bytes = std::max({workspace_bytes, DecodeWorkspaceBytes(p, false),
                                DecodeWorkspaceBytes(p, true)});
  }
  if (!Alloc(&workspace, workspace_bytes, error)) return false;
  // The memsets above ran on the legacy stream; Forward's stream is not ordered after it.
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    *error = CudaError("init", e);
    return false;
  }
  return true;
}

KvAppendParams DeviceModel::Impl::AppendParams(int layer, int batch, int max_new) const {
  const Layer& L = layers[layer];
  KvAppendParams kp;
  kp.dtype = dt;
  kp.layout = pool_layout;
  kp.batch = batch;
  kp.k_new = static_cast<char*>(qkv) + size_t(qdim) * elt;
  kp.v_new = static_cast<char*>(qkv) + size_t(qdim + kdim) * elt;
  kp.new_stride = qkv_dim;
  kp.new_indptr = step_dev + sl.new_indptr;
  kp.seq_lens = step_dev + sl.seq_lens;
  kp.page_indptr = step_dev + sl.page_indptr;
  kp.page_indices = step_dev + sl.page_indices;
  kp.max_new_per_seq = max_new;
  kp.k_cache = L.k;
  kp.v_cache = L.v;
  kp.kmin = L.kmin;
  kp.kmax = L.kmax;
  return kp;
}

DecodeAttentionParams DeviceModel::Impl::DecodeParams(int layer, const DecodeGroup& g) const {
  const Layer& L = layers[layer];
  DecodeAttentionParams p;
  p.dtype = dt;
  p.layout = pool_layout;
  p.batch = g.size;
  p.num_q_heads = c.n_heads;
  p.q = static_cast<const char*>(qkv) + size_t(g.begin) * qkv_dim * elt;
  p.q_stride = qkv_dim;
  p.out = static_cast<char*>(attn) + size_t(g.begin) * qdim * elt;
  p.out_stride = qdim;
  p.k_cache = L.k;
  p.v_cache = L.v;
  p.kmin = L.kmin;
  p.kmax = L.kmax;
  p.page_indptr = step_dev + sl.page_indptr + g.begin;
  p.page_indices = step_dev + sl.page_indices;
  p.seq_lens = step_dev + sl.seq_lens + g.begin;
  p.max_pages_per_seq = c.max_pages_per_seq;
  p.workspace = workspace;
  p.workspace_bytes = workspace_bytes;
  if (g.att.quest && layer >= g.att.dense_layers) {
    p.budget_pages = std::min(g.att.budget_pages, c.max_pages_per_seq);
    p.n_sink = std::min(g.att.sink_pages, p.budget_pages - 1);
    p.aggregation = g.att.gqa_max ? GqaAggregation::kKvMax : GqaAggregation::kKvSum;
    p.selected_count =
        sel_count_dev + (size_t(layer) * c.max_batch + g.begin) * c.n_kv_heads;
  }
  return p;
}

cudaError_t DeviceModel::Impl::DecodeAttention(int layer, const DecodeGroup& g,
                                               const StepPlan& plan, std::string* where) {
  const std::vector<int>& seq_len = plan.seq_len;
  const std::vector<std::vector<int32_t>>& tables = plan.tables;
  Layer& L = layers[layer];
  DecodeAttentionParams p = DecodeParams(layer, g);
  const bool quest = p.budget_pages > 0;
  if (!Tiered(layer)) {
    *where = quest ? "QuestDecodeAttention" : "DenseDecodeAttention";
    return quest ? QuestDecodeAttention(p, stream) : DenseDecodeAttention(p, stream);
  }
  // Tiered: find the pages the group attends (select on the device when Quest), as logical
  // page lists per (sequence, KV head), stride `stride`.
  const int W = c.max_pages_per_seq, P = c.page_size, H = c.n_kv_heads;
  const int stride = quest ? p.budget_pages : W;
  const size_t n_lists = size_t(g.size) * H;
  std::vector<int32_t> lists(n_lists * stride), counts(n_lists);
  // The pinned staging below is reused per layer: wait until the last upload from it is done
  // (the Quest path waits anyway, for the selection readback).
  if (!quest) {
    *where = "tiered staging";
    if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) return e;
  }
  if (quest) {
    p.selected_pages = sel_pages_dev;
    *where = "QuestSelectOnly";
    if (cudaError_t e = QuestSelectOnly(p, stream); e != cudaSuccess) return e;
    *where = "tiered selection readback";
    cudaError_t e = cudaMemcpyAsync(sel_pages_host, sel_pages_dev, n_lists * stride * 4,
                                    cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(sel_count_host, p.selected_count, n_lists * 4, cudaMemcpyDeviceToHost,
                          stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) return e;
    std::copy(sel_pages_host, sel_pages_host + lists.size(), lists.begin());
    std::copy(sel_count_host, sel_count_host + n_lists, counts.begin());
  } else {
    for (int b = 0; b < g.size; ++b) {
      const int n = (seq_len[g.begin + b] + P - 1) / P;
      for (int hh = 0; hh < H; ++hh) {
        counts[size_t(b) * H + hh] = n;
        for (int j = 0; j < n; ++j) lists[(size_t(b) * H + hh) * stride + j] = j;
      }
    }
  }
  std::vector<int32_t> needed;
  for (int b = 0; b < g.size; ++b)
    for (int hh = 0; hh < H; ++hh)
      for (int i = 0; i < counts[size_t(b) * H + hh]; ++i)
        needed.push_back(tables[g.begin + b][lists[(size_t(b) * H + hh) * stride + i]]);
  std::vector<PageResidency::Copy> copies;
  const int64_t hits0 = L.residency->totals().hits, miss0 = L.residency->totals().misses;
  if (!L.residency->Ensure(needed, &copies)) {
    // Over capacity: attend over home memory directly (Quest selects again: same pages).
    std::sort(needed.begin(), needed.end());
    stats.bytes_direct +=
        int64_t(std::unique(needed.begin(), needed.end()) - needed.begin()) * PageBytes();
    p.selected_pages = nullptr;
    *where = quest ? "QuestDecodeAttention (home)" : "DenseDecodeAttention (home)";
    return quest ? QuestDecodeAttention(p, stream) : DenseDecodeAttention(p, stream);
  }
  stats.tier_hits += L.residency->totals().hits - hits0;
  stats.tier_misses += L.residency->totals().misses - miss0;
  stats.bytes_moved += int64_t(copies.size()) * PageBytes();
  if (!copies.empty()) {
    for (size_t i = 0; i < copies.size(); ++i) {
      pairs_host[2 * i] = copies[i].page;
      pairs_host[2 * i + 1] = copies[i].slot;
    }
    *where = "CopyPagesKernel";
    cudaError_t e =
        cudaMemcpyAsync(pairs_dev, pairs_host, copies.size() * 8, cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess) {
      const int64_t page_vec = PageBytes() / 2 / 16;
      LaunchKernel(CopyPagesKernel, dim3(static_cast<unsigned>(copies.size()), 2), 256, 0, stream,
                   static_cast<const uint4*>(L.k), static_cast<const uint4*>(L.v),
                   static_cast<uint4*>(L.slot_k), static_cast<uint4*>(L.slot_v), pairs_dev,
                   page_vec);
      e = cudaGetLastError();
    }
    if (e != cudaSuccess) {
      // The slots were assigned but never filled: forget them, so later steps copy again.
      std::vector<int32_t> unfilled;
      for (const PageResidency::Copy& cp : copies) unfilled.push_back(cp.page);
      L.residency->Invalidate(unfilled);
      return e;
    }
  }
  // The lists in device slots, then attend over the slots.
  for (int b = 0; b < g.size; ++b)
    for (int hh = 0; hh < H; ++hh) {
      const size_t row = size_t(b) * H + hh;
      for (int i = 0; i < counts[row]; ++i)
        slot_lists_host[row * stride + i] =
            L.residency->SlotOf(tables[g.begin + b][lists[row * stride + i]]);
      slot_counts_host[row] = counts[row];
    }
  *where = "tiered slot lists upload";
  if (cudaError_t e = cudaMemcpyAsync(slot_lists_dev, slot_lists_host, n_lists * stride * 4,
                                      cudaMemcpyHostToDevice, stream);
      e != cudaSuccess)
    return e;
  if (cudaError_t e = cudaMemcpyAsync(slot_counts_dev, slot_counts_host, n_lists * 4,
                                      cudaMemcpyHostToDevice, stream);
      e != cudaSuccess)
    return e;
  p.layout = slot_layout;
  p.k_cache = L.slot_k;
  p.v_cache = L.slot_v;
  p.budget_pages = stride;
  p.selected_pages = nullptr;
  *where = "AttendPageLists (slots)";
  return AttendPageLists(p, slot_lists_dev, slot_counts_dev, stream);
}

cudaError_t DeviceModel::Impl::AddLoraUpdates(const StepPlan& plan, int l,
                                              LoraProduct LoraLayerDev::*product, const void* x,
                                              int K, void* y, int N) {
  for (const LoraRun& run : plan.lora_runs) {
    const LoraProduct& u = loras[run.lora - 1].layers[l].*product;
    if (u.rank == 0) continue;
    const char* xr = static_cast<const char*>(x) + size_t(run.row0) * K * elt;
    char* yr = static_cast<char*>(y) + size_t(run.row0) * N * elt;
    cudaError_t e = gemm.Linear(dt, xr, u.a, lora_tmp, run.rows, u.rank, K, stream);
    if (e == cudaSuccess) e = gemm.Linear(dt, lora_tmp, u.b, yr, run.rows, N, u.rank, stream, 1.f);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

int DeviceModel::Impl::AddLora(const std::vector<DeviceLoraLayer>& in, std::string* error) {
  if (static_cast<int>(in.size()) != c.n_layers) {
    *error = "LoRA adapter has " + std::to_string(in.size()) + " layers, the model " +
             std::to_string(c.n_layers);
    return 0;
  }
  // The four products: where they sit on the host and the device, and their shapes.
  // (Aliases: nvcc's host pass parenthesises member-pointer declarators, which g++ warns of.)
  using HostMember = const DeviceLoraUpdate DeviceLoraLayer::*;
  using DevMember = LoraProduct LoraLayerDev::*;
  struct Product {
    HostMember host;
    DevMember dev;
    const char* name;
    int K, N;  // in, out
  };
  const int D = c.dim, F = c.ffn_dim;
  const Product products[] = {{&DeviceLoraLayer::qkv, &LoraLayerDev::qkv, "qkv", D, qkv_dim},
                              {&DeviceLoraLayer::o, &LoraLayerDev::o, "o", qdim, D},
                              {&DeviceLoraLayer::gate_up, &LoraLayerDev::gate_up, "gate_up", D,
                               2 * F},
                              {&DeviceLoraLayer::down, &LoraLayerDev::down, "down", F, D}};
  // Each factor takes a 256-byte aligned piece of the block (cuBLAS prefers aligned operands).
  auto piece = [&](const std::vector<float>& v) { return (v.size() * elt + 255) / 256 * 256; };
  size_t total = 0;
  int max_rank = 0;
  for (int l = 0; l < c.n_layers; ++l)
    for (const Product& p : products) {
      const DeviceLoraUpdate& u = in[l].*p.host;
      const int K = p.K, N = p.N;
      if (u.rank < 0 || u.rank > 4096 || u.a.size() != size_t(u.rank) * K ||
          u.b.size() != size_t(N) * u.rank) {
        *error = "LoRA update of layer " + std::to_string(l) + " " + p.name + ": rank " +
                 std::to_string(u.rank) + " with " + std::to_string(u.a.size()) + " + " +
                 std::to_string(u.b.size()) + " elements does not fit [" + std::to_string(K) +
                 " -> " + std::to_string(N) + "]";
        return 0;
      }
      total += piece(u.a) + piece(u.b);
      max_rank = std::max(max_rank, u.rank);
    }
  if (cudaError_t e = cudaSetDevice(c.device); e != cudaSuccess) {
    *error = CudaError("cudaSetDevice", e);
    return 0;
  }
  Lora a;
  if (cudaError_t e = cudaMalloc(&a.block, std::max<size_t>(total, 256)); e != cudaSuccess) {
    *error = CudaError("cudaMalloc (LoRA adapter)", e) + " for " + std::to_string(total) + " bytes";
    return 0;
  }
  a.layers.resize(c.n_layers);
  char* at = static_cast<char*>(a.block);
  cudaError_t e = cudaSuccess;
  auto upload = [&](const std::vector<float>& v) {
    void* dst = at;
    at += piece(v);
    if (e == cudaSuccess && !v.empty()) {
      const std::vector<uint16_t> conv = ConvertTo16(v.data(), int64_t(v.size()), c.bf16);
      e = cudaMemcpy(dst, conv.data(), conv.size() * 2, cudaMemcpyHostToDevice);
    }
    return dst;
  };
  for (int l = 0; l < c.n_layers; ++l)
    for (const Product& p : products) {
      const DeviceLoraUpdate& u = in[l].*p.host;
      LoraProduct& d = a.layers[l].*p.dev;
      d.rank = u.rank;
      d.a = upload(u.a);
      d.b = upload(u.b);
    }
  if (e == cudaSuccess && max_rank > lora_tmp_rank) {
    // A bigger scratch: the graphs captured with the old one go.
    DropGraphs();
    cudaFree(lora_tmp);
    lora_tmp = nullptr;
    lora_tmp_rank = 0;
    e = cudaMalloc(&lora_tmp, size_t(c.max_tokens) * max_rank * elt);
    if (e == cudaSuccess) lora_tmp_rank = max_rank;
  }
  if (e != cudaSuccess) {
    *error = CudaError("LoRA adapter upload", e);
    cudaFree(a.block);
    return 0;
  }
  uploads_pending = true;  // as SetWeight: the next step waits for the copies
  loras.push_back(std::move(a));
  return static_cast<int>(loras.size());
}

cudaError_t DeviceModel::Impl::Enqueue(const StepPlan& plan, std::string* where) {
  const int D = c.dim, F = c.ffn_dim, hd = c.head_dim;
  const int T = plan.rows, n_seq = plan.n_seq, nd = plan.nd;
  const int n_logit_rows = static_cast<int>(plan.logit_rows.size());
  auto row = [&](void* base, size_t r, size_t width) {
    return static_cast<char*>(base) + r * width * elt;
  };
#define TS_ENQ(call)                                  \
  do {                                                \
    cudaError_t e_ = (call);                          \
    if (e_ != cudaSuccess) {                          \
      if (where->empty()) *where = #call;             \
      return e_;                                      \
    }                                                 \
  } while (0)
  TS_ENQ(EmbeddingLookup(dt, embed, step_dev + sl.ids, x, T, c.vocab, D, stream));
  for (int l = 0; l < c.n_layers; ++l) {
    Layer& L = layers[l];
    TS_ENQ(RmsNorm(dt, l == 0 ? x : tmp, L.attn_norm, h, l == 0 ? nullptr : x, T, D, c.norm_eps,
                   stream));
    TS_ENQ(gemm.Linear(dt, h, L.wqkv, qkv, T, qkv_dim, D, stream));
    TS_ENQ(AddLoraUpdates(plan, l, &LoraLayerDev::qkv, h, D, qkv, qkv_dim));
    if (L.bqkv != nullptr) TS_ENQ(AddBias(dt, qkv, qkv_dim, L.bqkv, T, qkv_dim, stream));
    RopeParams rp;
    rp.dtype = dt;
    rp.q = qkv;
    rp.q_stride = qkv_dim;
    rp.k = row(qkv, 0, 1) + size_t(qdim) * elt;
    rp.k_stride = qkv_dim;
    rp.positions = step_dev + sl.positions;
    rp.tokens = T;
    rp.num_q_heads = c.n_heads;
    rp.num_kv_heads = c.n_kv_heads;
    rp.head_dim = hd;
    rp.theta = c.rope_theta;
    rp.freq_scale = c.rope_freq_scale;
    rp.freq_factors = rope_factors;
    rp.attn_factor = c.rope_attn_factor;
    rp.style = c.rope_adjacent ? RopeStyle::kAdjacentPairs : RopeStyle::kRotateHalf;
    rp.q_norm = L.q_norm;
    rp.k_norm = L.k_norm;
    rp.norm_eps = c.norm_eps;
    TS_ENQ(ApplyRope(rp, stream));
    TS_ENQ(AppendPagedKv(AppendParams(l, n_seq, plan.max_new), stream));
    for (const DecodeGroup& g : plan.groups) {
      cudaError_t e = DecodeAttention(l, g, plan, where);
      if (e != cudaSuccess) return e;
      where->clear();  // it names the stage only when that stage failed
    }
    if (nd < n_seq) {
      PrefillAttentionParams pp;
      pp.dtype = dt;
      pp.layout = pool_layout;
      pp.batch = n_seq - nd;
      pp.num_q_heads = c.n_heads;
      pp.q = row(qkv, nd, qkv_dim);
      pp.q_stride = qkv_dim;
      pp.out = row(attn, nd, qdim);
      pp.out_stride = qdim;
      pp.q_indptr = step_dev + sl.q_indptr;
      pp.seq_lens = step_dev + sl.seq_lens + nd;
      pp.page_indptr = step_dev + sl.page_indptr + nd;
      pp.page_indices = step_dev + sl.page_indices;
      pp.k_cache = L.k;
      pp.v_cache = L.v;
      pp.max_q_per_seq = plan.max_q_prefill;
      TS_ENQ(PrefillAttention(pp, stream));
    }
    TS_ENQ(gemm.Linear(dt, attn, L.wo, tmp, T, D, qdim, stream));
    TS_ENQ(AddLoraUpdates(plan, l, &LoraLayerDev::o, attn, qdim, tmp, D));
    TS_ENQ(RmsNorm(dt, tmp, L.ffn_norm, h, x, T, D, c.norm_eps, stream));
    TS_ENQ(gemm.Linear(dt, h, L.wgu, gu, T, 2 * F, D, stream));
    TS_ENQ(AddLoraUpdates(plan, l, &LoraLayerDev::gate_up, h, D, gu, 2 * F));
    TS_ENQ(SwiGlu(dt, gu, 2 * F, row(gu, 0, 1) + size_t(F) * elt, 2 * F, act, F, T, F, stream));
    TS_ENQ(gemm.Linear(dt, act, L.wdown, tmp, T, D, F, stream));
    TS_ENQ(AddLoraUpdates(plan, l, &LoraLayerDev::down, act, F, tmp, D));
  }
  TS_ENQ(RmsNorm(dt, tmp, out_norm, h, x, T, D, c.norm_eps, stream));
  LaunchKernel(GatherRowsKernel, n_logit_rows, 128, 0, stream, static_cast<const uint4*>(h),
               step_dev + sl.logit_rows, static_cast<uint4*>(hsel), D * static_cast<int>(elt) / 16);
  TS_ENQ(cudaGetLastError());
  TS_ENQ(gemm.LinearF32Out(dt, hsel, lm_head, logits_dev, n_logit_rows, c.vocab, D, stream));
  TS_ENQ(cudaMemcpyAsync(logits_host, logits_dev, size_t(n_logit_rows) * c.vocab * 4,
                         cudaMemcpyDeviceToHost, stream));
  TS_ENQ(cudaMemcpyAsync(sel_count_host, sel_count_dev,
                         size_t(c.n_layers) * c.max_batch * c.n_kv_heads * 4,
                         cudaMemcpyDeviceToHost, stream));
#undef TS_ENQ
  return cudaSuccess;
}

bool DeviceModel::Impl::Run(const std::vector<DeviceSeq>& batch, std::vector<float>* logits,
                            std::string* error, std::vector<float>* hidden) {
  stats = DeviceStepStats();
  // The device is per host thread; Forward may run on another thread than Create.
  if (cudaError_t e = cudaSetDevice(c.device); e != cudaSuccess) {
    *error = CudaError("cudaSetDevice", e);
    return false;
  }
  if (uploads_pending) {
    if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
      *error = CudaError("weight upload", e);
      return false;
    }
    uploads_pending = false;
  }
  if (batch.empty()) {
    logits->clear();
    return true;
  }
  StepLimits lim;
  lim.max_batch = c.max_batch;
  lim.max_tokens = c.max_tokens;
  lim.max_pages_per_seq = c.max_pages_per_seq;
  lim.page_size = c.page_size;
  lim.num_pages = c.num_pages;
  lim.vocab = c.vocab;
  if (!PlanStep(batch, lim, &plan, error)) return false;
  for (const LoraRun& run : plan.lora_runs)
    if (run.lora > static_cast<int>(loras.size()) || loras[run.lora - 1].block == nullptr) {
      *error = "LoRA adapter id " + std::to_string(run.lora) + " is not loaded";
      return false;
    }
  const int n_seq = plan.n_seq, nd = plan.nd, P = c.page_size, W = c.max_pages_per_seq;
  const int n_logit_rows = static_cast<int>(plan.logit_rows.size());
  const std::vector<DecodeGroup>& groups = plan.groups;
  const std::vector<int>& seq_len = plan.seq_len;
  const std::vector<int>& order = plan.order;
  // The step integers into the pinned staging block (uploaded in one copy).
  auto put = [&](size_t offset, const std::vector<int32_t>& v) {
    std::copy(v.begin(), v.end(), step_host + offset);
  };
  put(sl.ids, plan.ids);
  put(sl.positions, plan.positions);
  put(sl.new_indptr, plan.new_indptr);
  put(sl.seq_lens, plan.seq_lens);
  put(sl.page_indptr, plan.page_indptr);
  put(sl.page_indices, plan.page_indices);
  put(sl.q_indptr, plan.q_indptr);
  put(sl.logit_rows, plan.logit_rows);
  put(sl.hidden_spans, plan.hidden_spans);
  for (auto& L : layers)
    if (L.residency) L.residency->Invalidate(plan.written);

  std::string where;
  cudaError_t e = cudaMemcpyAsync(step_dev, step_host, sl.total * 4, cudaMemcpyHostToDevice, stream);
  if (e != cudaSuccess) {
    *error = CudaError("step upload", e);
    return false;
  }
  const bool graphable = c.cuda_graphs && c.device_pages == 0 && nd == n_seq &&
                         n_logit_rows == n_seq;
  GraphEntry* ge = nullptr;
  if (graphable) {
    GraphKey key{groups, plan.lora_runs};
    auto it = graphs.find(key);
    if (it != graphs.end() || graphs.size() < kMaxGraphs) ge = &graphs[key];
  }
  if (ge != nullptr && ge->exec == nullptr && ge->seen >= 1) {
    // Second sighting: capture (the first, eager run did the one-time attribute setup).
    cudaGraph_t graph = nullptr;
    e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
      const cudaError_t ee = Enqueue(plan, &where);
      e = cudaStreamEndCapture(stream, &graph);
      if (ee != cudaSuccess) e = ee;
    }
    if (e == cudaSuccess) e = cudaGraphInstantiate(&ge->exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
      *error = CudaError(("graph capture: " + where).c_str(), e);
      return false;
    }
  }
  if (ge != nullptr) ge->seen++;
  if (ge != nullptr && ge->exec != nullptr) {
    e = cudaGraphLaunch(ge->exec, stream);
    where = "cudaGraphLaunch";
    stats.graph_replayed = true;
  } else {
    e = Enqueue(plan, &where);
  }
  // Embeddings: the final-normed rows asked for, pooled per sequence on the device and copied
  // back after the step (never part of a captured graph).
  const int n_hidden = static_cast<int>(plan.hidden_spans.size() / 2);
  if (e == cudaSuccess && n_hidden > 0 && hidden != nullptr) {
    if (dt == DType::kBF16)
      LaunchKernel(PoolRowsKernel<__nv_bfloat16>, n_hidden, 128, 0, stream,
                   static_cast<const __nv_bfloat16*>(h), step_dev + sl.hidden_spans, hidden_dev,
                   c.dim);
    else
      LaunchKernel(PoolRowsKernel<__half>, n_hidden, 128, 0, stream,
                   static_cast<const __half*>(h), step_dev + sl.hidden_spans, hidden_dev, c.dim);
    e = cudaGetLastError();
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(hidden_host, hidden_dev, size_t(n_hidden) * c.dim * 4,
                          cudaMemcpyDeviceToHost, stream);
    if (e != cudaSuccess) where = "hidden rows";
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) {
    *error = CudaError(where.c_str(), e);
    return false;
  }
  logits->assign(logits_host, logits_host + size_t(n_logit_rows) * c.vocab);
  if (hidden != nullptr) hidden->assign(hidden_host, hidden_host + size_t(n_hidden) * c.dim);
  // Selection statistics, per decode sequence.
  stats.seqs.assign(n_seq, DeviceSeqStats());
  const int64_t tok_bytes = 2 * int64_t{c.head_dim} * int64_t(elt);  // K + V, one head
  const int64_t box_bytes = 2 * int64_t{c.head_dim} * int64_t(elt);  // min + max, one head
  for (const DecodeGroup& g : groups)
    for (int b = 0; b < g.size; ++b) {
      DeviceSeqStats& ss = stats.seqs[order[g.begin + b]];
      ss.decode = true;
      const int L = seq_len[g.begin + b];
      const int n_pages = (L + P - 1) / P, last_valid = L - (n_pages - 1) * P;
      const int64_t dense_bytes = int64_t{L} * c.n_kv_heads * tok_bytes;
      const int budget = std::min(g.att.budget_pages, W);
      const int n_sink = std::min(g.att.sink_pages, budget - 1);
      for (int l = 0; l < c.n_layers; ++l) {
        ss.kv_bytes_dense += dense_bytes;
        stats.pages_total += int64_t{n_pages} * c.n_kv_heads;
        if (!(g.att.quest && l >= g.att.dense_layers)) {
          ss.kv_bytes_read += dense_bytes;
          stats.pages_attended += int64_t{n_pages} * c.n_kv_heads;
          continue;
        }
        ss.pages_total += int64_t{n_pages} * c.n_kv_heads;
        for (int hh = 0; hh < c.n_kv_heads; ++hh) {
          const int cnt = sel_count_host[(size_t(l) * c.max_batch + g.begin + b) * c.n_kv_heads + hh];
          ss.pages_selected += cnt;
          stats.pages_attended += cnt;
          // The current page is always attended and holds last_valid tokens.
          ss.kv_bytes_read += (int64_t{cnt - 1} * P + last_valid) * tok_bytes;
          if (n_pages > budget) {
            ss.pages_scored += n_pages - 1 - n_sink;
            ss.kv_bytes_read += int64_t{n_pages - 1 - n_sink} * box_bytes;
          }
        }
      }
    }
  return true;
}

bool DeviceModel::Impl::FillKvRandom(const int32_t* pages, int n_pages, int64_t n_tokens,
                                     uint64_t seed, std::string* error) {
  const int P = c.page_size;
  if (n_tokens < 0 || n_pages < 0 || n_pages > c.max_pages_per_seq ||
      n_tokens > int64_t{n_pages} * P) {
    *error = "FillKvRandom: " + std::to_string(n_tokens) + " tokens do not fit " +
             std::to_string(n_pages) + " pages (max_pages_per_seq " +
             std::to_string(c.max_pages_per_seq) + ")";
    return false;
  }
  for (int i = 0; i < n_pages; ++i)
    if (pages[i] < 0 || pages[i] >= c.num_pages) {
      *error = "FillKvRandom: page " + std::to_string(pages[i]) + " is out of range";
      return false;
    }
  if (cudaError_t e = cudaSetDevice(c.device); e != cudaSuccess) {
    *error = CudaError("cudaSetDevice", e);
    return false;
  }
  const std::vector<int32_t> page_list(pages, pages + n_pages);
  for (auto& L : layers)
    if (L.residency) L.residency->Invalidate(page_list);
  std::copy(pages, pages + n_pages, step_host + sl.page_indices);
  step_host[sl.page_indptr] = 0;
  step_host[sl.page_indptr + 1] = n_pages;
  // Chunks of up to max_tokens rows of the qkv scratch, appended to every layer by the append
  // kernel (which keeps the boxes).
  for (int64_t done = 0; done < n_tokens; done += c.max_tokens) {
    const int n = static_cast<int>(std::min<int64_t>(c.max_tokens, n_tokens - done));
    step_host[sl.new_indptr] = 0;
    step_host[sl.new_indptr + 1] = n;
    step_host[sl.seq_lens] = static_cast<int32_t>(done + n);
    cudaError_t e =
        cudaMemcpyAsync(step_dev, step_host, sl.total * 4, cudaMemcpyHostToDevice, stream);
    for (int l = 0; l < c.n_layers && e == cudaSuccess; ++l) {
      // Values keyed by (seed, layer, position): the same whatever the chunking.
      const uint64_t s = seed * 1000003ull + uint64_t(l);
      const int64_t n_elems = int64_t{n} * qkv_dim, offset = done * qkv_dim;
      e = dt == DType::kBF16
              ? LaunchFillUniform(static_cast<__nv_bfloat16*>(qkv), n_elems, s, 1.f, stream, offset)
              : LaunchFillUniform(static_cast<__half*>(qkv), n_elems, s, 1.f, stream, offset);
      if (e != cudaSuccess) break;
      e = AppendPagedKv(AppendParams(l, 1, n), stream);
    }
    // The next chunk rewrites the pinned step block this one's copy reads.
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) {
      *error = CudaError("FillKvRandom", e);
      return false;
    }
  }
  return true;
}

DeviceModel::DeviceModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceModel::~DeviceModel() = default;

std::unique_ptr<DeviceModel> DeviceModel::Create(const DeviceModelConfig& config,
                                                 std::string* error) {
  auto impl = std::make_unique<Impl>();
  impl->c = config;
  if (!impl->Init(error)) return nullptr;
  return std::unique_ptr<DeviceModel>(new DeviceModel(std::move(impl)));
}

const DeviceModelConfig& DeviceModel::config() const { return impl_->c; }
const DeviceStepStats& DeviceModel::last_stats() const { return impl_->stats; }

int64_t DeviceModel::KvBytesPerPage(const DeviceModelConfig& c) {
  const int64_t per_layer = 2 * int64_t{c.n_kv_heads} * c.page_size * c.head_dim * 2 +  // K, V
                            2 * int64_t{c.n_kv_heads} * c.head_dim * 2;                   // boxes
  return per_layer * c.n_layers;
}

bool DeviceModel::SetWeight(WeightSlot slot, int layer, const float* data, int64_t count,
                            std::string* error) {
  Impl& m = *impl_;
  const DeviceModelConfig& c = m.c;
  const int64_t D = c.dim, F = c.ffn_dim, V = c.vocab;
  void* base = nullptr;
  int64_t offset = 0, expect = 0;  // elements
  const bool per_layer = slot != WeightSlot::kEmbedding && slot != WeightSlot::kOutputNorm &&
                         slot != WeightSlot::kLmHead;
  if (per_layer && (layer < 0 || layer >= c.n_layers)) {
    *error = "layer " + std::to_string(layer) + " is out of range";
    return false;
  }
  Impl::Layer* L = per_layer ? &m.layers[layer] : nullptr;
  switch (slot) {
    case WeightSlot::kEmbedding: base = m.embed; expect = V * D; break;
    case WeightSlot::kOutputNorm: base = m.out_norm; expect = D; break;
    case WeightSlot::kLmHead: base = m.lm_head; expect = V * D; break;
    case WeightSlot::kAttnNorm: base = L->attn_norm; expect = D; break;
    case WeightSlot::kWq: base = L->wqkv; expect = int64_t{m.qdim} * D; break;
    case WeightSlot::kWk: base = L->wqkv; offset = int64_t{m.qdim} * D; expect = int64_t{m.kdim} * D; break;
    case WeightSlot::kWv: base = L->wqkv; offset = int64_t{m.qdim + m.kdim} * D; expect = int64_t{m.kdim} * D; break;
    case WeightSlot::kWo: base = L->wo; expect = D * m.qdim; break;
    case WeightSlot::kFfnNorm: base = L->ffn_norm; expect = D; break;
    case WeightSlot::kWgate: base = L->wgu; expect = F * D; break;
    case WeightSlot::kWup: base = L->wgu; offset = F * D; expect = F * D; break;
    case WeightSlot::kWdown: base = L->wdown; expect = D * F; break;
    case WeightSlot::kBq:
      base = L->bqkv;
      expect = m.qdim;
      break;
    case WeightSlot::kBk:
      base = L->bqkv;
      offset = m.qdim;
      expect = m.kdim;
      break;
    case WeightSlot::kBv:
      base = L->bqkv;
      offset = m.qdim + m.kdim;
      expect = m.kdim;
      break;
    case WeightSlot::kQNorm:
      base = L->q_norm;
      expect = c.head_dim;
      break;
    case WeightSlot::kKNorm:
      base = L->k_norm;
      expect = c.head_dim;
      break;
  }
  if (base == nullptr) {
    *error = "a bias or Q/K-norm slot without config qkv_bias or qk_norm";
    return false;
  }
  if (count != expect || data == nullptr) {
    *error = "weight has " + std::to_string(count) + " elements, expected " +
             std::to_string(expect);
    return false;
  }
  const std::vector<uint16_t> conv = ConvertTo16(data, count, c.bf16);
  cudaError_t e = cudaMemcpy(static_cast<char*>(base) + offset * 2, conv.data(), count * 2,
                             cudaMemcpyHostToDevice);
  // A pageable copy may return before its DMA lands, and Forward's non-blocking stream is not
  // ordered after the legacy stream: the next step waits for the device first.
  m.uploads_pending = true;
  if (e != cudaSuccess) {
    *error = CudaError("weight upload", e);
    return false;
  }
  return true;
}

int DeviceModel::AddLora(const std::vector<DeviceLoraLayer>& layers, std::string* error) {
  return impl_->AddLora(layers, error);
}

void DeviceModel::RemoveLora(int id) {
  Impl& m = *impl_;
  if (id < 1 || id > static_cast<int>(m.loras.size()) || m.loras[id - 1].block == nullptr) return;
  cudaSetDevice(m.c.device);
  m.DropGraphs(id);
  cudaFree(m.loras[id - 1].block);  // waits for the device (no step is in flight between calls)
  m.loras[id - 1] = Impl::Lora();
}

bool DeviceModel::Forward(const std::vector<DeviceSeq>& batch, std::vector<float>* logits,
                          std::string* error, std::vector<float>* hidden) {
  return impl_->Run(batch, logits, error, hidden);
}

bool DeviceModel::FillKvRandom(const int32_t* pages, int n_pages, int64_t n_tokens, uint64_t seed,
                               std::string* error) {
  return impl_->FillKvRandom(pages, n_pages, n_tokens, seed, error);
}

}  // namespace tinyserve::cuda
