// The built-in selection policies and the registry.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu/attention.h"
#include "worker/kv/paged_kv_cache.h"
#include "worker/select/selector.h"

namespace tinyserve {
namespace {

// dense: never selects; every layer attends every page.
class DensePolicy : public Policy {
 public:
  DensePolicy(const SelectionSpec& spec, const PolicyContext& ctx) : Policy(spec, ctx) {}
  const char* name() const override { return "dense"; }
  bool Active(int) const override { return false; }
  bool Stateless() const override { return true; }
  int64_t Choose(const SelectArgs&, int64_t n_pages, std::vector<int32_t>* chosen) override {
    chosen->clear();
    for (int32_t p = 0; p < n_pages; ++p) chosen->push_back(p);
    return 0;
  }
};

// quest: the largest q·k each page's key bounding box allows, sum_d max(q_d*min_d, q_d*max_d),
// per query head; the group's heads combined by max (an upper bound for each head) or sum.
class QuestPolicy : public Policy {
 public:
  QuestPolicy(const SelectionSpec& spec, const PolicyContext& ctx, bool sum)
      : Policy(spec, ctx), sum_(sum) {}
  const char* name() const override { return "quest"; }
  bool reads_metadata() const override { return true; }
  bool Stateless() const override { return true; }

  int64_t Choose(const SelectArgs& a, int64_t n_pages, std::vector<int32_t>* chosen) override {
    AddForced(n_pages, chosen);
    std::vector<float> score(n_pages);
    const int d = a.head_dim;
    // Sum over the group: one pass over each box with the group's query split by sign.
    std::vector<float> q_pos, q_neg;
    if (sum_) {
      q_pos.assign(d, 0.0f);
      q_neg.assign(d, 0.0f);
      for (int g = 0; g < a.group; ++g)
        for (int i = 0; i < d; ++i) {
          const float x = a.q[static_cast<size_t>(g) * d + i];
          (x > 0 ? q_pos : q_neg)[i] += x;
        }
    }
    for (int64_t p = 0; p < n_pages; ++p) {
      const int32_t page = (*a.pages)[p];
      const fp16_t* mn = a.kv->KMin(a.layer, page, a.kv_head);
      const fp16_t* mx = a.kv->KMax(a.layer, page, a.kv_head);
      if (sum_) {
        score[p] = BoxScoreSplit(q_pos.data(), q_neg.data(), mn, mx, d);
        continue;
      }
      float agg = -std::numeric_limits<float>::infinity();
      for (int g = 0; g < a.group; ++g)
        agg = std::max(agg, QuestScore(a.q + static_cast<size_t>(g) * d, mn, mx, d));
      score[p] = agg;
    }
    FillTopK(score, n_pages, chosen);
    return n_pages;
  }

 private:
  bool sum_;
};

// streaming (StreamingLLM): sink pages + the most recent pages, no scoring.
class StreamingPolicy : public Policy {
 public:
  StreamingPolicy(const SelectionSpec& spec, const PolicyContext& ctx) : Policy(spec, ctx) {}
  const char* name() const override { return "streaming"; }
  bool Stateless() const override { return true; }
  int64_t Choose(const SelectArgs&, int64_t n_pages, std::vector<int32_t>* chosen) override {
    AddForced(n_pages, chosen);
    const int sinks = std::max(1, spec_.sink_pages);
    std::vector<float> score(n_pages);
    for (int64_t p = 0; p < n_pages; ++p)
      score[p] = p < sinks ? 2.0f * n_pages : static_cast<float>(p);  // sinks, then newest
    FillTopK(score, n_pages, chosen);
    return 0;
  }
};

// oracle: exact top pages by dense attention mass (an upper bound for page selection).
class OraclePolicy : public Policy {
 public:
  OraclePolicy(const SelectionSpec& spec, const PolicyContext& ctx) : Policy(spec, ctx) {}
  const char* name() const override { return "oracle"; }
  bool Stateless() const override { return true; }
  int64_t Choose(const SelectArgs& a, int64_t n_pages, std::vector<int32_t>* chosen) override {
    AddForced(n_pages, chosen);
    FillTopK(PageAttentionMass(a, n_pages), n_pages, chosen);
    return n_pages;
  }
};

// random: uniformly random pages besides the forced ones (a floor).
class RandomPolicy : public Policy {
 public:
  RandomPolicy(const SelectionSpec& spec, const PolicyContext& ctx) : Policy(spec, ctx) {
    rngs_.resize(static_cast<size_t>(ctx.n_layers) * ctx.n_kv_heads);
    for (size_t i = 0; i < rngs_.size(); ++i) rngs_[i].seed(ctx.seed * 1000003 + i);
  }
  const char* name() const override { return "random"; }
  int64_t Choose(const SelectArgs& a, int64_t n_pages, std::vector<int32_t>* chosen) override {
    AddForced(n_pages, chosen);
    std::mt19937_64& rng = rngs_[static_cast<size_t>(a.layer) * ctx_.n_kv_heads + a.kv_head];
    std::uniform_real_distribution<float> u(0, 1);
    std::vector<float> score(n_pages);
    for (auto& s : score) s = u(rng);
    FillTopK(score, n_pages, chosen);
    return 0;
  }

