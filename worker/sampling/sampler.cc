#include "worker/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

namespace tinyserve {

int32_t Argmax(const float* x, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

Sampler::Sampler(const SamplingParams& params, std::vector<int32_t> end_ids)
    : p_(params), rng_(params.seed) {
  // A temperature this small is greedy (vLLM's _SAMPLING_EPS): 1/t would overflow the logits.
  if (p_.temperature < 1e-5f) p_.temperature = 0.0f;
  if (p_.min_tokens > 0) {
    held_back_ = std::move(end_ids);
    held_back_.insert(held_back_.end(), p_.stop_token_ids.begin(), p_.stop_token_ids.end());
  }
}

SampleResult Sampler::Sample(float* logits, int vocab, const std::vector<int32_t>& history,
                             size_t output_start) {
  for (const auto& [id, bias] : p_.logit_bias) {
    if (id >= 0 && id < vocab) logits[id] += bias;
  }
  const size_t generated = history.size() > output_start ? history.size() - output_start : 0;
  if (generated < static_cast<size_t>(p_.min_tokens)) {
    for (int32_t id : held_back_) {
      if (id >= 0 && id < vocab) logits[id] = -std::numeric_limits<float>::infinity();
    }
  }
  if ((p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) &&
      output_start < history.size()) {
    // OpenAI's definition: logit -= presence * [count > 0] + frequency * count, over the
    // tokens generated so far.
    counts_.resize(vocab);
    for (size_t i = output_start; i < history.size(); ++i) {
      if (history[i] >= 0 && history[i] < vocab) ++counts_[history[i]];
    }
    for (size_t i = output_start; i < history.size(); ++i) {
      const int32_t id = history[i];
      if (id < 0 || id >= vocab || counts_[id] == 0) continue;
      logits[id] -= p_.presence_penalty + p_.frequency_penalty * counts_[id];
      counts_[id] = 0;
    }
  }
  if (p_.repetition_penalty != 1.0f) {
    // CTRL-style penalty as llama.cpp and transformers apply it: divide positive logits,
    // multiply negative ones, once per distinct token seen.
    std::unordered_set<int32_t> seen(history.begin(), history.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= vocab) continue;
      float& v = logits[id];
      // (Clamped: a tiny penalty would divide a logit past the float range.)
      constexpr float kMax = std::numeric_limits<float>::max();
      v = v > 0 ? std::min(v / p_.repetition_penalty, kMax) : v * p_.repetition_penalty;
    }
  }
  SampleResult r = Draw(logits, vocab);
  if (constraint_ == nullptr) return r;
  // Constrained: keep the draw when the grammar allows it; otherwise mask every token it does
  // not allow and draw again (llama.cpp's order: the full mask only on a miss).
  if (!constraint_->Allows(r.id)) {
    constraint_->AllowedTokens(vocab, &allowed_);
    constexpr float kInf = std::numeric_limits<float>::infinity();
    int first = -1;
    bool finite = false;
    for (int i = 0; i < vocab; ++i) {
      if (allowed_[i]) {
        if (first < 0) first = i;
        finite = finite || logits[i] > -kInf;
      } else {
        logits[i] = -kInf;
      }
    }
    if (finite) {
      r = Draw(logits, vocab);
    } else if (first >= 0) {
      // Every allowed token is held back (min_tokens, stop_token_ids): the constraint wins.
      r = SampleResult{first, -kInf, {}};
    }
  }
  constraint_->Accept(r.id);
  return r;
}

SampleResult Sampler::Draw(const float* logits, int vocab) {
  SampleResult r;
  if (p_.temperature == 0.0f) {
    r.id = Argmax(logits, vocab);
  } else {
    // Candidates sorted by logit; filters cut the tail.
    cand_.clear();
    for (int i = 0; i < vocab; ++i) cand_.push_back({logits[i], i});
    size_t keep = cand_.size();
    if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < keep) {
      keep = p_.top_k;
      std::partial_sort(cand_.begin(), cand_.begin() + keep, cand_.end(),
                        [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    } else {
      std::sort(cand_.begin(), cand_.end(),
                [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    }
    cand_.resize(keep);
    const float inv_t = 1.0f / p_.temperature;
    const float mx = cand_[0].first;
    std::vector<double> prob(keep);
    double sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += (prob[i] = std::exp((cand_[i].first - mx) * inv_t));
    for (auto& x : prob) x /= sum;
    if (p_.min_p > 0) {
      const double floor = p_.min_p * prob[0];
      size_t n = 1;
      while (n < keep && prob[n] >= floor) ++n;
      keep = n;
    }
    if (p_.top_p < 1.0f) {
      double acc = 0;
      size_t n = 0;
      while (n < keep) {
        acc += prob[n++];
        if (acc >= p_.top_p) break;
      }
      keep = std::max<size_t>(1, n);
    }
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += prob[i];
    std::uniform_real_distribution<double> u(0.0, total);
    double x = u(rng_), acc = 0;
    r.id = cand_[keep - 1].second;
    for (size_t i = 0; i < keep; ++i) {
      acc += prob[i];
      if (x < acc) {
        r.id = cand_[i].second;
        break;
      }
    }
  }
  // Log-probabilities of the (penalised) model distribution, for reporting.
  if (p_.logprobs >= 0) LogprobsOf(logits, vocab, p_.logprobs, &r);
  return r;
}

void LogprobsOf(const float* logits, int vocab, int top_n, SampleResult* r, int* rank) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < vocab; ++i) mx = std::max(mx, logits[i]);
  double s = 0;
  for (int i = 0; i < vocab; ++i) s += std::exp(static_cast<double>(logits[i] - mx));
  const float lse = mx + static_cast<float>(std::log(s));
  r->logprob = logits[r->id] - lse;
  if (rank != nullptr) {
    *rank = 1;
    for (int i = 0; i < vocab; ++i) *rank += logits[i] > logits[r->id];
  }
  r->top.clear();
  if (top_n <= 0) return;
  std::vector<std::pair<float, int32_t>> top;
  top.reserve(vocab);
  for (int i = 0; i < vocab; ++i) top.push_back({logits[i], i});
  const size_t n = std::min<size_t>(top_n, top.size());
  std::partial_sort(top.begin(), top.begin() + n, top.end(), [](auto& a, auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  for (size_t i = 0; i < n; ++i) r->top.push_back({top[i].second, top[i].first - lse});
}

}  // namespace tinyserve
