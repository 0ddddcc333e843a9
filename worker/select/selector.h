// File: worker/select/selector.h
// Token-selection policies: the plugin interface and the registry.
//
// A Policy is created per sequence from a SelectionSpec. It sees the sequence at prefill
// (OnPrefill), at each appended token (OnAppend), once per decode step per layer and KV head
// (Select: which pages to attend), and after attention (OnScores, when NeedsScores). evicts()
// says whether it frees memory permanently (h2o, snapkv, streaming keep fewer tokens forever in
// the systems that define them; here selection is non-destructive and evicts() reports the
// policy's nature for accounting).
//
// Budget rule shared by all policies (Quest's): page budget K = budget / page_size counting the
// current (last) page, which is always attended; sink pages (default 1) and recent pages count
// toward K and take what K leaves after the current page;
// when the sequence has no more than K pages the step is dense (bit-identical to dense). The
// first dense_layers layers are always dense; prefill is always dense.
//
// Every step is instrumented (SelectionStats): pages scored and selected, KV bytes read against
// dense, time selecting, and every oracle_every-th step a comparison with the oracle (page hit
// rate, attention-mass recall); step-to-step reuse of the selected pages.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/kv/paged_kv_cache.h"
#include "worker/model/model_config.h"
#include "worker/runner/attention_selector.h"
#include "worker/select/selection_spec.h"
#include "worker/select/selection_stats.h"

namespace tinyserve {

struct PolicyContext {
  int n_layers = 0;
  int n_kv_heads = 0;  // local
  int head_dim = 0;
  int page_size = 16;
  int kv_bytes_per_token_head_layer = 0;  // K+V bytes of one token, head and layer
  uint64_t seed = 0;
  // Sliding-window layers (ModelConfig::SlidingLayer): they attend their last sliding_window
  // tokens densely, never select, and read (and would read dense) that many tokens.
  int sliding_window = 0;
  std::vector<bool> sliding;  // [layer]

  bool Sliding(int layer) const {
    return sliding_window > 0 && layer < static_cast<int>(sliding.size()) && sliding[layer];
  }
  // Tokens layer `layer` attends at a context of n tokens.
  int64_t LayerTokens(int layer, int64_t n) const {
    return Sliding(layer) ? std::min<int64_t>(n, sliding_window) : n;
  }
};

// The context of a runner's shard: n_layers, head_dim from the model, its local KV heads, and the
// K+V bytes of one token per head and layer for the cache's dtype.
PolicyContext MakePolicyContext(const ModelConfig& model, int local_kv_heads, int page_size,
                                KvDtype kv_dtype, uint64_t seed);

class Policy : public AttentionSelector {
 public:
  ~Policy() override = default;
  virtual const char* name() const = 0;
  virtual bool evicts() const { return false; }

  // Called by the engine around each decode step of the sequence. rows > 1: a verification of
  // speculative tokens at n_tokens, n_tokens + 1, ... (SelectArgs::row), each row selecting as
  // its own decode step would (SelectsPerRow held); the engine then records each row it emits
  // with EndRow(row), in order, instead of EndStep.
  void BeginStep(int64_t n_tokens, int rows = 1);
  void EndStep() { EndRow(0); }
  void EndRow(int row);
  // True when a decode step's choice depends only on its query, n_tokens and the KV cache (no
  // state carried between steps, no attention scores, no oracle sampling), so the rows of a
  // verification can each select as their own decode step would.
  bool SelectsPerRow() const;
  // Tokens a decode step over n_tokens attends per layer, on average over the layers (page boxes
  // scored counted at their bytes): the step's attention cost in tokens.
  double AttendedTokens(int64_t n_tokens) const;
  // For runners that select on the device (worker/runner/cuda_runner.h) instead of calling
  // Select: records one decode step measured there, as BeginStep + Select + EndStep would.
  void RecordStep(const StepStats& step);
  // True when a decode step over n_tokens attends every page on every layer (a dense policy,
  // or a context within the page budget) and the policy does not learn from attention scores,
  // so attending it densely without Select or OnScores is what the policy would do.
  bool DenseAt(int64_t n_tokens) const;
  // Records a decode step over n_tokens attended densely without Select (a speculative token
  // verified with others in one forward; DenseAt(n_tokens) held).
  void RecordDenseStep(int64_t n_tokens);
  // Prefill hook: the prompt's n tokens are in the cache.
  virtual void OnPrefill(int64_t /*n_tokens*/) {}
  // Append hook: one token was added at position pos.
  virtual void OnAppend(int64_t /*pos*/) {}

