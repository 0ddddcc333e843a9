// End-to-end decode step of a TinyLlama-1.1B-shaped model (22 layers, dim 2048, 32 q heads,
// 4 kv heads, d 64, ffn 5632, vocab 32000) with random f16 weights made on the device: embedding;
// per layer RMSNorm, fused QKV GEMM, RoPE, KV append (+ boxes), attention (dense or Quest),
// O-proj, residual + RMSNorm, fused gate|up GEMM, SwiGLU, down GEMM, residual; final norm, LM
// head, argmax. One step is captured in a CUDA graph and replayed; sequence lengths advance on
// the device. The "prefill" is faked: random K/V appended in chunks by the append kernel (so the
// boxes are the kernel's own). Quest runs on layers >= 2 (the first two stay dense, as Quest
// and the TinyServe spec do). Writes JSON lines to --out.
//
// Usage: cuda_e2e_decode_bench --out FILE [--contexts 8192,32768] [--batches 1,16]
//        [--budget 2048] [--steps 20]
#include <cmath>
#include <vector>

#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/bench/bench_util.cuh"
#include "kernels/cuda/decode_attention.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/kv_append.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/sampling.cuh"

namespace tinyserve::cuda::bench {
namespace {

using T = __half;
constexpr DType kDT = DType::kF16;
constexpr int kLayers = 22, kDim = 2048, kHq = 32, kHkv = 4, kD = 64, kFfn = 5632,
              kVocab = 32000, kPage = 16, kDenseLayers = 2;
constexpr int kQkv = (kHq + 2 * kHkv) * kD;  // 2560
constexpr float kEps = 1e-5f;

#define CHECK_OK(stmt)                                                                   \
  do {                                                                                   \
    cudaError_t e_ = (stmt);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s failed: %s (%s)\n", #stmt, cudaGetErrorString(e_),        \
                   LastLaunchError());                                                   \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

T* Alloc(size_t elems) {
  T* p;
  TS_CUDA_CHECK(cudaMalloc(&p, elems * sizeof(T)));
  return p;
}

struct Layer {
  T *attn_norm, *wqkv, *wo, *ffn_norm, *wgu, *wdown;
  T *k, *v, *kmin, *kmax;
};

// seq_lens[b] += 1 (the token appended this step); positions[b] = its position.
__global__ void AdvanceKernel(int32_t* seq_lens, int32_t* positions, int batch) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < batch) positions[b] = seq_lens[b]++;
}

void RunConfig(JsonLines& out, CublasGemm& gemm, int batch, int context, int budget, int steps,
               std::vector<Layer>& layers, T* embed, T* final_norm, T* lm_head) {
  const int capacity = context + steps + 16;
  const int pages_per_seq = (capacity + kPage - 1) / kPage;
  const PagedKvLayout lay{pages_per_seq * batch, kHkv, kPage, kD};
  for (Layer& l : layers) {
    l.k = Alloc(lay.KvElements());
    l.v = Alloc(lay.KvElements());
    l.kmin = Alloc(lay.MetaElements());
    l.kmax = Alloc(lay.MetaElements());
  }
  // Page tables (shared by all layers): sequence b owns pages [b*pps, (b+1)*pps).
  std::vector<int32_t> h_indptr(batch + 1), h_idx(size_t(batch) * pages_per_seq);
  for (int b = 0; b <= batch; ++b) h_indptr[b] = b * pages_per_seq;
  for (size_t i = 0; i < h_idx.size(); ++i) h_idx[i] = static_cast<int32_t>(i);
  int32_t *indptr, *idx, *lens, *pos, *new_indptr, *ids;
  TS_CUDA_CHECK(cudaMalloc(&indptr, (batch + 1) * 4));
  TS_CUDA_CHECK(cudaMalloc(&idx, h_idx.size() * 4));
  TS_CUDA_CHECK(cudaMalloc(&lens, batch * 4));
  TS_CUDA_CHECK(cudaMalloc(&pos, batch * 4));
  TS_CUDA_CHECK(cudaMalloc(&new_indptr, (batch + 1) * 4));
  TS_CUDA_CHECK(cudaMalloc(&ids, batch * 4));
  TS_CUDA_CHECK(cudaMemcpy(indptr, h_indptr.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
  TS_CUDA_CHECK(cudaMemcpy(idx, h_idx.data(), h_idx.size() * 4, cudaMemcpyHostToDevice));
  TS_CUDA_CHECK(cudaMemset(ids, 0, batch * 4));

  // Fake prefill: chunks of random K/V through the append kernel, every layer.
  const int chunk = 2048;
  T* kn = Alloc(size_t(batch) * chunk * kHkv * kD);
  T* vn = Alloc(size_t(batch) * chunk * kHkv * kD);
  for (int done = 0; done < context; done += chunk) {
    const int c = std::min(chunk, context - done);
    std::vector<int32_t> nip(batch + 1), len_after(batch, done + c);
    for (int b = 0; b <= batch; ++b) nip[b] = b * c;
    TS_CUDA_CHECK(cudaMemcpy(new_indptr, nip.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
    TS_CUDA_CHECK(cudaMemcpy(lens, len_after.data(), batch * 4, cudaMemcpyHostToDevice));
    for (int li = 0; li < kLayers; ++li) {
      FillUniform(kn, int64_t{batch} * c * kHkv * kD, 1000 + li * 7919 + done, 1.f);
      FillUniform(vn, int64_t{batch} * c * kHkv * kD, 2000 + li * 7919 + done, 1.f);
      KvAppendParams ap;
      ap.dtype = kDT;
      ap.layout = lay;
      ap.batch = batch;
      ap.k_new = kn;
      ap.v_new = vn;
      ap.new_stride = kHkv * kD;
      ap.new_indptr = new_indptr;
      ap.seq_lens = lens;
      ap.page_indptr = indptr;
      ap.page_indices = idx;
      ap.max_new_per_seq = c;
      ap.k_cache = layers[li].k;
      ap.v_cache = layers[li].v;
      ap.kmin = layers[li].kmin;
      ap.kmax = layers[li].kmax;
      CHECK_OK(AppendPagedKv(ap, nullptr));
    }
  }
  TS_CUDA_CHECK(cudaDeviceSynchronize());
  TS_CUDA_CHECK(cudaFree(kn));
  TS_CUDA_CHECK(cudaFree(vn));
  {
    std::vector<int32_t> nip(batch + 1);
    for (int b = 0; b <= batch; ++b) nip[b] = b;  // decode: one new token per sequence
    TS_CUDA_CHECK(cudaMemcpy(new_indptr, nip.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
  }

  // Activations.
  T* x = Alloc(size_t(batch) * kDim);       // residual stream
  T* h = Alloc(size_t(batch) * kDim);       // normed
  T* qkv = Alloc(size_t(batch) * kQkv);
  T* attn = Alloc(size_t(batch) * kHq * kD);
  T* tmp = Alloc(size_t(batch) * kDim);
  T* gu = Alloc(size_t(batch) * 2 * kFfn);
  T* act = Alloc(size_t(batch) * kFfn);
  T* logits = Alloc(size_t(batch) * kVocab);

  DecodeAttentionParams ap;
  ap.dtype = kDT;
  ap.layout = lay;
  ap.batch = batch;
  ap.num_q_heads = kHq;
  ap.q = qkv;
  ap.q_stride = kQkv;
  ap.out = attn;
  ap.out_stride = kHq * kD;
  ap.page_indptr = indptr;
  ap.page_indices = idx;
  ap.seq_lens = lens;
  ap.max_pages_per_seq = pages_per_seq;
  ap.budget_pages = budget / kPage;
  size_t ws_bytes = std::max(DecodeWorkspaceBytes(ap, false), DecodeWorkspaceBytes(ap, true));
  void* ws;
  TS_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  ap.workspace = ws;
  ap.workspace_bytes = ws_bytes;

  cudaStream_t stream;
  TS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const char* mode : {"dense", "quest"}) {
    const bool quest = std::string(mode) == "quest";
    // Reset the lengths to the context: each mode starts from the same cache.
    std::vector<int32_t> len0(batch, context);
    TS_CUDA_CHECK(cudaMemcpy(lens, len0.data(), batch * 4, cudaMemcpyHostToDevice));
    auto step = [&] {
      AdvanceKernel<<<(batch + 127) / 128, 128, 0, stream>>>(lens, pos, batch);
      TS_CUDA_CHECK(cudaGetLastError());
      CHECK_OK(EmbeddingLookup(kDT, embed, ids, x, batch, kVocab, kDim, stream));
      for (int li = 0; li < kLayers; ++li) {
        const Layer& L = layers[li];
        CHECK_OK(RmsNorm(kDT, li == 0 ? x : tmp, L.attn_norm, h, li == 0 ? nullptr : x, batch,
                         kDim, kEps, stream));
        CHECK_OK(gemm.Linear(kDT, h, L.wqkv, qkv, batch, kQkv, kDim, stream));
        RopeParams rp;
        rp.dtype = kDT;
        rp.q = qkv;
        rp.q_stride = kQkv;
        rp.k = qkv + kHq * kD;
        rp.k_stride = kQkv;
        rp.positions = pos;
        rp.tokens = batch;
        rp.num_q_heads = kHq;
        rp.num_kv_heads = kHkv;
        rp.head_dim = kD;
        rp.style = RopeStyle::kRotateHalf;
        CHECK_OK(ApplyRope(rp, stream));
        KvAppendParams kp;
        kp.dtype = kDT;
        kp.layout = lay;
        kp.batch = batch;
        kp.k_new = qkv + kHq * kD;
        kp.v_new = qkv + (kHq + kHkv) * kD;
        kp.new_stride = kQkv;
        kp.new_indptr = new_indptr;
        kp.seq_lens = lens;
        kp.page_indptr = indptr;
        kp.page_indices = idx;
        kp.max_new_per_seq = 1;
        kp.k_cache = L.k;
        kp.v_cache = L.v;
        kp.kmin = L.kmin;
        kp.kmax = L.kmax;
        CHECK_OK(AppendPagedKv(kp, stream));
        DecodeAttentionParams a = ap;
        a.k_cache = L.k;
        a.v_cache = L.v;
        a.kmin = L.kmin;
        a.kmax = L.kmax;
        if (quest && li >= kDenseLayers) {
          CHECK_OK(QuestDecodeAttention(a, stream));
        } else {
          CHECK_OK(DenseDecodeAttention(a, stream));
        }
        CHECK_OK(gemm.Linear(kDT, attn, L.wo, tmp, batch, kDim, kHq * kD, stream));
        CHECK_OK(RmsNorm(kDT, tmp, L.ffn_norm, h, x, batch, kDim, kEps, stream));
        CHECK_OK(gemm.Linear(kDT, h, L.wgu, gu, batch, 2 * kFfn, kDim, stream));
        CHECK_OK(SwiGlu(kDT, gu, 2 * kFfn, gu + kFfn, 2 * kFfn, act, kFfn, batch, kFfn, stream));
        CHECK_OK(gemm.Linear(kDT, act, L.wdown, tmp, batch, kDim, kFfn, stream));
      }
      CHECK_OK(RmsNorm(kDT, tmp, final_norm, h, x, batch, kDim, kEps, stream));
      CHECK_OK(gemm.Linear(kDT, h, lm_head, logits, batch, kVocab, kDim, stream));
      CHECK_OK(ArgmaxRows(kDT, logits, batch, kVocab, ids, stream));
    };
    step();  // eager warm-up: module loads, attributes, cuBLAS heuristics
    TS_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    TS_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    step();
    TS_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    TS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) TS_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TS_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaEvent_t e0, e1;
    TS_CUDA_CHECK(cudaEventCreate(&e0));
    TS_CUDA_CHECK(cudaEventCreate(&e1));
    TS_CUDA_CHECK(cudaEventRecord(e0, stream));
    for (int i = 0; i < steps; ++i) TS_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TS_CUDA_CHECK(cudaEventRecord(e1, stream));
    TS_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    TS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    std::vector<int32_t> tok(batch);
    TS_CUDA_CHECK(cudaMemcpy(tok.data(), ids, batch * 4, cudaMemcpyDeviceToHost));
    const double step_ms = ms / steps;
    out.Write("{\"kind\":\"e2e\",\"model\":\"tinyllama-1.1b-random-f16\",\"mode\":\"%s\","
              "\"batch\":%d,\"context\":%d,\"budget\":%d,\"dense_layers\":%d,\"steps\":%d,"
              "\"ms_per_step\":%.4f,\"tok_per_s\":%.1f,\"last_token_b0\":%d}",
              mode, batch, context, quest ? budget : 0, quest ? kDenseLayers : kLayers, steps,
              step_ms, batch * 1000.0 / step_ms, tok[0]);
    TS_CUDA_CHECK(cudaEventDestroy(e0));
    TS_CUDA_CHECK(cudaEventDestroy(e1));
    TS_CUDA_CHECK(cudaGraphExecDestroy(exec));
    TS_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  TS_CUDA_CHECK(cudaStreamDestroy(stream));
  for (void* p : std::initializer_list<void*>{x, h, qkv, attn, tmp, gu, act, logits, ws, indptr,
                                              idx, lens, pos, new_indptr, ids})
    TS_CUDA_CHECK(cudaFree(p));
  for (Layer& l : layers)
    for (T* p : {l.k, l.v, l.kmin, l.kmax}) TS_CUDA_CHECK(cudaFree(p));
}

}  // namespace
}  // namespace tinyserve::cuda::bench

int main(int argc, char** argv) {
  using namespace tinyserve::cuda;
  using namespace tinyserve::cuda::bench;
  if (!HaveDevice()) return 2;
  JsonLines out(Arg(argc, argv, "--out"));
  const auto contexts = IntList(Arg(argc, argv, "--contexts"), {8192, 32768});
  const auto batches = IntList(Arg(argc, argv, "--batches"), {1, 16});
  const std::string b = Arg(argc, argv, "--budget"), s = Arg(argc, argv, "--steps");
  const int budget = b.empty() ? 2048 : std::atoi(b.c_str());
  const int steps = s.empty() ? 20 : std::atoi(s.c_str());
  CublasGemm gemm;
  if (!gemm.Init()) {
    std::fprintf(stderr, "cuBLAS init failed: %s\n", LastLaunchError());
    return 1;
  }
  // Random weights, scaled by 1/sqrt(fan_in) so activations stay O(1).
  std::vector<Layer> layers(kLayers);
  uint64_t seed = 1;
  auto weight = [&](size_t rows, size_t cols) {
    T* p = Alloc(rows * cols);
    FillUniform(p, int64_t(rows * cols), seed++, 1.f / std::sqrt(float(cols)));
    return p;
  };
  auto norm_w = [&] {
    T* p = Alloc(kDim);
    FillUniform(p, kDim, seed++, 0.1f);  // then shifted to ~1 below
    return p;
  };
  std::vector<T> ones(kDim, __float2half(1.f));
  auto ones_w = [&] {
    T* p = norm_w();
    TS_CUDA_CHECK(cudaMemcpy(p, ones.data(), kDim * sizeof(T), cudaMemcpyHostToDevice));
    return p;
  };
  for (Layer& l : layers) {
    l.attn_norm = ones_w();
    l.wqkv = weight(kQkv, kDim);
    l.wo = weight(kDim, kHq * kD);
    l.ffn_norm = ones_w();
    l.wgu = weight(2 * kFfn, kDim);
    l.wdown = weight(kDim, kFfn);
  }
  T* embed = weight(kVocab, kDim);
  T* final_norm = ones_w();
  T* lm_head = weight(kVocab, kDim);
  TS_CUDA_CHECK(cudaDeviceSynchronize());
  for (int ctx : contexts)
    for (int bt : batches) RunConfig(out, gemm, bt, ctx, budget, steps, layers, embed, final_norm, lm_head);
  return 0;
}
