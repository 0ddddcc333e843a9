// File: worker/runner/attention_selector.h
// The runner's hook for token selection during decode: which pages of a sequence one (layer,
// KV head) attends. worker/select implements it for every policy; nullptr means dense.
//
// Thread safety: Select and OnScores are called concurrently for different KV heads of the
// same step, and for the rows of a verification; implementations keep per-(layer, head, row)
// state or lock.
#pragma once

#include <cstdint>
#include <vector>

namespace tinyserve {

class PagedKvCache;

struct SelectArgs {
  int layer = 0;
  int kv_head = 0;                         // local KV head index
  const float* q = nullptr;                // [group][head_dim], after RoPE, unscaled
  int group = 1;                           // query heads sharing this KV head
  int head_dim = 0;
  const std::vector<int32_t>* pages = nullptr;  // the sequence's page table
  int64_t n_tokens = 0;                    // tokens in the cache including the current one
  int page_size = 16;
  const PagedKvCache* kv = nullptr;
  int row = 0;  // a verification's row (SeqInput::decode_rows): its own decode step; else 0
};

struct ScoresArgs {
  int layer = 0;
  int kv_head = 0;
  int group = 1;
  const std::vector<int32_t>* chosen = nullptr;  // logical page indices attended, in order
  const float* scores = nullptr;  // [group][tokens of chosen pages] raw scaled scores
  const float* lse = nullptr;     // [group]
  int64_t n_tokens = 0;
  int page_size = 16;
};

class AttentionSelector {
 public:
  virtual ~AttentionSelector() = default;
  // False: this layer attends densely at this step.
  virtual bool Active(int layer) const = 0;
  // Fills chosen with logical page indices (0 = first page of the sequence) in increasing
  // order; must include the last page.
  virtual void Select(const SelectArgs& args, std::vector<int32_t>* chosen) = 0;
  // True when OnScores wants the attention scores of this layer.
  virtual bool NeedsScores(int /*layer*/) const { return false; }
  virtual void OnScores(const ScoresArgs& /*args*/) {}
};

}  // namespace tinyserve
