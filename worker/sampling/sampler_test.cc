#include "worker/sampling/sampler.h"

#include <cmath>
#include <map>
#include <random>

#include "gtest/gtest.h"

namespace tinyserve {
namespace {

std::vector<float> RandomLogits(int n, int seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 3);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

std::vector<int32_t> Draw(SamplingParams p, int steps) {
  Sampler s(p);
  std::vector<int32_t> out;
  for (int i = 0; i < steps; ++i) {
    auto l = RandomLogits(100, i);
    out.push_back(s.Sample(l.data(), 100, out).id);
  }
  return out;
}

// Allows one token only.
class OnlyToken final : public TokenConstraint {
 public:
  explicit OnlyToken(int32_t id) : id_(id) {}
  bool Allows(int32_t id) const override { return id == id_; }
  void Accept(int32_t) override {}

 private:
  int32_t id_;
};

TEST(Sampler, AConstraintWinsOverHeldBackTokens) {
  // The only token the constraint allows is a stop id held back by min_tokens: it is still the
  // one taken (not token 0 of an all -inf row, nor a draw from NaN weights).
  for (float temperature : {0.0f, 0.8f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.min_tokens = 5;
    p.stop_token_ids = {7};
    Sampler s(p);
    s.SetConstraint(std::make_unique<OnlyToken>(7));
    auto l = RandomLogits(100, 3);
    EXPECT_EQ(s.Sample(l.data(), 100, {}).id, 7) << temperature;
  }
}

TEST(Sampler, GreedyIsArgmax) {
  auto l = RandomLogits(1000, 1);
  const int32_t want = Argmax(l.data(), 1000);
  SamplingParams p;
  Sampler s(p);
  EXPECT_EQ(s.Sample(l.data(), 1000, {}).id, want);
}

TEST(Sampler, SameSeedSameOutputDifferentSeedDiffers) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  EXPECT_EQ(Draw(p, 50), Draw(p, 50));
  SamplingParams q = p;
  q.seed = 43;
  EXPECT_NE(Draw(p, 50), Draw(q, 50));
}

TEST(Sampler, FiltersCollapseToArgmax) {
  auto base = RandomLogits(500, 9);
  const int32_t want = Argmax(base.data(), 500);
  for (int mode = 0; mode < 3; ++mode) {
    SamplingParams p;
    p.temperature = 1.5f;
    if (mode == 0) p.top_k = 1;
    if (mode == 1) p.top_p = 1e-6f;
    if (mode == 2) p.min_p = 1.0f;
    Sampler s(p);
    for (int i = 0; i < 20; ++i) {
      auto l = base;
      EXPECT_EQ(s.Sample(l.data(), 500, {}).id, want) << "mode " << mode;
    }
  }
}

TEST(Sampler, TopKOnlyDrawsFromTopK) {
  auto base = RandomLogits(200, 4);
  std::vector<int> order(200);
  for (int i = 0; i < 200; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return base[a] > base[b]; });
  SamplingParams p;
  p.temperature = 5.0f;
  p.top_k = 3;
  Sampler s(p);
  for (int i = 0; i < 200; ++i) {
    auto l = base;
    int32_t id = s.Sample(l.data(), 200, {}).id;
    EXPECT_TRUE(id == order[0] || id == order[1] || id == order[2]);
  }
}

TEST(Sampler, RepetitionPenaltyDemotesSeenTokens) {
  std::vector<float> l = {5.0f, 4.9f, 1.0f};
  SamplingParams p;
  p.repetition_penalty = 1.5f;
  Sampler s(p);
  EXPECT_EQ(s.Sample(l.data(), 3, {0}).id, 1);
}

// Extreme but valid values stay finite: a temperature under 1e-5 is greedy (as in vLLM), a
// repetition penalty near 0 saturates the logit instead of overflowing it.
TEST(Sampler, TinyTemperatureAndPenaltyStayFinite) {
  auto l = RandomLogits(1000, 3);
  SamplingParams p;
  p.temperature = 1e-39f;  // subnormal: 1/t is inf
  p.logprobs = 1;
  auto r = Sampler(p).Sample(l.data(), 1000, {});
  EXPECT_EQ(r.id, Argmax(l.data(), 1000));
  EXPECT_TRUE(std::isfinite(r.logprob)) << r.logprob;
  std::vector<float> m = {5.0f, 4.9f, 1.0f};
  SamplingParams q;
  q.temperature = 1.0f;
  q.repetition_penalty = 1e-38f;
  q.logprobs = 2;
  for (int seed = 0; seed < 4; ++seed) {
    q.seed = seed;
    std::vector<float> v = m;
    auto s = Sampler(q).Sample(v.data(), 3, {1});
    EXPECT_EQ(s.id, 1);
    EXPECT_EQ(s.logprob, 0.0f);
    for (auto& [id, lp] : s.top) EXPECT_FALSE(std::isnan(lp)) << id;
  }
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountOnlyTheOutput) {
  // history = prompt {2, 2, 2} + output {0, 0, 1}: logits 0, 1 drop by presence + count x
  // frequency; token 2 appears only in the prompt and keeps its logit.
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p);
  std::vector<float> l = {3.0f, 3.0f, 2.5f, 0.0f};
  const std::vector<int32_t> history = {2, 2, 2, 0, 0, 1};
  s.Sample(l.data(), 4, history, /*output_start=*/3);
  EXPECT_FLOAT_EQ(l[0], 3.0f - 0.5f - 2 * 0.25f);
  EXPECT_FLOAT_EQ(l[1], 3.0f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(l[2], 2.5f);
  EXPECT_FLOAT_EQ(l[3], 0.0f);
  // The greedy pick follows: token 2 now wins. A second call applies the same amounts again
  // (the per-token counts are cleared after use).
  std::vector<float> again = {3.0f, 3.0f, 2.5f, 0.0f};
  EXPECT_EQ(s.Sample(again.data(), 4, history, 3).id, 2);
  EXPECT_FLOAT_EQ(again[0], 2.0f);
  // Negative penalties promote the output's tokens.
  p.presence_penalty = -1.0f;
  p.frequency_penalty = 0.0f;
  Sampler promote(p);
  std::vector<float> l2 = {3.0f, 3.0f, 3.5f, 0.0f};
  EXPECT_EQ(promote.Sample(l2.data(), 4, history, 3).id, 0);
}

TEST(Sampler, MinTokensHoldsBackEndIdsThenReleasesThem) {
  SamplingParams p;
  p.min_tokens = 2;
  p.stop_token_ids = {1};
  Sampler s(p, /*end_ids=*/{0});
  // Ids 0 (end) and 1 (stop) lead; with one token generated both are held back.
  std::vector<float> l = {5.0f, 4.0f, 3.0f};
  EXPECT_EQ(s.Sample(l.data(), 3, {7, 2}, /*output_start=*/1).id, 2);
  l = {5.0f, 4.0f, 3.0f};
  EXPECT_EQ(s.Sample(l.data(), 3, {7, 2, 2}, 1).id, 0);  // two generated: released
}

TEST(Sampler, LogitBiasShiftsAndBans) {
  SamplingParams p;
  p.logit_bias = {{0, -100.0f}, {2, 1.5f}};
  Sampler s(p);
  std::vector<float> l = {5.0f, 4.0f, 3.0f};
  EXPECT_EQ(s.Sample(l.data(), 3, {}).id, 2);
  EXPECT_FLOAT_EQ(l[0], -95.0f);
  EXPECT_FLOAT_EQ(l[2], 4.5f);
}

TEST(Sampler, LogprobsOfChosenAndTop) {
  std::vector<float> l = {1.0f, 2.0f, 3.0f};
  SamplingParams p;
  p.logprobs = 2;
  Sampler s(p);
  auto r = s.Sample(l.data(), 3, {});
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_EQ(r.id, 2);
  EXPECT_NEAR(r.logprob, 3.0 - lse, 1e-5);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].first, 2);
  EXPECT_EQ(r.top[1].first, 1);
  EXPECT_NEAR(r.top[1].second, 2.0 - lse, 1e-5);
}

