// The engine's GPU runner (CudaRunner, --device cuda) against the CPU runner (TransformerRunner)
// on the same random Llama (head_dim 64, GQA group 3 as SmolLM2; weights rounded to f16 so both
// see the same values), through the same SeqInput batches the engine builds: a mixed prefill
// step, then batched decode steps with CUDA graphs; Quest with a budget covering the context
// equals dense; Quest with a small budget attends fewer pages and reports them per sequence;
// the tiered KV cache gives the same logits as the all-device cache. Both RoPE styles (GGUF's
// adjacent pairs and Hugging Face's rotate-half), Qwen2's shape (Q/K/V biases; RoPE with
// Llama 3 factors and a linear scale) and Qwen3's (per-head Q/K norms). Skips without a GPU.
#include "worker/runner/cuda_runner.h"

#include <cmath>
#include <map>
#include <random>
#include <utility>

#include "gtest/gtest.h"
#include "common/fp16.h"
#include "worker/model/weight_source.h"

namespace tinyserve {
namespace {

// An in-memory F32 Llama checkpoint with GGUF tensor names.
class RandomLlama : public WeightSource {
 public:
  RandomLlama(RopeStyle rope, uint32_t seed) {
    c_.arch = Arch::kLlama;
    c_.name = "random-llama-d64";
    c_.n_layers = 2;
    c_.dim = 192;
    c_.n_heads = 6;
    c_.n_kv_heads = 2;
    c_.head_dim = 64;
    c_.ffn_dim = 256;
    c_.vocab_size = 300;
    c_.max_context = 512;
    c_.rope_style = rope;
    c_.rope_theta = 10000.f;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    auto add = [&](const std::string& name, int64_t rows, int64_t cols, float scale, float mean) {
      std::vector<float>& v = data_[name];
      v.resize(static_cast<size_t>(rows * cols));
      for (float& x : v) x = Fp16ToFloat(FloatToFp16(mean + scale * u(rng)));  // f16-exact
      shapes_[name] = rows == 1 ? std::vector<int64_t>{cols} : std::vector<int64_t>{cols, rows};
    };
    const int64_t D = c_.dim, q = c_.n_heads * c_.head_dim, k = c_.n_kv_heads * c_.head_dim,
                  F = c_.ffn_dim;
    add("token_embd.weight", c_.vocab_size, D, 1.f, 0.f);
    add("output_norm.weight", 1, D, 0.1f, 1.f);
    add("output.weight", c_.vocab_size, D, 1.7f / std::sqrt(float(D)), 0.f);
    for (int l = 0; l < c_.n_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      add(b + "attn_norm.weight", 1, D, 0.1f, 1.f);
      add(b + "attn_q.weight", q, D, 1.7f / std::sqrt(float(D)), 0.f);
      add(b + "attn_k.weight", k, D, 1.7f / std::sqrt(float(D)), 0.f);
      add(b + "attn_v.weight", k, D, 1.7f / std::sqrt(float(D)), 0.f);
      add(b + "attn_output.weight", D, q, 1.7f / std::sqrt(float(q)), 0.f);
      add(b + "ffn_norm.weight", 1, D, 0.1f, 1.f);
      add(b + "ffn_gate.weight", F, D, 1.7f / std::sqrt(float(D)), 0.f);
      add(b + "ffn_up.weight", F, D, 1.7f / std::sqrt(float(D)), 0.f);
      add(b + "ffn_down.weight", D, F, 1.7f / std::sqrt(float(F)), 0.f);
    }
  }
  const ModelConfig& config() const override { return c_; }
  void AddZeros(const std::string& name, int64_t n) {
    data_[name].assign(static_cast<size_t>(n), 0.f);
    shapes_[name] = {n};
  }
  // Qwen2's shape of the model: Q/K/V biases, and RoPE with Llama 3 factors and a linear scale.
  void MakeQwenLike(uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f), f(1.f, 4.f);
    for (int l = 0; l < c_.n_layers; ++l)
      for (const auto& [name, n] : {std::pair{"attn_q.bias", c_.n_heads * c_.head_dim},
                                    std::pair{"attn_k.bias", c_.n_kv_heads * c_.head_dim},
                                    std::pair{"attn_v.bias", c_.n_kv_heads * c_.head_dim}}) {
        const std::string key = "blk." + std::to_string(l) + "." + name;
        std::vector<float>& v = data_[key];
        v.resize(n);
        for (float& x : v) x = Fp16ToFloat(FloatToFp16(0.5f * u(rng)));
        shapes_[key] = {n};
      }
    c_.rope_freq_factors.resize(c_.head_dim / 2);
    for (float& x : c_.rope_freq_factors) x = f(rng);
    c_.rope_freq_scale = 0.5f;
    c_.rope_attn_factor = 1.1f;  // YaRN's cos/sin scale
  }
  // Qwen3's shape: no biases, per-head Q/K RMSNorms before RoPE, theta 1e6, eps 1e-6.
  void MakeQwen3Like(uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    c_.variant = "qwen3";
    c_.qk_norm = true;
    c_.rope_theta = 1000000.f;
    c_.norm_eps = 1e-6f;
    for (int l = 0; l < c_.n_layers; ++l)
      for (const char* name : {"attn_q_norm.weight", "attn_k_norm.weight"}) {
        const std::string key = "blk." + std::to_string(l) + "." + name;
        std::vector<float>& v = data_[key];
        v.resize(c_.head_dim);
        for (float& x : v) x = Fp16ToFloat(FloatToFp16(u(rng)));
        shapes_[key] = {c_.head_dim};
      }
  }
  const TokenizerData& tokenizer_data() const override { return tok_; }
  absl::StatusOr<TensorRef> Get(const std::string& name) const override {
    auto it = data_.find(name);
    if (it == data_.end()) return absl::NotFoundError(name);
    TensorRef t;
    t.name = name;
    t.type = GgmlType::kF32;
    t.ne = shapes_.at(name);
    t.data = reinterpret_cast<const uint8_t*>(it->second.data());
    t.nbytes = it->second.size() * sizeof(float);
    return t;
  }
  bool Has(const std::string& name) const override { return data_.count(name) > 0; }
  std::string Describe() const override { return "random llama (memory)"; }

