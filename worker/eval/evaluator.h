// File: worker/eval/evaluator.h
// Quality and speed of token-selection policies against dense attention on real text, the way
// Quest evaluates (shared/reference/sparse-attention.md §3.2, §7.1):
//   - prefill the first `context` tokens of a text densely, once;
//   - for each policy, decode the next `eval_tokens` tokens one at a time, teacher-forced,
//     reusing the prefill's KV pages (read-only) and appending into fresh pages;
//   - compare with dense on the same steps: perplexity, top-1 agreement, KL(dense || policy),
//     page hit rate and attention-mass recall against the oracle, KV bytes read, step time.
// And the synthetic passkey retrieval test.
//
// Thread safety: one evaluation at a time per Evaluator.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/thread_pool.h"
#include "worker/kv/paged_kv_cache.h"
#include "worker/model/weight_source.h"
#include "worker/runner/transformer.h"
#include "worker/select/selection_spec.h"

namespace tinyserve {

struct EvalResult {
  SelectionSpec spec;
  int context = 0, eval_tokens = 0, page_size = 0;
  std::string kv_dtype = "f16";
  double ppl = 0, ppl_dense = 0, delta_ppl_pct = 0;
  double top1_agreement = 0, kl_mean = 0;
  double page_hit_rate = -1, mass_recall = -1, reuse = -1;
  double kv_bytes_ratio = 1;
  double pages_selected_per_step = 0, pages_scored_per_step = 0;
  double step_ms = 0, step_ms_dense = 0;  // medians over steps without an oracle sample
  double select_ms = 0, attention_ms = 0, attention_ms_dense = 0;  // per step, medians
  std::string ToJson() const;
};

struct PasskeyResult {
  SelectionSpec spec;
  int length = 0;        // prompt tokens
  double depth = 0;      // where the key sits, 0 = start, 1 = end
  int samples = 0;
  int correct = 0, correct_dense = 0;
  std::string ToJson() const;
};

class Evaluator {
 public:
  // threads: CPU threads; page_size: KV page size for the whole evaluation; kv_dtype: storage
  // of the KV cache (dense and every policy run on the same one).
  static absl::StatusOr<std::unique_ptr<Evaluator>> Create(const std::string& model_path,
                                                           int threads, int page_size,
                                                           KvDtype kv_dtype = KvDtype::kF16);
  ~Evaluator();

  // Tokenizes text and evaluates every spec (in order) on tokens [0, context + eval_tokens].
  // oracle_every: oracle comparison every N steps (0: never).
  absl::StatusOr<std::vector<EvalResult>> Run(const std::string& text, int context,
                                              int eval_tokens,
                                              const std::vector<SelectionSpec>& specs);

  // Passkey retrieval: `samples` prompts of about `length` tokens with a random 5-digit key at
  // `depth`; the last question tokens are decoded one by one under each spec, then up to 8
  // tokens are generated greedily; correct when the first integer in them is the key.
  absl::StatusOr<std::vector<PasskeyResult>> Passkey(int length, double depth, int samples,
                                                     const std::vector<SelectionSpec>& specs,
                                                     uint64_t seed);

  const ModelConfig& config() const;

 private:
  Evaluator() = default;
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace tinyserve
