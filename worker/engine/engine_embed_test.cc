// Embedding requests (GenerateRequest::pooling) through the engine on stories260K:
//   - mean pooling equals the mean of the last-token embeddings of every prefix (in a causal
//     model, token t's hidden state is the last token's of the prefix [0, t]);
//   - the same vectors with chunked prefill, from a prefix-cache hit, and under preemption;
//   - generation batched beside embeddings gives its tokens unchanged; no page leaks.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/paths.h"
#include "gtest/gtest.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_test_util.h"

namespace tinyserve {
namespace {

using engine_testing::CollectSink;
using engine_testing::EmbedSink;
using engine_testing::Greedy;

EngineOptions Options() { return engine_testing::Stories260kOptions(); }

GenerateRequest Embed(const std::vector<int32_t>& ids, Pooling pooling, const std::string& id) {
  GenerateRequest r;
  r.request_id = id;
  r.prompt_ids = ids;
  r.pooling = pooling;
  return r;
}

// Each request's embedding, all submitted together to one engine made with `o`.
std::vector<std::vector<float>> EmbedAll(const EngineOptions& o,
                                         const std::vector<GenerateRequest>& requests) {
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  std::vector<std::shared_ptr<EmbedSink>> sinks;
  for (const GenerateRequest& r : requests) {
    sinks.push_back(std::make_shared<EmbedSink>());
    EXPECT_TRUE((*e)->Submit(r, sinks.back()).ok());
  }
  (*e)->RunUntilIdle();
  std::vector<std::vector<float>> out;
  for (const auto& s : sinks) {
    EXPECT_EQ(s->embeddings, 1);
    EXPECT_EQ(s->finished, 1);
    EXPECT_EQ(s->reason, FinishReason::kLength);
    EXPECT_TRUE(s->ids.empty());  // nothing generated
    out.push_back(s->values);
  }
  EXPECT_EQ((*e)->Stats().kv_pages_used, 0);
  return out;
}

float MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

std::vector<int32_t> Tokens(const std::string& text) {
  auto e = Engine::Create(Options());
  return (*e)->tokenizer().Encode(text, false, true);
}

TEST(EngineEmbed, MeanIsTheMeanOfEveryPrefixsLastToken) {
  const std::vector<int32_t> ids = Tokens(engine_testing::kSharedPrefix);
  ASSERT_GT(ids.size(), 20u);
  std::vector<GenerateRequest> prefixes;
  for (size_t n = 1; n <= ids.size(); ++n)
    prefixes.push_back(Embed({ids.begin(), ids.begin() + n}, Pooling::kLast, std::to_string(n)));
  EngineOptions o = Options();
  o.prefix_caching = false;
  const auto lasts = EmbedAll(o, prefixes);
  std::vector<float> want(lasts[0].size(), 0.0f);
  for (const auto& v : lasts)
    for (size_t d = 0; d < v.size(); ++d) want[d] += v[d] / static_cast<float>(ids.size());
  const auto mean = EmbedAll(Options(), {Embed(ids, Pooling::kMean, "mean")});
  ASSERT_EQ(mean[0].size(), static_cast<size_t>(64));  // stories260K's width
  EXPECT_LT(MaxDiff(mean[0], want), 1e-4f);
  // Not trivially so: the last token's vector is not the mean.
  EXPECT_GT(MaxDiff(mean[0], lasts.back()), 0.1f);
}

TEST(EngineEmbed, ChunksCacheHitsAndPreemptionGiveTheSameVectors) {
  std::vector<GenerateRequest> reqs;
  for (const std::string& p : engine_testing::kPrompts) {
    const std::vector<int32_t> ids = Tokens(engine_testing::kSharedPrefix + " " + p);
    reqs.push_back(Embed(ids, Pooling::kMean, p + "/mean"));
    reqs.push_back(Embed(ids, Pooling::kLast, p + "/last"));
  }
  EngineOptions plain = Options();
  plain.prefix_caching = false;
  std::vector<std::vector<float>> alone;
  for (const GenerateRequest& r : reqs) alone.push_back(EmbedAll(plain, {r})[0]);

  // Chunked prefill beside two generations whose growth preempts the embeddings (a lower
  // priority) when the 9 pages run out.
  EngineOptions chunked = plain;
  chunked.max_step_tokens = 7;
  chunked.kv_pages = 9;
  const std::vector<std::string> gen_prompts = {"Once upon a time", "Lily and Ben"};
  const auto gen_alone = engine_testing::RunEachAlone(plain, gen_prompts, 60, true);
  auto e = Engine::Create(chunked);
  ASSERT_TRUE(e.ok());
  std::vector<std::shared_ptr<CollectSink>> gens;
  for (const std::string& p : gen_prompts) {
    gens.push_back(std::make_shared<CollectSink>());
    ASSERT_TRUE((*e)->Submit(Greedy(**e, p, 60, true), gens.back()).ok());
  }
  std::vector<std::shared_ptr<EmbedSink>> sinks;
  for (GenerateRequest r : reqs) {
    r.priority = 5;
    sinks.push_back(std::make_shared<EmbedSink>());
    ASSERT_TRUE((*e)->Submit(r, sinks.back()).ok());
  }
  (*e)->RunUntilIdle();
  EXPECT_GT((*e)->Stats().preemptions_total, 0);
  EXPECT_EQ((*e)->Stats().kv_pages_used, 0);
  for (size_t i = 0; i < gens.size(); ++i) EXPECT_EQ(gens[i]->ids, gen_alone[i]);
  int preempted_mean = 0;  // a mean sum restarts with its recomputation
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_LT(MaxDiff(sinks[i]->values, alone[i]), 1e-4f) << reqs[i].request_id;
    preempted_mean += reqs[i].pooling == Pooling::kMean && sinks[i]->usage.preemptions > 0;
  }
  EXPECT_GT(preempted_mean, 0);