TEST(SamplingParams, ValidationNamesTheField) {
  struct Bad {
    const char* field;
    SamplingParams p;
  };
  std::vector<Bad> cases;
  SamplingParams p;
  p.temperature = -1;
  cases.push_back({"temperature", p});
  p = {};
  p.top_p = 0;
  cases.push_back({"top_p", p});
  p = {};
  p.top_k = -2;
  cases.push_back({"top_k", p});
  p = {};
  p.min_p = 2;
  cases.push_back({"min_p", p});
  p = {};
  p.repetition_penalty = 0;
  cases.push_back({"repetition_penalty", p});
  p = {};
  p.presence_penalty = 2.5f;
  cases.push_back({"presence_penalty", p});
  p = {};
  p.frequency_penalty = -3.0f;
  cases.push_back({"frequency_penalty", p});
  p = {};
  p.min_tokens = 500;
  cases.push_back({"min_tokens", p});
  p = {};
  p.logit_bias = {{999, 1.0f}};
  cases.push_back({"logit_bias", p});
  p = {};
  p.logit_bias = {{1, 200.0f}};
  cases.push_back({"logit_bias", p});
  p = {};
  p.max_tokens = 0;
  cases.push_back({"max_tokens", p});
  p = {};
  p.max_tokens = 100000;
  cases.push_back({"max_tokens", p});
  p = {};
  p.stop_token_ids = {999};
  cases.push_back({"stop_token_ids", p});
  p = {};
  p.logprobs = 50;
  cases.push_back({"logprobs", p});
  p = {};
  p.temperature = NAN;
  cases.push_back({"temperature", p});
  for (const auto& c : cases) {
    auto s = ValidateSamplingParams(c.p, 100, 2048);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s.message();
  }
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams(), 100, 2048).ok());
}

}  // namespace
}  // namespace tinyserve
