// File: worker/engine/engine_test_util.h
// What the engine tests share: a sink that collects a request's stream, a greedy request, and
// running prompts one engine each or all together in one engine (for "batched equals alone").
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/paths.h"
#include "gtest/gtest.h"
#include "worker/engine/engine.h"

namespace tinyserve::engine_testing {

// Four short story openings, and a two-sentence prefix for the prefix-cache tests.
inline const std::vector<std::string> kPrompts = {"Once upon a time", "Lily and Ben", "The dog",
                                                  "One day, a little bird"};
inline const std::string kSharedPrefix =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "park. One day, she saw a big, red ball.";

// stories260K with 256 pages of KV and a 512-token context.
inline EngineOptions Stories260kOptions() {
  EngineOptions o;
  o.model_path = Stories260kPath();
  o.kv_pages = 256;
  o.max_context = 512;
  return o;
}

class CollectSink : public RequestSink {
 public:
  void OnTokens(const std::vector<GeneratedToken>& tokens, const RequestUsage&) override {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& t : tokens) {
      ids.push_back(t.id);
      text += t.text;
      texts.push_back(t.text);
      logprobs.push_back(t.logprob);
      tops.push_back(t.top.size());
      top_lists.push_back(t.top);
    }
  }
  void OnFinish(FinishReason r, const RequestUsage& u, absl::Status s) override {
    reason = r;
    usage = u;
    status = s;
    finished++;
  }
  std::mutex mu;
  std::vector<int32_t> ids;
  std::string text;
  std::vector<std::string> texts;  // per token
  std::vector<float> logprobs;
  std::vector<size_t> tops;
  std::vector<std::vector<TokenLogprob>> top_lists;  // the top-n alternatives per token
  FinishReason reason = FinishReason::kError;
  RequestUsage usage;
  absl::Status status;
  int finished = 0;
};

// Also keeps an embedding request's vector (GenerateRequest::pooling).
class EmbedSink : public CollectSink {
 public:
  void OnEmbedding(const std::vector<float>& v) override {
    values = v;
    embeddings++;
  }
  std::vector<float> values;
  int embeddings = 0;
};

inline GenerateRequest Greedy(const Engine& e, const std::string& text, int max_tokens,
                              bool ignore_eos = false) {
  GenerateRequest r;
  r.request_id = text;
  r.prompt_ids = e.tokenizer().Encode(text, false, true);
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = ignore_eos;
  return r;
}

// Every prompt in one engine, submitted together; the sinks in prompt order.
inline std::vector<std::shared_ptr<CollectSink>> RunTogether(
    Engine& e, const std::vector<std::string>& prompts, int max_tokens, bool ignore_eos = false) {
  std::vector<std::shared_ptr<CollectSink>> sinks;
  for (const auto& p : prompts) {
    sinks.push_back(std::make_shared<CollectSink>());
    EXPECT_TRUE(e.Submit(Greedy(e, p, max_tokens, ignore_eos), sinks.back()).ok());
  }
  e.RunUntilIdle();
  return sinks;
}

// Each prompt alone in a fresh engine made with `options`; its tokens.
inline std::vector<std::vector<int32_t>> RunEachAlone(const EngineOptions& options,
                                                      const std::vector<std::string>& prompts,
                                                      int max_tokens, bool ignore_eos = false) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : prompts) {
    auto e = Engine::Create(options);
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok()) return out;
    out.push_back(RunTogether(**e, {p}, max_tokens, ignore_eos)[0]->ids);
  }
  return out;
}

}  // namespace tinyserve::engine_testing
