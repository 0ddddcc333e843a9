// SmolLM2-135M-Instruct Q4_1 against llama.cpp (tests/golden/smollm2, made by
// scripts/make_engine_goldens.py with llama-cpp-python): logits at every position of three
// prompts (one of 1,100 tokens), argmax agreement, and 64 greedy tokens identical up to
// llama.cpp's first near-tie. Skips when the model is not downloaded.
//
// Tolerance. Both engines quantize activations to int8 per block before every weight product
// (on a CPU with AMX our products of 12+ tokens multiply in bf16 instead, so our prompt logits
// come from that path; ctest also runs this test with TINYSERVE_CPU_ISA=avx512); the two never
// round identically, and attention amplifies the difference with context. llama.cpp
// does not reproduce itself at that level either: the same prompt evaluated one token at a time
// (its decode kernels) instead of in one batch moves its logits by up to 3.0% (38 tokens) and
// 5.0% (1,100 tokens) of their range and changes 2.6% and 4.4% of the argmaxes (recorded per
// prompt in manifest.json by the golden script). So the bound here is 4% of the range or 1.5x
// llama.cpp's own spread, whichever is larger, and argmax agreement no more than 2 points below
// llama.cpp's own. docs/PERFORMANCE.md ("Correctness against llama.cpp") has the figures.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "common/paths.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/engine/engine.h"
#include "worker/model/weight_source.h"
#include "worker/runner/transformer.h"

namespace tinyserve {
namespace {

struct Position {
  int32_t argmax;
  float max, min;
  float fixed[32];
  int32_t top_ids[8];
  float top[8];
};

class Reader {
 public:
  explicit Reader(const std::string& path) : in_(path, std::ios::binary) {}
  bool ok() const { return in_.good(); }
  template <typename T>
  T Get() {
    T v;
    in_.read(reinterpret_cast<char*>(&v), sizeof(T));
    return v;
  }