 private:
  std::vector<std::mt19937_64> rngs_;
};

// h2o (Heavy-Hitter Oracle), page-granular and non-destructive: each page's accumulated
// attention mass over the steps it was attended; the heaviest pages are kept. Its first step
// per (layer, head) seeds the accumulator with the current query's dense attention (standing in
// for H2O's prefill attention map).
class H2oPolicy : public Policy {
 public:
  H2oPolicy(const SelectionSpec& spec, const PolicyContext& ctx) : Policy(spec, ctx) {
    acc_.resize(static_cast<size_t>(ctx.n_layers) * ctx.n_kv_heads);
  }
  const char* name() const override { return "h2o"; }
  bool evicts() const override { return true; }
  bool WantsScores(int) const override { return true; }

  int64_t Choose(const SelectArgs& a, int64_t n_pages, std::vector<int32_t>* chosen) override {
    std::vector<float>& acc = acc_[static_cast<size_t>(a.layer) * ctx_.n_kv_heads + a.kv_head];
    int64_t scored = 0;
    if (acc.empty()) {
      acc = PageAttentionMass(a, n_pages);
      scored = n_pages;
    }
    acc.resize(n_pages, 0.0f);
    AddForced(n_pages, chosen);
    FillTopK(acc, n_pages, chosen);
    return scored;
  }

  void Scores(const ScoresArgs& s) override {
    std::vector<float>& acc = acc_[static_cast<size_t>(s.layer) * ctx_.n_kv_heads + s.kv_head];
    int64_t total = 0;
    for (int32_t p : *s.chosen)
      total += std::min<int64_t>(s.page_size, s.n_tokens - static_cast<int64_t>(p) * s.page_size);
    int64_t off = 0;
    for (int32_t p : *s.chosen) {
      const int n = static_cast<int>(std::min<int64_t>(s.page_size, s.n_tokens - static_cast<int64_t>(p) * s.page_size));
      if (static_cast<size_t>(p) >= acc.size()) acc.resize(p + 1, 0.0f);
      for (int g = 0; g < s.group; ++g)
        for (int j = 0; j < n; ++j) acc[p] += std::exp(s.scores[g * total + off + j] - s.lse[g]) / s.group;
      off += n;
    }
  }

 private:
  std::vector<std::vector<float>> acc_;  // [layer * heads + head][page]
};

// snapkv: one vote at the first decode step (the observation window is that step's query;
// SnapKV uses the prompt's last queries, which prefill does not keep), pooled over neighbouring
// pages; the chosen prompt pages stay fixed and pages written after the vote are kept too.
class SnapKvPolicy : public Policy {
 public:
  SnapKvPolicy(const SelectionSpec& spec, const PolicyContext& ctx, int kernel)
      : Policy(spec, ctx), kernel_(kernel) {
    kept_.resize(static_cast<size_t>(ctx.n_layers) * ctx.n_kv_heads);
    vote_pages_.resize(kept_.size(), 0);
  }
  const char* name() const override { return "snapkv"; }
  bool evicts() const override { return true; }

  int64_t Choose(const SelectArgs& a, int64_t n_pages, std::vector<int32_t>* chosen) override {
    const size_t key = static_cast<size_t>(a.layer) * ctx_.n_kv_heads + a.kv_head;
    int64_t scored = 0;
    if (vote_pages_[key] == 0) {
      std::vector<float> mass = PageAttentionMass(a, n_pages);
      std::vector<float> pooled(n_pages, 0.0f);
      for (int64_t p = 0; p < n_pages; ++p)
        for (int64_t q = std::max<int64_t>(0, p - kernel_ / 2);
             q <= std::min<int64_t>(n_pages - 1, p + kernel_ / 2); ++q)
          pooled[p] = std::max(pooled[p], mass[q]);
      AddForced(n_pages, chosen);
      FillTopK(pooled, n_pages, chosen);
      kept_[key] = *chosen;
      vote_pages_[key] = n_pages;
      scored = n_pages;
    }
    // The voted prompt pages plus pages that appeared since, newest first within the budget.
    AddForced(n_pages, chosen);
    std::vector<float> score(n_pages, -1.0f);
    for (int32_t p : kept_[key]) score[p] = 1.0f;
    for (int64_t p = vote_pages_[key]; p < n_pages; ++p) score[p] = 2.0f + p;
    FillTopK(score, n_pages, chosen);
    return scored;
  }