  // AttentionSelector: dense layers, the dense-when-it-fits rule, stats and the oracle sample
  // are handled here; policies implement Choose.
  bool Active(int layer) const override;
  void Select(const SelectArgs& args, std::vector<int32_t>* chosen) final;
  bool NeedsScores(int layer) const override;
  void OnScores(const ScoresArgs& args) override;

  const SelectionStats& stats() const { return stats_; }
  const SelectionSpec& spec() const { return spec_; }
  const StepStats& last_step() const { return step_; }

 protected:
  Policy(const SelectionSpec& spec, const PolicyContext& ctx);
  // Chooses logical pages for one (layer, KV head) when selection applies: n_pages >
  // page budget. Must return sorted, unique indices including n_pages - 1, at most
  // page_budget() of them.
  // Returns the number of pages scored (whose metadata or keys were read to rank them).
  virtual int64_t Choose(const SelectArgs& args, int64_t n_pages,
                         std::vector<int32_t>* chosen) = 0;
  // True when scoring reads page metadata (counted in kv_bytes_read).
  virtual bool reads_metadata() const { return false; }
  // Whether Choose needs the scores of layer's attention (h2o).
  virtual bool WantsScores(int /*layer*/) const { return false; }
  // True when Choose keeps no state between calls (its choice is a function of its arguments).
  virtual bool Stateless() const { return false; }
  virtual void Scores(const ScoresArgs& /*args*/) {}

  int page_budget() const { return page_budget_; }
  // Adds the forced pages (sinks, recent, current) to chosen; returns how many slots remain.
  int AddForced(int64_t n_pages, std::vector<int32_t>* chosen) const;
  // Fills the remaining slots with the highest-scoring pages not yet chosen (ties to the lower
  // index), then sorts. score[p] for p < n_pages.
  // pages: the total to reach (default: the page budget).
  void FillTopK(const std::vector<float>& score, int64_t n_pages, std::vector<int32_t>* chosen,
                int pages = -1) const;

  SelectionSpec spec_;
  PolicyContext ctx_;

 private:
  void OracleCompare(const SelectArgs& args, int64_t n_pages, const std::vector<int32_t>& chosen);

  int page_budget_;
  int64_t step_index_ = 0;
  int64_t n_tokens_ = 0;
  bool oracle_step_ = false;
  // Whether selecting would read fewer bytes than attending densely (boxes cost bytes too).
  bool Saves(int64_t n_pages, int head_dim) const;

  std::mutex mu_;  // guards stats_, step_, rows_ (Select runs in parallel over heads and rows)
  SelectionStats stats_;
  StepStats step_;
  std::vector<StepStats> rows_;             // the current step's rows
  std::vector<std::vector<int32_t>> prev_;  // [layer * heads + head] pages chosen last step
  // A verification's choices, [row][layer * heads + head]: reuse is measured against the step
  // before it, and the last emitted row's choice becomes prev_.
  std::vector<std::vector<std::vector<int32_t>>> row_chosen_;
};

// Quest's page score for one query head: sum_d max(q_d * kmin_d, q_d * kmax_d), the largest
// q·k any key inside the page's bounding box can reach.
// (kernels/cpu/attention.h's BoxScore.)
float QuestScore(const float* q, const fp16_t* kmin, const fp16_t* kmax, int head_dim);

// Dense attention mass of each logical page for the query group of args (mean over the group's
// heads): the oracle's ranking. [n_pages], sums to 1.
std::vector<float> PageAttentionMass(const SelectArgs& args, int64_t n_pages);

// Creates the policy named in spec. InvalidArgument naming the field for an unknown name or
// parameter.
absl::StatusOr<std::unique_ptr<Policy>> CreatePolicy(const SelectionSpec& spec,
                                                     const PolicyContext& ctx);
// The registered policy names.
std::vector<std::string> PolicyNames();

}  // namespace tinyserve