  // Prefix caching: the shared prefix's pages are reused by last pooling (which still matches)
  // and not by mean pooling, which needs every token.
  auto cached = Engine::Create(Options());
  ASSERT_TRUE(cached.ok());
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto sink = std::make_shared<EmbedSink>();
    ASSERT_TRUE((*cached)->Submit(reqs[i], sink).ok());
    (*cached)->RunUntilIdle();
    EXPECT_LT(MaxDiff(sink->values, alone[i]), 1e-4f) << reqs[i].request_id;
    const bool mean = reqs[i].pooling == Pooling::kMean;
    if (mean) {
      EXPECT_EQ(sink->usage.cached_tokens, 0) << reqs[i].request_id;
    } else if (i > 1) {
      EXPECT_GT(sink->usage.cached_tokens, 0) << reqs[i].request_id;
    }
  }
}

TEST(EngineEmbed, GenerationBesideEmbeddingsIsUnchanged) {
  auto alone = Engine::Create(Options());
  ASSERT_TRUE(alone.ok());
  const auto want = engine_testing::RunTogether(**alone, {"Once upon a time"}, 40)[0]->ids;
  auto e = Engine::Create(Options());
  ASSERT_TRUE(e.ok());
  auto gen = std::make_shared<CollectSink>();
  ASSERT_TRUE((*e)->Submit(Greedy(**e, "Once upon a time", 40), gen).ok());
  std::vector<std::shared_ptr<EmbedSink>> sinks;
  for (int i = 0; i < 3; ++i) {
    sinks.push_back(std::make_shared<EmbedSink>());
    ASSERT_TRUE((*e)->Submit(Embed(Tokens(engine_testing::kPrompts[i]), Pooling::kMean,
                                   absl::StrCat("e", i)),
                             sinks.back())
                    .ok());
  }
  (*e)->RunUntilIdle();
  EXPECT_EQ(gen->ids, want);
  for (const auto& s : sinks) EXPECT_EQ(s->embeddings, 1);
  EXPECT_EQ((*e)->Stats().kv_pages_used, 0);
}

TEST(EngineEmbed, ContinuationIsRefused) {
  auto e = Engine::Create(Options());
  ASSERT_TRUE(e.ok());
  GenerateRequest r = Embed(Tokens("The dog"), Pooling::kLast, "x");
  r.continuation_ids = {5};
  const absl::Status s = (*e)->Submit(r, std::make_shared<EmbedSink>());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("continuation"), std::string::npos) << s;
}

}  // namespace
}  // namespace tinyserve
