// The model runner against independent implementations and its tensor-parallel shards:
//   - small random Llama and GPT-2 checkpoints (scripts/make_test_models.py) against
//     transformers' logits (tests/golden/hf, made by scripts/make_hf_goldens.py);
//   - two half-shards (world size 2) summed through the in-process communicator against the
//     unsharded runner.
#include "worker/runner/transformer.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "common/paths.h"
#include "common/thread_pool.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/model/weight_source.h"
#include "worker/tp/communicator.h"

namespace tinyserve {
namespace {

std::string TestModels() {
  const char* v = std::getenv("TINYSERVE_TEST_MODELS");
  return v ? v : "";
}

// A fresh cache (pages of 16 tokens) holding one sequence of n tokens in pages 0, 1, ...
struct FreshCache {
  static constexpr int kPageSize = 16;
  FreshCache(const TransformerRunner& r, size_t n, KvDtype dtype = KvDtype::kF16)
      : kv(WithDtype(
            r.MakeKvConfig(kPageSize, (static_cast<int64_t>(n) + kPageSize - 1) / kPageSize),
            dtype)) {
    for (int32_t p = 0; p < kv.config().num_pages; ++p) {
      pages.push_back(p);
      kv.ResetPage(p);
    }
  }
  static KvCacheConfig WithDtype(KvCacheConfig c, KvDtype dtype) {
    c.dtype = dtype;
    return c;
  }
  PagedKvCache kv;
  std::vector<int32_t> pages;
};

// Runs all tokens of one sequence through a fresh cache; returns [n][vocab] logits.
std::vector<float> RunAll(TransformerRunner& r, const std::vector<int32_t>& ids, int chunk = 0,
                          KvDtype dtype = KvDtype::kF16) {
  FreshCache c(r, ids.size(), dtype);
  PagedKvCache& kv = c.kv;
  const std::vector<int32_t>& pages = c.pages;
  std::vector<float> all, logits;
  const int step = chunk > 0 ? chunk : static_cast<int>(ids.size());
  for (size_t start = 0; start < ids.size(); start += step) {
    SeqInput in;
    in.tokens = &ids[start];
    in.n = static_cast<int>(std::min<size_t>(step, ids.size() - start));
    in.start_pos = static_cast<int64_t>(start);
    in.pages = &pages;
    in.all_logits = true;
    auto s = r.Forward({in}, &kv, &logits);
    EXPECT_TRUE(s.ok()) << s;
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

TEST(TransformerRunner, MatchesTransformersOnRandomHfModels) {
  if (TestModels().empty()) GTEST_SKIP() << "TINYSERVE_TEST_MODELS is not set (CTest fixture)";
  std::ifstream mf("tests/golden/hf/manifest.json");
  ASSERT_TRUE(mf.good());
  const nlohmann::json manifest = nlohmann::json::parse(mf);
  for (const auto& [name, info] : manifest["models"].items()) {
    auto src = OpenWeightSource(TestModels() + "/" + name);
    ASSERT_TRUE(src.ok()) << name << ": " << src.status();
    // The default, and token-by-token decode with attention split into parts of 1 page (merged
    // by log-sum-exp) on a pool.
    ThreadPool pool(2);
    RunnerOptions ro, split;
    split.attention_part_pages = 1;
    split.pool = &pool;
    auto runner = TransformerRunner::Create(**src, ro);
    ASSERT_TRUE(runner.ok()) << name << ": " << runner.status();
    auto split_runner = TransformerRunner::Create(**src, split);
    ASSERT_TRUE(split_runner.ok()) << name << ": " << split_runner.status();
    std::ifstream lf("tests/golden/hf/" + info["logits_file"].get<std::string>(), std::ios::binary);
    ASSERT_TRUE(lf.good()) << name;
    const int vocab = info["vocab_size"];
    for (const auto& seq : manifest["sequences"]) {
      std::vector<int32_t> ids = seq.get<std::vector<int32_t>>();
      std::vector<float> want(ids.size() * vocab);
      lf.read(reinterpret_cast<char*>(want.data()), want.size() * sizeof(float));
      for (int chunk : {0, 5, -1}) {  // one prefill; chunked prefill over pages; split decode
        const std::vector<float> got =
            RunAll(chunk < 0 ? **split_runner : **runner, ids, std::abs(chunk));
        ASSERT_EQ(got.size(), want.size());
        for (size_t t = 0; t < ids.size(); ++t) {
          float scale = 0, err = 0;
          for (int v = 0; v < vocab; ++v) {
            scale = std::max(scale, std::fabs(want[t * vocab + v]));
            err = std::max(err, std::fabs(got[t * vocab + v] - want[t * vocab + v]));
          }
          // 1e-3 relative to the row's largest logit (K/V are stored in fp16).
          EXPECT_LE(err, 1e-3f * scale) << name << " position " << t << " chunk " << chunk;
        }
      }
    }
  }
}

// --rope-scaling: YaRN put on qwen3-tiny at run time gives the config qwen3-tiny-yarn's
// config.json gives (whose logits match transformers' in the test above); bad settings are
// refused by name.
TEST(TransformerRunner, RopeScalingOverrideMatchesTheConfigFile) {
  if (TestModels().empty()) GTEST_SKIP() << "TINYSERVE_TEST_MODELS is not set (CTest fixture)";
  auto yarn = OpenWeightSource(TestModels() + "/qwen3-tiny-yarn");
  ASSERT_TRUE(yarn.ok()) << yarn.status();
  auto plain = OpenWeightSource(TestModels() + "/qwen3-tiny");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE((*plain)->config().rope_freq_factors.empty());
  auto over = WithRopeScaling(
      std::move(*plain),
      R"({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16})");
  ASSERT_TRUE(over.ok()) << over.status();
  const ModelConfig &a = (*over)->config(), &b = (*yarn)->config();
  ASSERT_FALSE(b.rope_freq_factors.empty());
  EXPECT_EQ(a.rope_freq_factors, b.rope_freq_factors);
  EXPECT_EQ(a.rope_attn_factor, b.rope_attn_factor);
  EXPECT_GT(a.rope_attn_factor, 1.1f);
  EXPECT_EQ(a.max_context, b.max_context);
  EXPECT_TRUE((*over)->Has("model.embed_tokens.weight") || (*over)->Has("token_embd.weight"));
  auto runner = TransformerRunner::Create(**over, RunnerOptions());
  ASSERT_TRUE(runner.ok()) << runner.status();

  auto again = OpenWeightSource(TestModels() + "/qwen3-tiny");
  ASSERT_TRUE(again.ok());
  auto bad = WithRopeScaling(std::move(*again), "{\"rope_type\": \"yarn\"");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("rope_scaling"), std::string::npos) << bad.status();
  auto gpt2 = OpenWeightSource(TestModels() + "/gpt2-tiny");
  ASSERT_TRUE(gpt2.ok());
  auto none = WithRopeScaling(std::move(*gpt2), R"({"rope_type": "linear", "factor": 2})");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnimplemented) << none.status();
}

// Sliding windows that start inside int8 pages (sealed and still filling): the logits follow
// the fp16 cache's within int8's rounding (a window that read the wrong slots would not).
TEST(TransformerRunner, SlidingWindowsOverInt8PagesFollowFp16) {
  if (TestModels().empty()) GTEST_SKIP() << "TINYSERVE_TEST_MODELS is not set (CTest fixture)";
  auto src = OpenWeightSource(TestModels() + "/gemma3-tiny");
  ASSERT_TRUE(src.ok()) << src.status();
  auto runner = TransformerRunner::Create(**src, RunnerOptions());
  ASSERT_TRUE(runner.ok()) << runner.status();
  std::vector<int32_t> ids;
  for (int i = 0; i < 45; ++i) ids.push_back((i * 53 + 7) % 260 + 5);
  for (int chunk : {0, 1, 5}) {
    const std::vector<float> f16 = RunAll(**runner, ids, chunk);
    const std::vector<float> i8 = RunAll(**runner, ids, chunk, KvDtype::kInt8);
    ASSERT_EQ(f16.size(), i8.size());
    float scale = 0, err = 0;
    for (size_t i = 0; i < f16.size(); ++i) {
      scale = std::max(scale, std::fabs(f16[i]));
      err = std::max(err, std::fabs(i8[i] - f16[i]));
    }
    EXPECT_LE(err, 0.05f * scale) << "chunk " << chunk;
  }
}

// Prefills ids[0, prefix) and then decodes the rest: one token per Forward, or all of them in
// one Forward as decode_rows (speculative verification). Returns the decode rows' logits.
std::vector<float> DecodeTail(TransformerRunner& r, const std::vector<int32_t>& ids, int prefix,
                              bool as_rows) {
  FreshCache c(r, ids.size());
  std::vector<float> all, logits;
  auto run = [&](int start, int n, bool rows) {
    SeqInput in;
    in.tokens = &ids[start];
    in.n = n;
    in.start_pos = start;
    in.pages = &c.pages;
    in.all_logits = in.decode_rows = rows;
    auto st = r.Forward({in}, &c.kv, &logits);
    EXPECT_TRUE(st.ok()) << st;
  };
  run(0, prefix, false);
  const int tail = static_cast<int>(ids.size()) - prefix;
  if (as_rows) {
    run(prefix, tail, true);
    return logits;
  }
  for (int t = prefix; t < static_cast<int>(ids.size()); ++t) {
    run(t, 1, false);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

// Rows verified together give bit for bit the logits of single-token decode steps, on head
// sizes 8 and 64, with attention split into parts (some rows of one Forward split, some not)
// and without.
TEST(TransformerRunner, DecodeRowsEqualSingleTokenSteps) {
  std::vector<std::string> paths = {Stories260kPath()};
  if (!TestModels().empty()) {
    paths.push_back(TestModels() + "/llama-d64");
    paths.push_back(TestModels() + "/gemma3-tiny");  // sliding layers: rows attend their windows
  }
  std::vector<int32_t> ids;
  for (int i = 0; i < 41; ++i) ids.push_back((i * 37 + 11) % 250 + 3);
  ThreadPool pool(2);
  for (const auto& path : paths) {
    auto src = OpenWeightSource(path);
    ASSERT_TRUE(src.ok()) << src.status();
    for (int part_pages : {64, 2}) {
      RunnerOptions ro;
      ro.attention_part_pages = part_pages;
      ro.pool = &pool;
      auto runner = TransformerRunner::Create(**src, ro);
      ASSERT_TRUE(runner.ok()) << runner.status();
      // Rows at positions 29..40 cross the 2-page (32-token) part boundary.
      const std::vector<float> steps = DecodeTail(**runner, ids, 29, false);
      const std::vector<float> rows = DecodeTail(**runner, ids, 29, true);
      ASSERT_EQ(rows.size(), steps.size());
      EXPECT_TRUE(rows == steps) << path << " parts of " << part_pages << " pages";
    }
  }
}

// Runs world_size ranks as threads and returns rank 0's logits (all ranks agree).
std::vector<float> RunSharded(const WeightSource& src, int world, const std::vector<int32_t>& ids) {
  auto comms = MakeInProcessGroup(world);
  std::vector<std::vector<float>> out(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      RunnerOptions ro;
      ro.rank = r;
      ro.world_size = world;
      ro.comm = comms[r].get();
      auto runner = TransformerRunner::Create(src, ro);
      ASSERT_TRUE(runner.ok()) << runner.status();
      out[r] = RunAll(**runner, ids);
    });
  for (auto& t : threads) t.join();
  for (int r = 1; r < world; ++r) EXPECT_EQ(out[r], out[0]) << "rank " << r;
  return out[0];
}

void ExpectShardsSumToWhole(const std::string& path, const std::vector<int32_t>& ids) {
  auto src = OpenWeightSource(path);
  ASSERT_TRUE(src.ok()) << src.status();
  RunnerOptions ro;
  auto whole = TransformerRunner::Create(**src, ro);
  ASSERT_TRUE(whole.ok());
  const std::vector<float> want = RunAll(**whole, ids);
  const std::vector<float> got = RunSharded(**src, 2, ids);
  ASSERT_EQ(got.size(), want.size());
  float scale = 0, err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::fabs(want[i]));
    err = std::max(err, std::fabs(got[i] - want[i]));
  }
  EXPECT_LE(err, 1e-4f * scale) << path;
}

TEST(TransformerRunner, TwoHalfShardsSumToTheUnshardedResult) {
  ExpectShardsSumToWhole(Stories260kPath(), {1, 403, 407, 261, 378, 432, 383, 286, 261, 376});
  if (!TestModels().empty()) {
    ExpectShardsSumToWhole(TestModels() + "/llama-tiny", {5, 9, 200, 17, 33, 1});
    ExpectShardsSumToWhole(TestModels() + "/gpt2-tiny", {5, 9, 200, 17, 33, 1});
    // Post-norms after the all-reduce; a window of 8 crossed.
    ExpectShardsSumToWhole(TestModels() + "/gemma3-tiny",
                           {5, 9, 200, 17, 33, 1, 70, 71, 72, 90, 100, 3, 4, 250});
  }
}

TEST(TransformerRunner, RejectsBadShardingAndTokens) {
  auto src = OpenWeightSource(Stories260kPath());
  ASSERT_TRUE(src.ok());
  RunnerOptions ro;
  ro.world_size = 3;  // 8 heads are not divisible by 3
  ro.comm = nullptr;
  EXPECT_FALSE(TransformerRunner::Create(**src, ro).ok());
  RunnerOptions one;
  auto r = TransformerRunner::Create(**src, one);
  ASSERT_TRUE(r.ok());
  PagedKvCache kv((*r)->MakeKvConfig(16, 1));
  std::vector<int32_t> pages = {0};
  std::vector<int32_t> ids = {1, 9999};
  SeqInput in;
  in.tokens = ids.data();
  in.n = 2;
  in.pages = &pages;
  std::vector<float> logits;
  auto s = (*r)->Forward({in}, &kv, &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("9999"), std::string::npos);
}

}  // namespace
}  // namespace tinyserve
