// File: kernels/cuda/device_model.h
// The whole Llama-family forward on one GPU, built from the kernels of this folder: weights in
// f16/bf16 on the device (uploaded from host floats), the paged KV cache (paged_kv.cuh) with its
// key boxes, and a Forward over a batch of sequences that mixes prefill chunks and decode tokens,
// like the CPU runner's. Plain C++ header (no CUDA types): worker/runner/cuda_runner.cc adapts it
// to the engine's runner interface; the kernels-only build tests it against a CPU reference.
//
// Forward, per layer: RMSNorm (+ residual), fused QKV GEMM (cuBLAS), RoPE (with Qwen3's per-head
// Q/K norms fused in front), KV append (+ boxes),
// attention, O GEMM, RMSNorm (+ residual), fused gate|up GEMM, SwiGLU, down GEMM; then the final
// norm and the LM head on the rows that need logits (f32 out). Attention: prefill rows through
// the causal prefill kernel; decode rows (one token per sequence) through the dense or the fused
// Quest decode kernel, per group of sequences sharing one attention spec.
//
// CUDA graphs: a step made only of decode tokens is captured the second time its shape (the
// sizes and attention specs of its groups) is seen and replayed afterwards; per-step values
// (ids, positions, lengths, page tables) live in fixed device buffers uploaded before the launch.
//
// Tiered KV (device_pages > 0): the K/V of layers >= resident_layers live at home in pinned,
// mapped host memory; the device keeps `device_pages` pages of each such layer in slots, managed
// by PageResidency. A decode step selects on the device (boxes stay on the device), reads the
// selected page lists back, makes those pages resident (one copy kernel per layer for the
// misses) and attends over the slots; when a step needs more pages than the slots hold it attends
// over home memory directly. Appends and prefill attention use home memory. Tiered steps are not
// captured in graphs (they synchronise per layer).
//
// Thread safety: one Forward at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tinyserve::cuda {

struct DeviceModelConfig {
  int n_layers = 0, dim = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, ffn_dim = 0, vocab = 0;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.f;
  bool rope_adjacent = false;  // (2i, 2i+1) pairs (GGUF Llama), else rotate-half (HF Llama)
  float rope_freq_scale = 1.f;           // linear RoPE scaling (RopeParams)
  std::vector<float> rope_freq_factors;  // Llama 3's (or YaRN's) per-pair divisors; empty: none
  float rope_attn_factor = 1.f;          // YaRN: cos and sin scaled by it
  bool qkv_bias = false;                 // Q/K/V biases (Qwen2): weight slots kBq, kBk, kBv
  bool qk_norm = false;                  // per-head Q/K RMSNorms (Qwen3): slots kQNorm, kKNorm
  bool bf16 = false;           // weights, activations and KV in bf16 instead of f16
  int page_size = 16;          // a power of two <= 32
  int num_pages = 0;           // KV pool: physical pages (each page_size tokens of every layer)
  int max_batch = 16;          // sequences per Forward
  int max_tokens = 512;        // token rows per Forward
  int max_pages_per_seq = 0;   // ceil(max context / page_size)
  int device_pages = 0;        // tiered KV: device slots per tiered layer; 0: all on the device
  int resident_layers = 2;     // tiered KV: layers [0, resident_layers) stay wholly on the device
  bool cuda_graphs = true;
  int device = 0;              // CUDA device ordinal
};

// Weights are set one tensor at a time as host floats in the nn.Linear layout [out][in].
enum class WeightSlot {
  kEmbedding,   // [vocab][dim]
  kOutputNorm,  // [dim]
  kLmHead,      // [vocab][dim]
  kAttnNorm,    // [dim], per layer
  kWq,          // [n_heads * head_dim][dim]
  kWk,          // [n_kv_heads * head_dim][dim]
  kWv,          // [n_kv_heads * head_dim][dim]
  kWo,          // [dim][n_heads * head_dim]
  kFfnNorm,     // [dim]
  kWgate,       // [ffn_dim][dim]
  kWup,         // [ffn_dim][dim]
  kWdown,       // [dim][ffn_dim]
  kBq,          // [n_heads * head_dim], per layer, with config qkv_bias
  kBk,          // [n_kv_heads * head_dim]
  kBv,          // [n_kv_heads * head_dim]
  kQNorm,       // [head_dim], per layer, with config qk_norm
  kKNorm,       // [head_dim]
};

// How a decode token attends (ignored for prefill rows, which are always dense).
struct DeviceAttention {
  bool quest = false;
  int budget_pages = 0;   // Quest: pages attended per (layer, KV head), current page included
  int sink_pages = 1;     // Quest: first pages always kept
  int dense_layers = 2;   // Quest: the first N layers attend densely
  bool gqa_max = false;   // Quest: aggregate the group's page scores by max (else sum)
  bool operator==(const DeviceAttention& o) const {
    return quest == o.quest && (!quest || (budget_pages == o.budget_pages &&
                                           sink_pages == o.sink_pages &&
                                           dense_layers == o.dense_layers && gqa_max == o.gqa_max));
  }
};

