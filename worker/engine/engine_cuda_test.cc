// The engine on the CUDA backend (--device cuda) end to end: greedy tokens against the CPU engine,
// batching, quest, the tiered KV cache, prefix caching and preemption, page accounting,
// embeddings. The model
// is a random Llama with head_dim 64 (the CUDA kernels take 64 or 128; stories260K has 8) made by
// scripts/make_tp_bench_model.py as the CTest fixture cuda_test_model ($TINYSERVE_CUDA_TEST_MODEL).
// Built twice: engine_cuda_test on the real backend (skips without a GPU) and
// emu_engine_cuda_test on the CPU emulator of CUDA (kernels/cuda/emu), which runs in CI.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <random>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_test_util.h"
#include "worker/hf/safetensors_test_util.h"

namespace tinyserve {
namespace {

using engine_testing::CollectSink;
using engine_testing::RunEachAlone;
using engine_testing::RunTogether;

using engine_testing::kPrompts;

EngineOptions Options() {
  EngineOptions o;
  const char* model = std::getenv("TINYSERVE_CUDA_TEST_MODEL");
  o.model_path = model != nullptr ? model : "build/test-models/llama-d64";
  o.device = "cuda";
  o.kv_pages = 256;
  o.max_context = 512;
  return o;
}

// nullptr (and the test skips) when there is no CUDA device.
std::unique_ptr<Engine> MakeEngine(const EngineOptions& o) {
  auto e = Engine::Create(o);
  if (!e.ok() && absl::StrContains(e.status().message(), "no CUDA device")) return nullptr;
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}
#define MAKE_OR_SKIP(var, options)                      \
  auto var = MakeEngine(options);                       \
  if (!var) GTEST_SKIP() << "no CUDA device";

// A random model may say its end-of-text token at any time: run to max_tokens.
GenerateRequest Greedy(const Engine& e, const std::string& text, int max_tokens) {
  return engine_testing::Greedy(e, text, max_tokens, /*ignore_eos=*/true);
}

// `got` (the GPU's) has `want`'s (the CPU's, run with logprobs 2) greedy tokens. The GPU path
// runs f16 weights and activations where the CPU runs f32, in another summation order, so on a
// random model a near-tie may go the other way: the tokens must agree up to the first
// difference, and there the GPU's token must be the CPU's runner-up within 0.05 nats of its top
// (after that the paths differ).
void ExpectSameGreedyTokens(const CollectSink& got, const CollectSink& want,
                            const std::string& tag) {
  ASSERT_TRUE(got.status.ok()) << tag << ": " << got.status;
  ASSERT_EQ(got.ids.size(), want.ids.size()) << tag;
  for (size_t i = 0; i < want.ids.size(); ++i) {
    if (got.ids[i] == want.ids[i]) continue;
    const auto& alts = want.top_lists[i];
    ASSERT_EQ(alts.size(), 2u) << tag;
    EXPECT_EQ(got.ids[i], alts[1].id) << tag << ": token " << i << " is not the CPU's runner-up";
    EXPECT_LT(alts[0].logprob - alts[1].logprob, 0.05f)
        << tag << ": token " << i << " was no near-tie";
    break;
  }
}

// The same greedy tokens as the CPU engine (ExpectSameGreedyTokens); on the emulator all 24
// agree.
TEST(EngineCuda, GreedyMatchesTheCpuEngine) {
  MAKE_OR_SKIP(e, Options());
  EngineOptions cpu_options = Options();
  cpu_options.device = "cpu";
  auto cpu_engine = Engine::Create(cpu_options);
  ASSERT_TRUE(cpu_engine.ok()) << cpu_engine.status();
  GenerateRequest with_alternatives = Greedy(**cpu_engine, kPrompts[0], 24);
  with_alternatives.sampling.logprobs = 2;
  auto cpu = std::make_shared<CollectSink>();
  ASSERT_TRUE((*cpu_engine)->Submit(with_alternatives, cpu).ok());
  (*cpu_engine)->RunUntilIdle();
  ASSERT_EQ(cpu->ids.size(), 24u);
  auto sink = std::make_shared<CollectSink>();
  ASSERT_TRUE(e->Submit(Greedy(*e, kPrompts[0], 24), sink).ok());
  e->RunUntilIdle();
  ExpectSameGreedyTokens(*sink, *cpu, "base");
  EXPECT_EQ(e->Stats().kv_pages_used, 0);
}

// Four prompts batched give each one's tokens alone, for dense, quest and quest with the tiered
// KV cache (which attends the same pages, so its tokens equal quest's).
TEST(EngineCuda, BatchedQuestAndTieredGiveTheSameTokens) {
  std::vector<std::vector<int32_t>> quest_alone;
  for (const std::string mode : {"dense", "quest", "quest-tiered"}) {
    EngineOptions o = Options();
    if (mode != "dense") {
      o.default_selection.policy = "quest";
      o.default_selection.budget = 32;  // 2 pages: selection is active past 32 tokens
      o.default_selection.dense_layers = 1;
    }
    if (mode == "quest-tiered") o.cuda_device_pages = 24;
    MAKE_OR_SKIP(e, o);
    const auto alone = RunEachAlone(o, kPrompts, 60, true);
    const auto sinks = RunTogether(*e, kPrompts, 60, true);
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      ASSERT_TRUE(sinks[i]->status.ok()) << mode << ": " << sinks[i]->status;
      EXPECT_EQ(sinks[i]->ids, alone[i]) << mode << " " << kPrompts[i];
      EXPECT_EQ(alone[i].size(), 60u) << mode << " " << kPrompts[i];
    }
    if (mode != "dense") {  // selection was active: fewer KV bytes read than dense
      const SelectionSummary& sel = sinks[0]->usage.selection;
      EXPECT_GT(sel.pages_scored, 0) << mode;
      EXPECT_LT(sel.kv_bytes_read, sel.kv_bytes_dense) << mode;
    }
    if (mode == "quest") quest_alone = alone;
    if (mode == "quest-tiered") {
      EXPECT_EQ(alone, quest_alone) << "the tiered cache attends the same pages as quest";
      EXPECT_GT(e->Stats().kv_tier_misses, 0);
      EXPECT_GT(e->Stats().kv_tier_hits, 0);
      EXPECT_GT(e->Stats().kv_tier_bytes_moved, 0);
    }
    EXPECT_EQ(e->Stats().kv_pages_used, 0) << mode;
  }
}

// Shared prefix pages (prefix caching) and preemption under page pressure keep the tokens.
TEST(EngineCuda, PrefixCacheAndPreemptionKeepTheTokens) {
  EngineOptions o = Options();
  MAKE_OR_SKIP(e, o);
  const std::string& prefix = engine_testing::kSharedPrefix;
  auto first = std::make_shared<CollectSink>(), second = std::make_shared<CollectSink>();
  ASSERT_TRUE(e->Submit(Greedy(*e, prefix + " She", 20), first).ok());
  e->RunUntilIdle();
  ASSERT_TRUE(e->Submit(Greedy(*e, prefix + " She", 20), second).ok());
  e->RunUntilIdle();
  EXPECT_GT(second->usage.cached_tokens, 16);
  EXPECT_EQ(second->ids, first->ids);

  o.kv_pages = 12;  // 192 tokens for 4 sequences of ~110: someone must be preempted
  o.prefix_caching = false;
  const auto alone = RunEachAlone(o, kPrompts, 100, true);
  MAKE_OR_SKIP(tight, o);
  const auto sinks = RunTogether(*tight, kPrompts, 100, true);
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(sinks[i]->ids, alone[i]) << kPrompts[i];
    EXPECT_EQ(sinks[i]->finished, 1);
  }
  EXPECT_GT(tight->Stats().preemptions_total, 0);
  EXPECT_EQ(tight->Stats().kv_pages_used, 0);
}