 private:
  ModelConfig c_;
  TokenizerData tok_;
  std::map<std::string, std::vector<float>> data_;
  std::map<std::string, std::vector<int64_t>> shapes_;
};

constexpr int kPage = 16;
constexpr int kPages = 64;

struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> pages;
  int64_t done = 0;
};

SeqInput Input(Seq& s, int n) {
  SeqInput in;
  in.tokens = s.tokens.data() + s.done;
  in.n = n;
  in.start_pos = s.done;
  in.pages = &s.pages;
  return in;
}

// The two sequences both runs drive: 200 random tokens each, on disjoint pages.
std::pair<Seq, Seq> TwoSequences() {
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> tok(0, 299);
  Seq a, b;
  for (int i = 0; i < 200; ++i) a.tokens.push_back(tok(rng)), b.tokens.push_back(tok(rng));
  for (int p = 0; p < 13; ++p) a.pages.push_back(2 * p + 1), b.pages.push_back(2 * p + 30);
  return {a, b};
}

// Two sequences: a mixed step (A prefills 100, B prefills 40), then `steps` batched decode
// steps. Returns the logits of every Forward. spec: the decode selection (null: dense).
std::vector<std::vector<float>> RunCuda(CudaRunner& r, const SelectionSpec* spec, int steps,
                                        std::vector<StepStats>* stats = nullptr) {
  auto [a, b] = TwoSequences();
  std::vector<std::vector<float>> out;
  std::vector<float> logits;
  EXPECT_TRUE(r.Forward({Input(a, 100), Input(b, 40)}, {nullptr, nullptr}, &logits).ok());
  out.push_back(logits);
  a.done = 100;
  b.done = 40;
  for (int s = 0; s < steps; ++s) {
    EXPECT_TRUE(r.Forward({Input(b, 1), Input(a, 1)}, {spec, spec}, &logits).ok());
    out.push_back(logits);
    if (stats) {
      StepStats st;
      EXPECT_TRUE(r.StepStatsOf(1, &st));  // row 1 is `a`, long enough to select
      stats->push_back(st);
    }
    a.done++;
    b.done++;
  }
  return out;
}

std::vector<std::vector<float>> RunCpu(TransformerRunner& r, int steps) {
  auto [a, b] = TwoSequences();
  PagedKvCache kv(r.MakeKvConfig(kPage, kPages));
  for (int p = 0; p < kPages; ++p) kv.ResetPage(p);
  std::vector<std::vector<float>> out;
  std::vector<float> logits;
  EXPECT_TRUE(r.Forward({Input(a, 100), Input(b, 40)}, &kv, &logits).ok());
  out.push_back(logits);
  a.done = 100;
  b.done = 40;
  for (int s = 0; s < steps; ++s) {
    EXPECT_TRUE(r.Forward({Input(b, 1), Input(a, 1)}, &kv, &logits).ok());
    out.push_back(logits);
    a.done++;
    b.done++;
  }
  return out;
}

// Creates the runner, or null when there is no GPU (the caller skips).
std::unique_ptr<CudaRunner> MakeCuda(const WeightSource& src, int device_pages = 0,
                                     bool graphs = true) {
  CudaRunnerOptions o;
  o.page_size = kPage;
  o.num_pages = kPages;
  o.max_batch = 4;
  o.max_tokens = 160;
  o.device_pages = device_pages;
  o.resident_layers = 1;
  o.cuda_graphs = graphs;
  auto r = CudaRunner::Create(src, o);
  if (!r.ok()) {
    const bool no_gpu = r.status().message().find("no CUDA device") != std::string::npos ||
                        r.status().message().find("no CUDA runner") != std::string::npos;
    EXPECT_TRUE(no_gpu) << r.status();
    return nullptr;
  }
  return std::move(*r);
}

double MaxRelDiff(const std::vector<float>& got, const std::vector<float>& ref) {
  double worst = 0, scale = 1e-6;
  for (float v : ref) scale = std::max(scale, double(std::fabs(v)));
  for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - ref[i]));
  return worst / scale;
}