 private:
  std::ifstream in_;
};

std::vector<float> AllLogits(TransformerRunner& r, const std::vector<int32_t>& ids) {
  const int ps = 16;
  const int64_t n_pages = (static_cast<int64_t>(ids.size()) + ps - 1) / ps;
  PagedKvCache kv(r.MakeKvConfig(ps, n_pages));
  std::vector<int32_t> pages;
  for (int64_t p = 0; p < n_pages; ++p) {
    pages.push_back(static_cast<int32_t>(p));
    kv.ResetPage(static_cast<int32_t>(p));
  }
  std::vector<float> all, logits;
  for (size_t start = 0; start < ids.size(); start += 512) {  // the engine's prefill chunking
    SeqInput in;
    in.tokens = &ids[start];
    in.n = static_cast<int>(std::min<size_t>(512, ids.size() - start));
    in.start_pos = static_cast<int64_t>(start);
    in.pages = &pages;
    in.all_logits = true;
    EXPECT_TRUE(r.Forward({in}, &kv, &logits).ok());
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

class SmolLM2Golden : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!FileExists(DefaultModelPath())) GTEST_SKIP() << "no " << DefaultModelPath();
  }
};

TEST_F(SmolLM2Golden, LogitsCloseToLlamaCppAndArgmaxAgrees) {
  auto src = OpenWeightSource(DefaultModelPath());
  ASSERT_TRUE(src.ok()) << src.status();
  ThreadPool pool(2);
  RunnerOptions ro;
  ro.pool = &pool;
  auto runner = TransformerRunner::Create(**src, ro);
  ASSERT_TRUE(runner.ok());
  std::ifstream mf("tests/golden/smollm2/manifest.json");
  const nlohmann::json manifest = nlohmann::json::parse(mf);
  const std::vector<int> fixed = manifest["fixed_ids"].get<std::vector<int>>();
  Reader rd("tests/golden/smollm2/logits.bin");
  ASSERT_TRUE(rd.ok());
  const uint32_t n_prompts = rd.Get<uint32_t>();
  ASSERT_EQ(n_prompts, 3u);
  const int vocab = (*runner)->config().vocab_size;
  for (uint32_t p = 0; p < n_prompts; ++p) {
    const uint32_t n = rd.Get<uint32_t>();
    std::vector<int32_t> ids(n);
    for (auto& id : ids) id = rd.Get<int32_t>();
    const std::vector<float> ours = AllLogits(**runner, ids);
    double worst = 0;
    int argmax_same = 0;
    for (uint32_t t = 0; t < n; ++t) {
      Position g;
      g.argmax = rd.Get<int32_t>();
      g.max = rd.Get<float>();
      g.min = rd.Get<float>();
      for (float& x : g.fixed) x = rd.Get<float>();
      for (int32_t& x : g.top_ids) x = rd.Get<int32_t>();
      for (float& x : g.top) x = rd.Get<float>();
      const float* row = &ours[static_cast<size_t>(t) * vocab];
      const double range = g.max - g.min;
      int32_t best = 0;
      for (int v = 1; v < vocab; ++v)
        if (row[v] > row[best]) best = v;
      argmax_same += best == g.argmax;
      for (int i = 0; i < 32; ++i)
        worst = std::max(worst, std::fabs(row[fixed[i]] - g.fixed[i]) / range);
      double pos_worst = 0;
      for (int i = 0; i < 32; ++i)
        pos_worst = std::max(pos_worst, std::fabs(row[fixed[i]] - g.fixed[i]) / range);
      for (int i = 0; i < 8; ++i)
        pos_worst = std::max(pos_worst, std::fabs(row[g.top_ids[i]] - g.top[i]) / range);
      worst = std::max(worst, pos_worst);
      if (std::getenv("TINYSERVE_GOLDEN_VERBOSE") != nullptr && (t < 8 || t % 100 == 0))
        std::printf("  position %u: worst %.4f, argmax ours %d llama.cpp %d, range %.2f\n", t,
                    pos_worst, best, g.argmax, range);
    }
    const nlohmann::json& info = manifest["prompts"][p];
    const std::string name = info["name"];
    const double self_worst = info["llama_cpp_self_worst_share"];
    const double self_agree = info["llama_cpp_self_argmax_agreement"];
    const double agree = static_cast<double>(argmax_same) / n;
    EXPECT_LE(worst, std::max(0.04, 1.5 * self_worst))
        << name << ": largest difference as a share of llama.cpp's range";
    // As many argmaxes as llama.cpp agrees with itself on, less 2 % of the positions or one
    // (a short prompt's near tie, decided by rounding, is several percent).
    const int self_same = static_cast<int>(std::lround(std::min(1.0, self_agree) * n));
    EXPECT_GE(argmax_same, self_same - std::max(1, static_cast<int>(0.02 * n))) << name;
    if (self_agree == 1.0) {
      EXPECT_EQ(argmax_same, static_cast<int>(n)) << name;
    }
    std::printf("%s: %u positions, worst |ours - llama.cpp| = %.4f of the range (llama.cpp vs "
                "itself %.4f), argmax agreement %.4f (llama.cpp vs itself %.4f)\n",
                name.c_str(), n, worst, self_worst, agree, self_agree);
  }
}

class Collect : public RequestSink {
 public:
  void OnTokens(const std::vector<GeneratedToken>& t, const RequestUsage&) override {
    for (const auto& x : t) ids.push_back(x.id);
  }
  void OnFinish(FinishReason, const RequestUsage&, absl::Status) override {}
  std::vector<int32_t> ids;
};

// 64 greedy tokens through the engine, identical to llama.cpp's at least up to the first step
// where llama.cpp itself nearly tied: where its best and second-best logits were less than
// kNearTie apart. Our logits sit within 3-4 % of the range (about a logit) of llama.cpp's, and
// rounding-level changes anywhere upstream move them by as much (the int8 activations turn
// rounding into quantization steps; see docs/CORRECTNESS.md), so past a near-tie either choice
// is right and the two continuations are different texts. Before it, a differing token means a
// real disagreement.
constexpr float kNearTie = 0.5f;

EngineOptions SmolLM2Engine(int64_t kv_pages) {
  EngineOptions o;
  o.model_path = DefaultModelPath();
  o.kv_pages = kv_pages;
  o.threads = 2;
  return o;
}

TEST_F(SmolLM2Golden, SixtyFourGreedyTokensIdentical) {
  auto engine = Engine::Create(SmolLM2Engine(64));
  ASSERT_TRUE(engine.ok());
  std::ifstream mf("tests/golden/smollm2/manifest.json");
  const nlohmann::json manifest = nlohmann::json::parse(mf);
  for (const auto& p : manifest["prompts"]) {
    if (!p.contains("greedy_64")) continue;
    GenerateRequest r;
    r.request_id = p["name"];
    r.prompt_ids = p["prompt_ids"].get<std::vector<int32_t>>();
    r.sampling.max_tokens = 64;
    r.sampling.ignore_eos = true;
    auto sink = std::make_shared<Collect>();
    ASSERT_TRUE((*engine)->Submit(r, sink).ok());
    (*engine)->RunUntilIdle();
    const auto want = p["greedy_64"].get<std::vector<int32_t>>();
    const auto alt = p["greedy_64_token_by_token"].get<std::vector<int32_t>>();
    const auto margins = p["greedy_64_margins"].get<std::vector<float>>();
    ASSERT_EQ(margins.size(), want.size());
    size_t self = 0, same = 0, tie = 0;
    while (self < want.size() && want[self] == alt[self]) ++self;
    while (same < want.size() && same < sink->ids.size() && want[same] == sink->ids[same]) ++same;
    while (tie < margins.size() && margins[tie] >= kNearTie) ++tie;
    std::printf(
        "%s: first %zu of 64 greedy tokens identical (llama.cpp vs itself: %zu; its "
        "first near-tie: step %zu)\n",
        std::string(p["name"]).c_str(), same, self, tie);
    EXPECT_GE(same, tie) << p["name"];
  }
}

// Speculative decoding on the real model: the same greedy tokens as plain decoding, with more
// drafted rows per step than the batch-invariant product size (MatMulInvariantRows caps them),
// alone and with the prompts batched together.
TEST_F(SmolLM2Golden, SpeculativeDecodingKeepsTheTokens) {
  EngineOptions o = SmolLM2Engine(256);
  auto plain = Engine::Create(o);
  ASSERT_TRUE(plain.ok());
  o.spec_tokens = 16;
  o.spec_ngram_min = 1;
  auto spec = Engine::Create(o);
  ASSERT_TRUE(spec.ok());
  std::ifstream mf("tests/golden/smollm2/manifest.json");
  const nlohmann::json manifest = nlohmann::json::parse(mf);
  std::vector<GenerateRequest> reqs;
  for (const auto& p : manifest["prompts"]) {
    if (!p.contains("prompt_ids")) continue;
    GenerateRequest r;
    r.request_id = p["name"];
    r.prompt_ids = p["prompt_ids"].get<std::vector<int32_t>>();
    r.sampling.max_tokens = 96;
    r.sampling.ignore_eos = true;
    reqs.push_back(r);
  }
  auto run = [&](Engine& e, const std::vector<GenerateRequest>& batch) {
    std::vector<std::shared_ptr<Collect>> sinks;
    for (const auto& r : batch) {
      sinks.push_back(std::make_shared<Collect>());
      EXPECT_TRUE(e.Submit(r, sinks.back()).ok());
    }
    e.RunUntilIdle();
    return sinks;
  };
  for (const auto& r : reqs) {
    const auto want = run(**plain, {r})[0]->ids;
    EXPECT_EQ(run(**spec, {r})[0]->ids, want) << r.request_id << " alone";
  }
  const auto want = run(**plain, reqs), got = run(**spec, reqs);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(got[i]->ids, want[i]->ids) << reqs[i].request_id << " batched";
  EXPECT_GT((*spec)->Stats().spec_accepted_tokens_total, 0);
}

}  // namespace
}  // namespace tinyserve