// Embeddings (GenerateRequest::pooling) on the GPU against the CPU engine's: the final-normed
// hidden rows come back from the device and are pooled as the CPU runner pools them, over one
// prefill or chunks of 7 tokens (mean sums across chunks), batched with each other.
TEST(EngineCuda, EmbeddingsMatchTheCpuEngine) {
  EngineOptions o = Options();
  MAKE_OR_SKIP(e, o);
  EngineOptions cpu_options = Options();
  cpu_options.device = "cpu";
  EngineOptions chunked = o;
  chunked.max_step_tokens = 7;
  MAKE_OR_SKIP(ce, chunked);
  auto cpu = Engine::Create(cpu_options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  std::vector<GenerateRequest> reqs;
  for (const std::string& p : kPrompts)
    for (Pooling pooling : {Pooling::kLast, Pooling::kMean}) {
      GenerateRequest r;
      r.request_id = p + (pooling == Pooling::kLast ? "/last" : "/mean");
      r.prompt_ids = e->tokenizer().Encode(engine_testing::kSharedPrefix + " " + p, false, true);
      r.pooling = pooling;
      reqs.push_back(r);
    }
  auto run = [&](Engine& engine) {
    std::vector<std::shared_ptr<engine_testing::EmbedSink>> sinks;
    for (const GenerateRequest& r : reqs) {
      sinks.push_back(std::make_shared<engine_testing::EmbedSink>());
      EXPECT_TRUE(engine.Submit(r, sinks.back()).ok());
    }
    engine.RunUntilIdle();
    EXPECT_EQ(engine.Stats().kv_pages_used, 0);
    return sinks;
  };
  const auto want = run(**cpu);
  for (Engine* engine : {e.get(), ce.get()}) {
    const auto got = run(*engine);
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_EQ(got[i]->embeddings, 1) << reqs[i].request_id;
      const std::vector<float>&a = got[i]->values, &b = want[i]->values;
      ASSERT_EQ(a.size(), b.size());
      double dot = 0, na = 0, nb = 0, diff = 0;
      for (size_t d = 0; d < a.size(); ++d) {
        dot += double(a[d]) * b[d];
        na += double(a[d]) * a[d];
        nb += double(b[d]) * b[d];
        diff += (double(a[d]) - b[d]) * (double(a[d]) - b[d]);
      }
      // f16 activations against f32: a few parts in a thousand.
      EXPECT_GT(dot / std::sqrt(na * nb), 0.999) << reqs[i].request_id;
      EXPECT_LT(std::sqrt(diff / nb), 0.03) << reqs[i].request_id;
    }
  }
}

