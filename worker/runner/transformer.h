// File: worker/runner/transformer.h
// The model runner: a decoder-only transformer (Llama family or GPT-2) over the paged KV cache.
//
// A runner is created for (rank, world_size) and loads only its shard, Megatron-style: query
// and KV heads split across ranks (KV heads replicated when world_size exceeds them and is a
// multiple), MLP gate/up split by rows (output features) and down by columns, the attention
// output projection split by columns; partial sums are all-reduced after the attention output
// and the MLP down projections. Embedding and LM head are replicated on every rank.
//
// Forward runs a batch of sequences in one pass: every matrix product sees all new tokens of
// all sequences (prefill chunks and decode tokens together); attention is per sequence over its
// page table. The caller (the engine) owns the page tables and allocates pages beforehand.
//
// Thread safety: one Forward at a time (the engine thread); it parallelises internally on the
// thread pool.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/thread_pool.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "worker/kv/paged_kv_cache.h"
#include "worker/model/lora_adapter.h"
#include "worker/model/model_config.h"
#include "worker/runner/attention_selector.h"

namespace tinyserve {

class Communicator;
class WeightSource;

struct RunnerOptions {
  int rank = 0;
  int world_size = 1;
  Communicator* comm = nullptr;  // required when world_size > 1
  ThreadPool* pool = nullptr;    // null: single-threaded
  int max_positions = 0;         // RoPE table size; 0: the model's max context
  // A decode token's attention over more pages than this (for one KV head) is split into parts
  // of this many pages, attended in parallel and merged (flash-decoding); tests lower it.
  int attention_part_pages = 64;
};

struct SeqInput {
  const int32_t* tokens = nullptr;  // [n] new tokens
  int n = 0;
  int64_t start_pos = 0;            // tokens already in the cache for this sequence
  const std::vector<int32_t>* pages = nullptr;  // covers positions [0, start_pos + n)
  bool all_logits = false;          // logits for every new token, else only the last
  // The n > 1 rows are attended as n single-token decode steps would be (the rows speculative
  // decoding verifies), bit-identical per row to a decode step at that position: densely with
  // the K/V read once for all rows, or, on layers where the selector is active, row by row, each
  // selecting its pages (SelectArgs::row) as its own step would. Otherwise n > 1 rows are a
  // prefill chunk.
  bool decode_rows = false;
  AttentionSelector* selector = nullptr;  // decode token selection; null = dense
  int lora = 0;  // a LoRA adapter's id (TransformerRunner::AddLora); 0: the base model
  // Embeddings: the rows' hidden states after the final norm go into pooled [dim]: kLast
  // writes the last row's, kMean adds the sum of all n rows' (the caller zeroes it first and
  // divides by the token count after the last chunk).
  Pooling pooling = Pooling::kNone;
  float* pooled = nullptr;
};

// Time spent per phase in the last Forward (seconds), for instrumentation.
struct ForwardTimings {
  double matmul = 0, attention = 0, select = 0, other = 0;
};

class TransformerRunner {
 public:
  static absl::StatusOr<std::unique_ptr<TransformerRunner>> Create(const WeightSource& source,
                                                                   const RunnerOptions& options);

  const ModelConfig& config() const { return config_; }
  int local_heads() const { return heads_local_; }
  int local_kv_heads() const { return kv_local_; }
  // A KV cache config matching this rank's shard.
  KvCacheConfig MakeKvConfig(int page_size, int64_t num_pages) const;
  // Bytes of weights this rank reads per token (for the bytes-moved floor).
  int64_t WeightBytes() const { return weight_bytes_; }

  // Logits rows in batch order: n rows for an all_logits sequence, else 1. [rows][vocab].
  absl::Status Forward(const std::vector<SeqInput>& batch, PagedKvCache* kv,
                       std::vector<float>* logits);
  const ForwardTimings& last_timings() const { return timings_; }

  // Adds a LoRA adapter (this rank's shard of its updates, in F32 with its scale folded into B)
  // and returns its id for SeqInput::lora: 1, 2, ... in the order added. A row with an adapter
  // gets y = x·Wᵀ + scale·(x·Aᵀ)·Bᵀ on each weight the adapter updates, as llama.cpp computes
  // it; rows of other adapters or none in the same batch are untouched.
  absl::StatusOr<int> AddLora(const LoraAdapter& adapter);
  int num_loras() const { return static_cast<int>(loras_.size()); }