 private:
  int kernel_;
  std::vector<std::vector<int32_t>> kept_;
  std::vector<int64_t> vote_pages_;
};

absl::Status UnknownParam(const std::string& policy, const std::string& key) {
  return absl::InvalidArgumentError(
      absl::StrCat("selection.params: unknown parameter '", key, "' for policy '", policy, "'"));
}

// Allowed parameters of each policy; every other key is an error.
const std::map<std::string, std::vector<std::string>>& Registry() {
  static const auto* r = new std::map<std::string, std::vector<std::string>>{
      {"dense", {}},    {"quest", {"gqa"}}, {"streaming", {}}, {"h2o", {}},
      {"snapkv", {"kernel"}}, {"oracle", {}}, {"random", {}},
  };
  return *r;
}

}  // namespace

float QuestScore(const float* q, const fp16_t* mn, const fp16_t* mx, int d) {
  return BoxScore(q, mn, mx, d);
}

std::vector<std::string> PolicyNames() {
  std::vector<std::string> out;
  for (const auto& [name, _] : Registry()) out.push_back(name);
  return out;
}

absl::Status ValidateSelectionSpec(const SelectionSpec& spec, int page_size) {
  auto it = Registry().find(spec.policy);
  if (it == Registry().end())
    return absl::InvalidArgumentError(absl::StrCat("selection.policy: unknown policy '",
                                                   spec.policy, "' (known: ",
                                                   absl::StrJoin(PolicyNames(), ", "), ")"));
  if (spec.budget < page_size || spec.budget > (1 << 24))
    return absl::InvalidArgumentError(absl::StrCat("selection.budget must be in [page size ",
                                                   page_size, ", 16777216], got ", spec.budget));
  if (spec.dense_layers < 0 || spec.dense_layers > 4096)
    return absl::InvalidArgumentError(
        absl::StrCat("selection.dense_layers must be >= 0, got ", spec.dense_layers));
  if (spec.sink_pages < 0 || spec.recent_pages < 0)
    return absl::InvalidArgumentError("selection.sink_pages and recent_pages must be >= 0");
  if (spec.oracle_every < 0)
    return absl::InvalidArgumentError("selection.oracle_every must be >= 0");
  for (const auto& [key, value] : spec.params) {
    const auto& allowed = it->second;
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      return UnknownParam(spec.policy, key);
    if (key == "gqa" && value != "max" && value != "sum")
      return absl::InvalidArgumentError(
          absl::StrCat("selection.params.gqa must be 'max' or 'sum', got '", value, "'"));
    int k;
    if (key == "kernel" && (!absl::SimpleAtoi(value, &k) || k < 1 || k % 2 == 0))
      return absl::InvalidArgumentError(
          absl::StrCat("selection.params.kernel must be an odd integer >= 1, got '", value, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Policy>> CreatePolicy(const SelectionSpec& spec,
                                                     const PolicyContext& ctx) {
  if (auto s = ValidateSelectionSpec(spec, ctx.page_size); !s.ok()) return s;
  auto param = [&](const std::string& k, const std::string& def) {
    auto it = spec.params.find(k);
    return it == spec.params.end() ? def : it->second;
  };
  std::unique_ptr<Policy> p;
  if (spec.policy == "dense") p = std::make_unique<DensePolicy>(spec, ctx);
  if (spec.policy == "quest") p = std::make_unique<QuestPolicy>(spec, ctx, param("gqa", "sum") == "sum");
  if (spec.policy == "streaming") p = std::make_unique<StreamingPolicy>(spec, ctx);
  if (spec.policy == "oracle") p = std::make_unique<OraclePolicy>(spec, ctx);
  if (spec.policy == "random") p = std::make_unique<RandomPolicy>(spec, ctx);
  if (spec.policy == "h2o") p = std::make_unique<H2oPolicy>(spec, ctx);
  if (spec.policy == "snapkv") {
    int kernel = 5;
    (void)absl::SimpleAtoi(param("kernel", "5"), &kernel);
    p = std::make_unique<SnapKvPolicy>(spec, ctx, kernel);
  }
  return p;
}

}  // namespace tinyserve