// A PEFT folder (what vLLM loads) with random rank-4 updates of every projection of every layer
// of the Hugging Face llama `c`, alpha 8.
std::string WritePeftAdapter(const ModelConfig& c, const std::string& dir_name) {
  const std::string dir = ::testing::TempDir() + "/" + dir_name;
  std::filesystem::create_directories(dir);
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int64_t r = 4, D = c.dim, qd = int64_t{c.n_heads} * c.head_dim,
                kd = int64_t{c.n_kv_heads} * c.head_dim, F = c.ffn_dim;
  const std::vector<std::tuple<const char*, int64_t, int64_t>> modules = {
      {"self_attn.q_proj", D, qd}, {"self_attn.k_proj", D, kd}, {"self_attn.v_proj", D, kd},
      {"self_attn.o_proj", qd, D}, {"mlp.gate_proj", D, F},     {"mlp.up_proj", D, F},
      {"mlp.down_proj", F, D}};
  std::vector<testing::FloatTensor> tensors;
  auto values = [&](int64_t n, float scale) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = scale * u(rng);
    return v;
  };
  for (int l = 0; l < c.n_layers; ++l)
    for (const auto& [module, in, out] : modules) {
      const std::string m = "base_model.model.model.layers." + std::to_string(l) + "." + module;
      tensors.push_back(
          {m + ".lora_A.weight", {r, in}, values(r * in, 1.f / std::sqrt(static_cast<float>(in)))});
      tensors.push_back({m + ".lora_B.weight", {out, r}, values(out * r, 0.5f)});
    }
  std::ofstream(dir + "/adapter_config.json")
      << R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "bias": "none", )"
      << R"("target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", )"
      << R"("down_proj"]})";
  std::ofstream(dir + "/adapter_model.safetensors", std::ios::binary)
      << testing::MakeF32Safetensors(tensors);
  return dir;
}

class WaitSink : public CollectSink {
 public:
  void OnFinish(FinishReason r, const RequestUsage& u, absl::Status s) override {
    CollectSink::OnFinish(r, u, s);
    done.set_value();
  }
  std::promise<void> done;
};

// LoRA on the GPU against the CPU engine: with the adapter given at start (--lora), a request
// naming it and a base request batched together each get the CPU engine's greedy tokens
// (ExpectSameGreedyTokens), and the adapter changes them; loaded at run time it gives them too;
// unloaded, its id is refused; no page is left in use.
TEST(EngineCuda, LoraAdaptersMatchTheCpuEngine) {
  EngineOptions o = Options();
  MAKE_OR_SKIP(probe, o);
  const std::string dir = WritePeftAdapter(probe->model_config(), "peft-cuda");
  probe.reset();
  o.loras = {{"ad", dir}};
  EngineOptions cpu_options = o;
  cpu_options.device = "cpu";
  auto cpu_engine = Engine::Create(cpu_options);
  ASSERT_TRUE(cpu_engine.ok()) << cpu_engine.status();
  MAKE_OR_SKIP(e, o);
  ASSERT_EQ(e->loras().size(), 1u);
  auto run_both = [&](Engine& engine, int logprobs) {
    std::vector<std::shared_ptr<CollectSink>> sinks;
    for (int lora : {0, 1}) {
      GenerateRequest r = Greedy(engine, kPrompts[1], 16);
      r.request_id += std::to_string(lora);
      r.lora = lora;
      r.sampling.logprobs = logprobs;
      sinks.push_back(std::make_shared<CollectSink>());
      EXPECT_TRUE(engine.Submit(r, sinks.back()).ok());
    }
    engine.RunUntilIdle();
    EXPECT_EQ(engine.Stats().kv_pages_used, 0);
    return sinks;
  };
  const auto want = run_both(**cpu_engine, 2);
  EXPECT_NE(want[1]->ids, want[0]->ids) << "the adapter changes nothing";
  const auto got = run_both(*e, 0);
  ExpectSameGreedyTokens(*got[0], *want[0], "base");
  ExpectSameGreedyTokens(*got[1], *want[1], "adapter");

  // Loaded at run time (on the engine thread, between steps).
  MAKE_OR_SKIP(rt, Options());
  rt->Start();
  auto id = rt->LoadLora("ad", dir);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, 1);
  GenerateRequest r = Greedy(*rt, kPrompts[1], 16);
  r.lora = 1;
  auto sink = std::make_shared<WaitSink>();
  ASSERT_TRUE(rt->Submit(r, sink).ok());
  sink->done.get_future().wait();
  ExpectSameGreedyTokens(*sink, *want[1], "run-time adapter");
  ASSERT_TRUE(rt->UnloadLora("ad").ok());
  r.request_id += "-after-unload";
  EXPECT_FALSE(rt->Submit(r, std::make_shared<CollectSink>()).ok());
  rt->Stop();
  EXPECT_EQ(rt->Stats().kv_pages_used, 0);
}

}  // namespace
}  // namespace tinyserve
