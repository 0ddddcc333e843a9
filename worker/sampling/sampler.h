// File: worker/sampling/sampler.h
// Turns one row of logits into the next token: repetition, presence and frequency penalties,
// temperature, top-k, top-p
// and min-p filtering, then greedy argmax (temperature 0) or a draw from a per-request RNG
// (same seed, same output). Also the log-probabilities of the chosen and top-n tokens, taken
// from the model's distribution before filtering (as vLLM reports them).
//
// Thread safety: a Sampler is per request; not shared.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "worker/sampling/json_constraint.h"
#include "worker/sampling/sampling_params.h"

namespace tinyserve {

struct SampleResult {
  int32_t id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), best first, when logprobs > 0
};

// r->id's log-probability under logits (log-softmax) and the top_n most likely tokens, best
// first, into r; with rank, also 1 + the number of tokens more likely than r->id.
void LogprobsOf(const float* logits, int vocab, int top_n, SampleResult* r, int* rank = nullptr);

class Sampler {
 public:
  // end_ids: the end-of-generation ids, which min_tokens holds back with stop_token_ids.
  explicit Sampler(const SamplingParams& params, std::vector<int32_t> end_ids = {});
  // logits [vocab] is modified (penalties, scaling). history: prompt + generated ids so far;
  // the generated ones start at history[output_start] (presence and frequency penalties).
  SampleResult Sample(float* logits, int vocab, const std::vector<int32_t>& history,
                      size_t output_start = 0);
  // A token chosen elsewhere (a migrated request's earlier output): the constraint takes it.
  void Replay(int32_t id) {
    if (constraint_ != nullptr) constraint_->Accept(id);
  }
  // The constraint's status (OK without one): not OK once it gave up.
  absl::Status ConstraintStatus() const {
    return constraint_ ? constraint_->status() : absl::OkStatus();
  }
  // Holds the output to a grammar (response_format json_object) from the next token on.
  void SetConstraint(std::unique_ptr<TokenConstraint> constraint) {
    constraint_ = std::move(constraint);
  }

 private:
  // The draw itself: temperature, filters, RNG, logprobs (reads logits only).
  SampleResult Draw(const float* logits, int vocab);

  SamplingParams p_;
  std::unique_ptr<TokenConstraint> constraint_;
  std::vector<uint8_t> allowed_;    // the constraint's verdicts on a miss
  std::vector<int32_t> held_back_;  // ids that cannot be drawn before min_tokens
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<int32_t> counts_;  // per token: times generated (penalties; zeroed after use)
};

// Index of the largest value (first on ties).
int32_t Argmax(const float* x, int n);

}  // namespace tinyserve