  // One weight's update (this rank's rows or columns): a [r][in], and B transposed with the
  // scale folded in, bt [r][out], so that the update of a row is out += sum_j (a_j·x) bt_j, r
  // vector updates of length out; a.rows == 0: none.
  struct LoraDelta {
    Matrix a;
    std::vector<float> bt;
  };
  struct LoraLayer {
    LoraDelta q, k, v, o, gate, up, down;
  };
  // Runtime loading, in two halves: PrepareLora reads and reshapes an adapter (the slow part;
  // const, so it may run beside Forward on another thread), InstallLora adds it between
  // Forwards and returns its id. RemoveLora frees an adapter's weights; its id is never given
  // again, and no row may name it afterwards.
  using PreparedLora = std::vector<LoraLayer>;  // [layer]
  absl::StatusOr<PreparedLora> PrepareLora(const LoraAdapter& adapter) const;
  int InstallLora(PreparedLora lora);
  void RemoveLora(int id);

 private:
  struct Layer {
    std::vector<float> attn_norm_w, attn_norm_b, ffn_norm_w, ffn_norm_b;
    Matrix wq, wk, wv, wo, w_gate, w_up, w_down;
    std::vector<float> bq, bk, bv, bo, b_up, b_down;  // empty when absent (or not this rank's)
    std::vector<float> q_norm, k_norm;                // [head_dim] with config qk_norm
    std::vector<float> post_attn_norm, post_ffn_norm;  // [dim] with config post_norms
  };

  // This rank's slices: query rows [q0, q1) of qd, KV rows [k0, k1) of kd, MLP rows [f0, f1).
  struct ShardRanges {
    int64_t qd, kd, q0, q1, k0, k1, f0, f1;
  };
  ShardRanges Shard() const;

  TransformerRunner() = default;
  absl::Status Load(const WeightSource& source);
  void Norm(const float* x, const std::vector<float>& w, const std::vector<float>& b, float* y)
      const;
  absl::Status AllReduce(float* data, size_t n);
  // row0[s]: the first row of sequence s (row0.back() = rows); seq_of_row[t]: row t's sequence.
  void Attention(int layer, const std::vector<SeqInput>& batch, const std::vector<int>& row0,
                 const std::vector<int>& seq_of_row, PagedKvCache* kv);

  ModelConfig config_;
  RunnerOptions options_;
  int heads_local_ = 0, kv_local_ = 0, kv_start_ = 0, head_start_ = 0, ffn_local_ = 0;
  int group_ = 1;
  Matrix token_embd_, position_embd_, output_;
  std::vector<float> output_norm_w_, output_norm_b_;
  std::vector<Layer> layers_;
  std::vector<std::vector<LoraLayer>> loras_;  // [adapter id - 1][layer]
  std::unique_ptr<RopeTable> rope_;
  std::unique_ptr<RopeTable> rope_swa_;  // sliding layers' (config rope_theta_swa), if any
  int64_t weight_bytes_ = 0;
  ForwardTimings timings_;

  // Scratch, reused across calls: [T][...] activations.
  std::vector<float> x_, xn_, q_, k_, v_, att_, proj_, gate_, up_, hidden_, lora_r_;
};

// Rows [r0, r1), columns [c0, c1) of a 2-D tensor (ne[0] elements per row), as floats;
// InvalidArgument naming the tensor when a value is not finite.
absl::StatusOr<std::vector<float>> TensorBlock(const TensorRef& t, int64_t r0, int64_t r1,
                                               int64_t c0, int64_t c1);

// Opens each adapter against the runner's model and adds it (ids 1, 2, ... in order). Names must
// be distinct; an error names the adapter and what is wrong with it.
absl::StatusOr<std::vector<LoraInfo>> AddLoras(const std::vector<LoraModule>& modules,
                                               TransformerRunner* runner);
// The same for any runner: `add` installs an opened adapter and returns its id.
absl::StatusOr<std::vector<LoraInfo>> AddLoras(
    const std::vector<LoraModule>& modules, const ModelConfig& base,
    const std::function<absl::StatusOr<int>(const LoraAdapter&)>& add);

}  // namespace tinyserve