struct DeviceSeq {
  const int32_t* tokens = nullptr;  // [n] new tokens
  int n = 0;
  int64_t start_pos = 0;            // tokens already in the cache
  const int32_t* pages = nullptr;   // physical pages covering [0, start_pos + n)
  int n_pages = 0;
  bool all_logits = false;          // logits for every new token, else the last only
  bool hidden = false;              // return its rows' hidden states, summed (Forward's *hidden)
  bool hidden_last = false;         // with hidden: the last row's only
  DeviceAttention attention;        // used when n == 1
  int lora = 0;                     // a LoRA adapter's id (DeviceModel::AddLora); 0: none
};

// A LoRA adapter's update of one of a layer's four products (the fused QKV, O, the fused
// gate|up, down), host floats: y += (x·aᵀ)·bᵀ with a [rank][in] and b [out][rank] (nn.Linear
// layouts). For a fused product each part's A rows are stacked in `a` and its B sits in its own
// rows and A columns of `b`, zeros elsewhere; the adapter's scale is folded into b. rank 0: the
// adapter leaves the product alone.
struct DeviceLoraUpdate {
  int rank = 0;
  std::vector<float> a, b;
};
struct DeviceLoraLayer {
  DeviceLoraUpdate qkv, o, gate_up, down;
};

// Selection accounting of one decode sequence in one step, as worker/select's StepStats counts
// it: pages over the selecting layers (quest, layer >= dense_layers) and heads; bytes over all
// layers (dense layers count on both sides), boxes included in what Quest reads.
struct DeviceSeqStats {
  bool decode = false;  // false for prefill rows (nothing counted)
  int64_t pages_scored = 0, pages_selected = 0, pages_total = 0;
  int64_t kv_bytes_read = 0, kv_bytes_dense = 0;
};

// What the last Forward did (decode attention and the tiered cache).
struct DeviceStepStats {
  std::vector<DeviceSeqStats> seqs;  // batch order
  int64_t pages_attended = 0;  // over (layer, decode sequence, KV head)
  int64_t pages_total = 0;     // what dense would have attended over the same
  // Tiered KV, summed over the tiered layers.
  int64_t tier_hits = 0, tier_misses = 0;
  int64_t bytes_moved = 0;     // host -> device page copies
  int64_t bytes_direct = 0;    // K/V read from home memory by attention over capacity
  bool graph_replayed = false;
};

class DeviceModel {
 public:
  // Allocates weights, the KV cache and scratch on the device. Null (and *error) on failure:
  // no device, unsupported shape (head_dim 64 or 128, GQA group <= 8), out of memory.
  static std::unique_ptr<DeviceModel> Create(const DeviceModelConfig& config, std::string* error);
  ~DeviceModel();
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;

  const DeviceModelConfig& config() const;
  // Uploads one tensor (count floats, converted to the model dtype). layer is ignored for the
  // model-wide slots. False (and *error) on a wrong count or a CUDA failure.
  bool SetWeight(WeightSlot slot, int layer, const float* data, int64_t count,
                 std::string* error);
  // Runs the batch; logits rows in batch order (n rows for all_logits sequences, else 1),
  // [rows][vocab]; with `hidden`, one row per sequence that asks (DeviceSeq::hidden), in batch
  // order, [sequences][hidden size]: the f32 sum of its rows' final-normed hidden states (the
  // last row's alone with hidden_last), pooled on the device (embeddings). False (and *error)
  // on bad input or a CUDA failure.
  bool Forward(const std::vector<DeviceSeq>& batch, std::vector<float>* logits, std::string* error,
               std::vector<float>* hidden = nullptr);
  const DeviceStepStats& last_stats() const;
  // Uploads a LoRA adapter (one DeviceLoraLayer per layer, converted to the model dtype) and
  // returns its id for DeviceSeq::lora: 1, 2, ... in the order added, never reused. A row with an
  // adapter gets each updated product through two more GEMMs over the consecutive rows sharing
  // it (the step plan puts a decode group's rows of one adapter together). 0 (and *error) on a
  // shape that does not fit the model or a CUDA failure.
  int AddLora(const std::vector<DeviceLoraLayer>& layers, std::string* error);
  // Frees an adapter's device memory (and the CUDA graphs that name it); no sequence may name it
  // afterwards.
  void RemoveLora(int id);
  // For benchmarks: fills positions [0, n_tokens) of the sequence owning `pages` (as a Forward
  // would take them) with random keys and values, uniform in [-1, 1) from `seed`, in every
  // layer, key boxes included, as a prefill of that length leaves the cache (a real prefill of
  // a 32K context takes seconds). False (and *error) on bad pages or a CUDA failure.
  bool FillKvRandom(const int32_t* pages, int n_pages, int64_t n_tokens, uint64_t seed,
                    std::string* error);
  // Bytes of device memory the KV cache (K, V and boxes of every layer) takes per page.
  static int64_t KvBytesPerPage(const DeviceModelConfig& config);

 private:
  struct Impl;
  explicit DeviceModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tinyserve::cuda