int Argmax(const std::vector<float>& v, size_t row, int vocab) {
  return static_cast<int>(std::max_element(v.begin() + row * vocab, v.begin() + (row + 1) * vocab) -
                          (v.begin() + row * vocab));
}

TEST(CudaRunner, MatchesTheCpuRunnerOnMixedAndDecodeSteps) {
  // adjacent, rotate-half, Qwen2-like, Qwen3-like
  for (int variant = 0; variant < 4; ++variant) {
    RandomLlama src(variant == 0 ? RopeStyle::kAdjacent : RopeStyle::kRotateHalf, 5);
    if (variant == 2) src.MakeQwenLike(6);
    if (variant == 3) src.MakeQwen3Like(8);
    auto cuda = MakeCuda(src);
    if (!cuda) GTEST_SKIP() << "no CUDA device";
    auto cpu = TransformerRunner::Create(src, RunnerOptions());
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    const auto got = RunCuda(*cuda, nullptr, 6);
    const auto ref = RunCpu(**cpu, 6);
    ASSERT_EQ(got.size(), ref.size());
    int agree = 0, rows = 0;
    for (size_t f = 0; f < ref.size(); ++f) {
      ASSERT_EQ(got[f].size(), ref[f].size());
      // f16 activations against fp32: within 3 % of the largest logit.
      EXPECT_LT(MaxRelDiff(got[f], ref[f]), 0.03) << "variant " << variant << " forward " << f;
      for (size_t r = 0; r < ref[f].size() / 300; ++r, ++rows)
        agree += Argmax(got[f], r, 300) == Argmax(ref[f], r, 300);
    }
    EXPECT_GE(agree, rows - 1) << "variant " << variant << ": argmax agreement " << agree << "/"
                               << rows;
    EXPECT_GT(cuda->totals().graph_steps, 0);  // decode steps replayed as graphs
  }
}

// What the GPU path does not run is refused by name before any device work (no GPU needed).
TEST(CudaRunner, RefusesAnOutputProjectionBias) {
  auto refused = [](const WeightSource& src, const std::string& what) {
    CudaRunnerOptions o;
    o.page_size = kPage;
    o.num_pages = kPages;
    absl::StatusOr<std::unique_ptr<CudaRunner>> r = CudaRunner::Create(src, o);
    ASSERT_FALSE(r.ok());
    if (r.status().message().find("no CUDA runner") != std::string::npos) return;  // CPU build
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status();
  };
  RandomLlama src(RopeStyle::kRotateHalf, 1);
  src.AddZeros("blk.0.attn_output.bias", 192);
  refused(src, "blk.0.attn_output.bias");
}

TEST(CudaRunner, QuestTieredAndEagerAgree) {
  RandomLlama src(RopeStyle::kAdjacent, 7);
  auto cuda = MakeCuda(src);
  if (!cuda) GTEST_SKIP() << "no CUDA device";
  SelectionSpec wide;
  wide.policy = "quest";
  wide.budget = 512;  // covers the context: every page
  wide.dense_layers = 0;
  const auto dense = RunCuda(*cuda, nullptr, 5);
  auto cuda2 = MakeCuda(src);
  const auto quest_wide = RunCuda(*cuda2, &wide, 5);
  for (size_t f = 0; f < dense.size(); ++f)
    EXPECT_LT(MaxRelDiff(quest_wide[f], dense[f]), 1e-3) << "forward " << f;

  SelectionSpec narrow = wide;
  narrow.budget = 4 * kPage;  // 4 of 7-8 pages
  narrow.dense_layers = 1;
  std::vector<StepStats> st_narrow, st_tiered;
  auto eager = MakeCuda(src, 0, /*graphs=*/false);
  auto tiered = MakeCuda(src, /*device_pages=*/12);
  const auto q_eager = RunCuda(*eager, &narrow, 5, &st_narrow);
  const auto q_tiered = RunCuda(*tiered, &narrow, 5, &st_tiered);
  for (size_t f = 0; f < q_eager.size(); ++f) EXPECT_EQ(q_eager[f], q_tiered[f]) << "forward " << f;
  ASSERT_FALSE(st_narrow.empty());
  const StepStats& s = st_narrow.back();
  EXPECT_LT(s.pages_selected, s.pages_total);  // layer 1 attends 4 pages per KV head
  EXPECT_GT(s.pages_scored, 0);
  EXPECT_LT(s.kv_bytes_read, s.kv_bytes_dense);
  ASSERT_EQ(st_tiered.size(), st_narrow.size());  // the tiered cache selects the same pages
  EXPECT_EQ(st_tiered.back().pages_selected, s.pages_selected);
  EXPECT_EQ(st_tiered.back().pages_scored, s.pages_scored);
  EXPECT_GT(tiered->totals().tier_misses, 0);
  EXPECT_GT(tiered->totals().tier_hits, 0);
  EXPECT_GT(tiered->totals().bytes_moved, 0);
}

}  // namespace
}  // namespace tinyserve
