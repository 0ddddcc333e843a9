// The whole-model forward on the GPU (device_model.h) against a plain C++ reference forward of
// the same random Llama (weights rounded to f16 as uploaded; activations rounded to f16 where
// the device stores them): prefill chunks, batched decode, mixed steps, CUDA-graph replay
// (bit-identical to eager), Quest, and the tiered KV cache (bit-identical to the all-device
// cache, with hits, misses and bytes moved counted). Skips without a GPU.
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>

#include "kernels/cuda/decode_attention.cuh"
#include "kernels/cuda/device_model.h"
#include "kernels/cuda/reference/ops_ref.h"
#include "kernels/cuda/test_util.cuh"

namespace tinyserve::cuda {
namespace {

using testing::CudaTest;
using testing::RoundTo;

struct Weights {
  std::vector<float> embed, out_norm, lm_head;
  struct Layer {
    std::vector<float> attn_norm, wq, wk, wv, wo, ffn_norm, wgate, wup, wdown;
  };
  std::vector<Layer> layers;
};

DeviceModelConfig SmallConfig() {
  DeviceModelConfig c;
  c.n_layers = 3;
  c.dim = 128;
  c.n_heads = 6;
  c.n_kv_heads = 2;  // group 3, as SmolLM2
  c.head_dim = 64;
  c.ffn_dim = 256;
  c.vocab = 512;
  c.norm_eps = 1e-5f;
  c.rope_theta = 10000.f;
  c.page_size = 16;
  c.num_pages = 64;
  c.max_batch = 4;
  c.max_tokens = 288;  // RunSchedule prefills 150 + 120 tokens in one step
  c.max_pages_per_seq = 16;
  c.resident_layers = 1;
  return c;
}

Weights MakeWeights(const DeviceModelConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  auto mat = [&](int rows, int cols) {
    return testing::RandomRounded(rng, DType::kF16, size_t(rows) * cols, -1.f, 1.f);
  };
  auto scaled = [&](int rows, int cols) {
    std::vector<float> m = mat(rows, cols);
    const float s = 1.7f / std::sqrt(float(cols));
    for (float& v : m) v = RoundTo(DType::kF16, v * s);
    return m;
  };
  auto norm = [&](int n) {
    std::vector<float> v = testing::RandomRounded(rng, DType::kF16, n, 0.8f, 1.2f);
    return v;
  };
  const int qd = c.n_heads * c.head_dim, kd = c.n_kv_heads * c.head_dim;
  Weights w;
  w.embed = mat(c.vocab, c.dim);
  w.out_norm = norm(c.dim);
  w.lm_head = scaled(c.vocab, c.dim);
  w.layers.resize(c.n_layers);
  for (auto& L : w.layers) {
    L.attn_norm = norm(c.dim);
    L.wq = scaled(qd, c.dim);
    L.wk = scaled(kd, c.dim);
    L.wv = scaled(kd, c.dim);
    L.wo = scaled(c.dim, qd);
    L.ffn_norm = norm(c.dim);
    L.wgate = scaled(c.ffn_dim, c.dim);
    L.wup = scaled(c.ffn_dim, c.dim);
    L.wdown = scaled(c.dim, c.ffn_dim);
  }
  return w;
}

std::unique_ptr<DeviceModel> Upload(const DeviceModelConfig& c, const Weights& w) {
  std::string err;
  auto m = DeviceModel::Create(c, &err);
  EXPECT_NE(m, nullptr) << err;
  if (!m) return nullptr;
  auto set = [&](WeightSlot s, int l, const std::vector<float>& v) {
    EXPECT_TRUE(m->SetWeight(s, l, v.data(), int64_t(v.size()), &err)) << err;
  };
  set(WeightSlot::kEmbedding, 0, w.embed);
  set(WeightSlot::kOutputNorm, 0, w.out_norm);
  set(WeightSlot::kLmHead, 0, w.lm_head);
  for (int l = 0; l < c.n_layers; ++l) {
    const auto& L = w.layers[l];
    set(WeightSlot::kAttnNorm, l, L.attn_norm);
    set(WeightSlot::kWq, l, L.wq);
    set(WeightSlot::kWk, l, L.wk);
    set(WeightSlot::kWv, l, L.wv);
    set(WeightSlot::kWo, l, L.wo);
    set(WeightSlot::kFfnNorm, l, L.ffn_norm);
    set(WeightSlot::kWgate, l, L.wgate);
    set(WeightSlot::kWup, l, L.wup);
    set(WeightSlot::kWdown, l, L.wdown);
  }
  return m;
}

// Reference: one sequence, token by token, dense causal attention, f16 rounding where the
// device stores f16.
class RefModel {
 public:
  RefModel(const DeviceModelConfig& c, const Weights& w) : c_(c), w_(w) {
    k_.resize(c.n_layers);
    v_.resize(c.n_layers);
  }
  std::vector<float> Step(int32_t token) {
    const int D = c_.dim, hd = c_.head_dim, H = c_.n_heads, Hk = c_.n_kv_heads;
    const int qd = H * hd, kd = Hk * hd, F = c_.ffn_dim, pos = n_;
    auto r16 = [](std::vector<float>& v) {
      for (float& x : v) x = RoundTo(DType::kF16, x);
    };
    std::vector<float> x(w_.embed.begin() + size_t(token) * D, w_.embed.begin() + size_t(token + 1) * D);
    std::vector<float> h(D), q(qd), k(kd), v(kd), att(qd), t(D), g(F), u(F);
    for (int l = 0; l < c_.n_layers; ++l) {
      const auto& L = w_.layers[l];
      ref::RmsNorm(x.data(), L.attn_norm.data(), h.data(), nullptr, 1, D, c_.norm_eps);
      r16(h);
      ref::Linear(h.data(), L.wq.data(), q.data(), 1, qd, D);
      ref::Linear(h.data(), L.wk.data(), k.data(), 1, kd, D);
      ref::Linear(h.data(), L.wv.data(), v.data(), 1, kd, D);
      r16(q), r16(k), r16(v);
      for (int i = 0; i < H; ++i) ref::RopeRow(&q[i * hd], hd, pos, c_.rope_theta, c_.rope_adjacent);
      for (int i = 0; i < Hk; ++i) ref::RopeRow(&k[i * hd], hd, pos, c_.rope_theta, c_.rope_adjacent);
      r16(q), r16(k);
      k_[l].insert(k_[l].end(), k.begin(), k.end());
      v_[l].insert(v_[l].end(), v.begin(), v.end());
      const int n = pos + 1, group = H / Hk;
      for (int i = 0; i < H; ++i) {
        const int kh = i / group;
        std::vector<double> s(n);
        double mx = -1e300;
        for (int j = 0; j < n; ++j) {
          double d = 0;
          for (int e = 0; e < hd; ++e) d += double(q[i * hd + e]) * k_[l][size_t(j) * kd + kh * hd + e];
          s[j] = d / std::sqrt(double(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (double& z : s) sum += (z = std::exp(z - mx));
        for (int e = 0; e < hd; ++e) {
          double o = 0;
          for (int j = 0; j < n; ++j) o += s[j] * v_[l][size_t(j) * kd + kh * hd + e];
          att[i * hd + e] = float(o / sum);
        }
      }
      r16(att);
      ref::Linear(att.data(), L.wo.data(), t.data(), 1, D, qd);
      r16(t);
      ref::RmsNorm(t.data(), L.ffn_norm.data(), h.data(), x.data(), 1, D, c_.norm_eps);
      r16(x), r16(h);
      ref::Linear(h.data(), L.wgate.data(), g.data(), 1, F, D);
      ref::Linear(h.data(), L.wup.data(), u.data(), 1, F, D);
      r16(g), r16(u);
      for (int i = 0; i < F; ++i) g[i] = RoundTo(DType::kF16, ref::Silu(g[i]) * u[i]);
      ref::Linear(g.data(), L.wdown.data(), t.data(), 1, D, F);
      r16(t);
      if (l + 1 < c_.n_layers) {
        // The device adds this residual inside the next layer's first norm.
        for (int i = 0; i < D; ++i) x[i] = RoundTo(DType::kF16, x[i] + t[i]);
        std::fill(t.begin(), t.end(), 0.f);
      }
    }
    ref::RmsNorm(t.data(), w_.out_norm.data(), h.data(), x.data(), 1, D, c_.norm_eps);
    r16(h);
    std::vector<float> logits(c_.vocab);
    ref::Linear(h.data(), w_.lm_head.data(), logits.data(), 1, c_.vocab, D);
    ++n_;
    return logits;
  }

 private:
  const DeviceModelConfig c_;
  const Weights& w_;
  std::vector<std::vector<float>> k_, v_;
  int n_ = 0;
};

// A sequence driven through DeviceModel::Forward with its own pages.
struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> pages;
  int64_t done = 0;
};

DeviceSeq Input(Seq& s, int n, bool all_logits, DeviceAttention att = {}) {
  DeviceSeq d;
  d.tokens = s.tokens.data() + s.done;
  d.n = n;
  d.start_pos = s.done;
  d.pages = s.pages.data();
  d.n_pages = static_cast<int>(s.pages.size());
  d.all_logits = all_logits;
  d.attention = att;
  return d;
}

std::vector<int32_t> RandomTokens(std::mt19937& rng, int n, int vocab) {
  std::uniform_int_distribution<int> u(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = u(rng);
  return t;
}

constexpr float kTol = 3e-2f;  // f16 activations against the f16-rounded reference

class DeviceModelTest : public CudaTest {};

TEST_F(DeviceModelTest, PrefillDecodeAndMixedStepsMatchTheReference) {
  for (bool adjacent : {false, true}) {
    DeviceModelConfig c = SmallConfig();
    c.rope_adjacent = adjacent;
    const Weights w = MakeWeights(c, 7);
    auto m = Upload(c, w);
    ASSERT_NE(m, nullptr);
    std::mt19937 rng(3);
    Seq a{RandomTokens(rng, 60, c.vocab), {3, 9, 1, 20, 7}, 0};
    Seq b{RandomTokens(rng, 60, c.vocab), {11, 2, 30, 4, 5}, 0};
    RefModel ra(c, w), rb(c, w);
    std::string err;
    std::vector<float> logits;
    // a: prefill 37 (all logits); b: nothing yet.
    ASSERT_TRUE(m->Forward({Input(a, 37, true)}, &logits, &err)) << err;
    ASSERT_EQ(logits.size(), size_t(37) * c.vocab);
    for (int i = 0; i < 37; ++i) {
      std::vector<float> got(logits.begin() + size_t(i) * c.vocab, logits.begin() + size_t(i + 1) * c.vocab);
      EXPECT_TRUE(testing::AllClose("prefill row " + std::to_string(i), got, ra.Step(a.tokens[i]), kTol, kTol));
    }
    a.done = 37;
    // Mixed: a decodes one token while b prefills 20 (last logits only).
    ASSERT_TRUE(m->Forward({Input(a, 1, false), Input(b, 20, false)}, &logits, &err)) << err;
    ASSERT_EQ(logits.size(), size_t(2) * c.vocab);
    std::vector<float> ref_b;
    for (int i = 0; i < 20; ++i) ref_b = rb.Step(b.tokens[i]);
    EXPECT_TRUE(testing::AllClose("mixed a", std::vector<float>(logits.begin(), logits.begin() + c.vocab), ra.Step(a.tokens[37]), kTol, kTol));
    EXPECT_TRUE(testing::AllClose("mixed b", std::vector<float>(logits.begin() + c.vocab, logits.end()), ref_b, kTol, kTol));
    a.done = 38;
    b.done = 20;
    // Batched decode: 6 steps (graph captured on the second, replayed after).
    for (int step = 0; step < 6; ++step) {
      ASSERT_TRUE(m->Forward({Input(b, 1, false), Input(a, 1, false)}, &logits, &err)) << err;
      EXPECT_EQ(m->last_stats().graph_replayed, step >= 1) << "step " << step;
      const std::string tag = (adjacent ? "adjacent" : "rotate-half") + std::string(" step ") + std::to_string(step);
      EXPECT_TRUE(testing::AllClose(tag + " b", std::vector<float>(logits.begin(), logits.begin() + c.vocab), rb.Step(b.tokens[b.done]), kTol, kTol));
      EXPECT_TRUE(testing::AllClose(tag + " a", std::vector<float>(logits.begin() + c.vocab, logits.end()), ra.Step(a.tokens[a.done]), kTol, kTol));
      a.done++;
      b.done++;
    }
  }
}

// Runs the same schedule on several configurations and returns every logits vector.
std::vector<std::vector<float>> RunSchedule(const DeviceModelConfig& c, const Weights& w,
                                            DeviceAttention att, std::vector<DeviceStepStats>* stats) {
  auto m = Upload(c, w);
  std::vector<std::vector<float>> out;
  if (!m) return out;
  std::mt19937 rng(5);
  Seq a{RandomTokens(rng, 200, c.vocab), {}, 0}, b{RandomTokens(rng, 200, c.vocab), {}, 0};
  for (int i = 0; i < 13; ++i) {
    a.pages.push_back(2 * i + 1);
    b.pages.push_back(2 * i + 30);
  }
  std::string err;
  std::vector<float> logits;
  EXPECT_TRUE(m->Forward({Input(a, 150, false), Input(b, 120, false)}, &logits, &err)) << err;
  out.push_back(logits);
  a.done = 150;
  b.done = 120;
  for (int step = 0; step < 8; ++step) {
    EXPECT_TRUE(m->Forward({Input(a, 1, false, att), Input(b, 1, false, att)}, &logits, &err)) << err;
    out.push_back(logits);
    if (stats) stats->push_back(m->last_stats());
    a.done++;
    b.done++;
  }
  return out;
}

TEST_F(DeviceModelTest, GraphsAndTieredCacheAreBitIdenticalToEager) {
  const DeviceModelConfig base = SmallConfig();
  const Weights w = MakeWeights(base, 11);
  DeviceAttention quest;
  quest.quest = true;
  quest.budget_pages = 4;  // of 10 pages: selection applies
  quest.sink_pages = 1;
  quest.dense_layers = 1;
  for (DeviceAttention att : {DeviceAttention{}, quest}) {
    const char* name = att.quest ? "quest" : "dense";
    DeviceModelConfig eager = base;
    eager.cuda_graphs = false;
    std::vector<DeviceStepStats> st_graph, st_tier, st_small;
    const auto ref = RunSchedule(eager, w, att, nullptr);
    const auto graphed = RunSchedule(base, w, att, &st_graph);
    DeviceModelConfig tiered = base;
    tiered.device_pages = 24;  // two sequences of <= 10 pages fit
    const auto tier = RunSchedule(tiered, w, att, &st_tier);
    DeviceModelConfig small = base;
    small.device_pages = 6;  // too small for dense steps: attention reads home memory
    const auto direct = RunSchedule(small, w, att, &st_small);
    ASSERT_EQ(ref.size(), graphed.size());
    ASSERT_EQ(ref.size(), tier.size());
    ASSERT_EQ(ref.size(), direct.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_EQ(ref[i], graphed[i]) << name << " graphs, forward " << i;
      EXPECT_EQ(ref[i], tier[i]) << name << " tiered, forward " << i;
      EXPECT_EQ(ref[i], direct[i]) << name << " tiered over capacity, forward " << i;
    }
    EXPECT_TRUE(st_graph.back().graph_replayed);
    int64_t hits = 0, misses = 0, moved = 0, direct_bytes = 0;
    for (const auto& s : st_tier) hits += s.tier_hits, misses += s.tier_misses, moved += s.bytes_moved;
    for (const auto& s : st_small) direct_bytes += s.bytes_direct;
    EXPECT_GT(misses, 0) << name;
    EXPECT_GT(hits, 0) << name;  // pages stay resident across steps
    EXPECT_GT(moved, 0) << name;
    if (!att.quest) {
      EXPECT_GT(direct_bytes, 0) << name;
    }
    if (att.quest) {
      // Layers >= 1 attend at most 4 pages per (sequence, KV head).
      EXPECT_LT(st_graph.back().pages_attended, st_graph.back().pages_total);
    } else {
      EXPECT_EQ(st_graph.back().pages_attended, st_graph.back().pages_total);
    }
  }
}

TEST_F(DeviceModelTest, QuestWithBudgetCoveringTheContextEqualsDense) {
  const DeviceModelConfig c = SmallConfig();
  const Weights w = MakeWeights(c, 13);
  DeviceAttention quest;
  quest.quest = true;
  quest.budget_pages = 16;  // >= every sequence's pages: every page, in order
  quest.dense_layers = 0;
  const AttendKernel used = [] {
    const char* e = std::getenv("TINYSERVE_CUDA_ATTEND");
    return e != nullptr && std::string(e) == "tensor" ? AttendKernel::kTensorCores
                                                      : AttendKernel::kCudaCores;
  }();
  const int64_t launches0 = AttendKernelLaunches(used);
  const auto dense = RunSchedule(c, w, DeviceAttention{}, nullptr);
  const auto q = RunSchedule(c, w, quest, nullptr);
  ASSERT_EQ(dense.size(), q.size());
  for (size_t i = 0; i < dense.size(); ++i)
    EXPECT_TRUE(testing::AllClose("forward " + std::to_string(i), q[i], dense[i], 1e-3f, 1e-3f));
  // The attend kernel TINYSERVE_CUDA_ATTEND chose is the one that ran.
  EXPECT_GT(AttendKernelLaunches(used), launches0) << AttendKernelName(used);
}

// The benchmarks' random cache fill: decoding after it depends on the seed and nothing else (not
// on how the fill is chunked), and bad pages are refused.
TEST_F(DeviceModelTest, FillKvRandomIsDeterministicAndChecked) {
  const DeviceModelConfig c = SmallConfig();
  DeviceModelConfig small_chunks = c;
  small_chunks.max_tokens = 16;  // the fill goes 16 tokens at a time
  const Weights w = MakeWeights(c, 5);
  auto decode_after_fill = [&](const DeviceModelConfig& config, uint64_t seed) {
    auto m = Upload(config, w);
    EXPECT_NE(m, nullptr);
    if (m == nullptr) return std::vector<float>();
    Seq s{std::vector<int32_t>(41, 7), {3, 1, 2}, 40};
    std::string err;
    EXPECT_TRUE(m->FillKvRandom(s.pages.data(), 3, 40, seed, &err)) << err;
    std::vector<float> logits;
    EXPECT_TRUE(m->Forward({Input(s, 1, false)}, &logits, &err)) << err;
    return logits;
  };
  const std::vector<float> a = decode_after_fill(c, 1);
  const std::vector<float> chunked = decode_after_fill(small_chunks, 1);
  const std::vector<float> other = decode_after_fill(c, 2);
  ASSERT_EQ(a.size(), size_t(c.vocab));
  EXPECT_EQ(a, chunked);
  EXPECT_NE(a, other);
  for (float x : a) ASSERT_TRUE(std::isfinite(x));

  auto m = Upload(c, w);
  ASSERT_NE(m, nullptr);
  std::string err;
  const int32_t bad_page[] = {0, c.num_pages};
  EXPECT_FALSE(m->FillKvRandom(bad_page, 2, 20, 1, &err));
  EXPECT_NE(err.find("out of range"), std::string::npos) << err;
  const int32_t pages[] = {0, 1};
  EXPECT_FALSE(m->FillKvRandom(pages, 2, 33, 1, &err));  // 33 tokens need 3 pages
  EXPECT_NE(err.find("do not fit"), std::string::npos) << err;
}

// A random LoRA adapter (its own rank per projection, none on wk) for `w`, and the weights it
// merges to (W + B·A): what the adapter's rows must compute.
struct RandomLora {
  std::vector<DeviceLoraLayer> layers;
  Weights merged;
};

RandomLora MakeLora(const DeviceModelConfig& c, const Weights& w, uint32_t seed) {
  std::mt19937 rng(seed);
  RandomLora out{std::vector<DeviceLoraLayer>(c.n_layers), w};
  // One fused product: its parts' weights (null: not adapted, rows skipped), rows and ranks.
  struct Part {
    std::vector<float>* merged;
    int rows, rank;
  };
  auto product = [&](int in, const std::vector<Part>& parts) {
    DeviceLoraUpdate u;
    int out_rows = 0;
    for (const Part& p : parts) {
      if (p.merged != nullptr) u.rank += p.rank;
      out_rows += p.rows;
    }
    u.a.assign(size_t(u.rank) * in, 0.f);
    u.b.assign(size_t(out_rows) * u.rank, 0.f);
    int r0 = 0, o0 = 0;
    for (const Part& p : parts) {
      if (p.merged != nullptr) {
        const std::vector<float> a =
            testing::RandomRounded(rng, DType::kF16, size_t(p.rank) * in, -1.f, 1.f);
        std::vector<float> b =
            testing::RandomRounded(rng, DType::kF16, size_t(p.rows) * p.rank, -1.f, 1.f);
        const float s = 1.f / std::sqrt(float(in) * p.rank);  // the adapter's scale
        for (float& v : b) v = RoundTo(DType::kF16, v * s);
        for (int j = 0; j < p.rank; ++j)
          std::copy(a.begin() + size_t(j) * in, a.begin() + size_t(j + 1) * in,
                    u.a.begin() + size_t(r0 + j) * in);
        for (int o = 0; o < p.rows; ++o)
          for (int j = 0; j < p.rank; ++j) {
            const float bv = b[size_t(o) * p.rank + j];
            u.b[size_t(o0 + o) * u.rank + r0 + j] = bv;
            for (int i = 0; i < in; ++i)
              (*p.merged)[size_t(o) * in + i] += bv * a[size_t(j) * in + i];
          }
        r0 += p.rank;
      }
      o0 += p.rows;
    }
    return u;
  };
  const int qd = c.n_heads * c.head_dim, kd = c.n_kv_heads * c.head_dim;
  for (int l = 0; l < c.n_layers; ++l) {
    auto& M = out.merged.layers[l];
    DeviceLoraLayer& L = out.layers[l];
    L.qkv = product(c.dim, {{&M.wq, qd, 4}, {nullptr, kd, 0}, {&M.wv, kd, 2}});
    L.o = product(qd, {{&M.wo, c.dim, 3}});
    L.gate_up = product(c.dim, {{&M.wgate, c.ffn_dim, 2}, {&M.wup, c.ffn_dim, 5}});
    if (l != 1) L.down = product(c.ffn_dim, {{&M.wdown, c.dim, 8}});  // layer 1: none
  }
  return out;
}

std::vector<float> Row(const std::vector<float>& logits, int i, int vocab) {
  return std::vector<float>(logits.begin() + size_t(i) * vocab,
                            logits.begin() + size_t(i + 1) * vocab);
}

// LoRA: rows of an adapter compute what the merged weights compute, base rows in the same batch
// the base model's, through prefill, mixed and graph-replayed decode steps; a removed adapter's
// id is refused and its graphs go; a bad adapter is refused.
TEST_F(DeviceModelTest, LoraRowsMatchMergedWeightsAndBaseRowsTheBase) {
  const DeviceModelConfig c = SmallConfig();
  const Weights w = MakeWeights(c, 21);
  const RandomLora lora = MakeLora(c, w, 22);
  auto m = Upload(c, w);
  ASSERT_NE(m, nullptr);
  std::string err;
  ASSERT_EQ(m->AddLora(lora.layers, &err), 1) << err;
  std::mt19937 rng(23);
  Seq a{RandomTokens(rng, 60, c.vocab), {3, 9, 1, 20}, 0};
  Seq b{RandomTokens(rng, 60, c.vocab), {11, 2, 30, 4}, 0};
  Seq d{RandomTokens(rng, 60, c.vocab), {12, 13, 14, 15}, 0};
  RefModel ra(c, lora.merged), rb(c, w), rd(c, lora.merged), a_base(c, w);
  auto with = [](DeviceSeq s, int id) {
    s.lora = id;
    return s;
  };
  std::vector<float> logits, ref_a, ref_b, ref_base;
  // Prefill: a (adapter) 30 tokens, b (base) 25.
  ASSERT_TRUE(m->Forward({with(Input(a, 30, false), 1), Input(b, 25, false)}, &logits, &err))
      << err;
  for (int i = 0; i < 30; ++i) ref_a = ra.Step(a.tokens[i]), ref_base = a_base.Step(a.tokens[i]);
  for (int i = 0; i < 25; ++i) ref_b = rb.Step(b.tokens[i]);
  EXPECT_TRUE(testing::AllClose("lora prefill a", Row(logits, 0, c.vocab), ref_a, kTol, kTol));
  EXPECT_TRUE(testing::AllClose("lora prefill b", Row(logits, 1, c.vocab), ref_b, kTol, kTol));
  // The adapter matters: a's logits are far from the base model's.
  float far = 0;
  for (int i = 0; i < c.vocab; ++i) far = std::max(far, std::fabs(logits[i] - ref_base[i]));
  EXPECT_GT(far, 0.5f);
  a.done = 30;
  b.done = 25;
  // Mixed: d (adapter) prefills 20 while a and b decode; then decode steps of all three (the
  // graph is captured on the second and replayed after).
  ASSERT_TRUE(m->Forward({Input(b, 1, false), with(Input(d, 20, false), 1),
                          with(Input(a, 1, false), 1)},
                         &logits, &err))
      << err;
  for (int i = 0; i < 20; ++i) ref_a = rd.Step(d.tokens[i]);
  EXPECT_TRUE(testing::AllClose("mixed b", Row(logits, 0, c.vocab), rb.Step(b.tokens[25]), kTol,
                                kTol));
  EXPECT_TRUE(testing::AllClose("mixed d", Row(logits, 1, c.vocab), ref_a, kTol, kTol));
  EXPECT_TRUE(testing::AllClose("mixed a", Row(logits, 2, c.vocab), ra.Step(a.tokens[30]), kTol,
                                kTol));
  a.done++, b.done++, d.done = 20;
  auto decode_step = [&](int id, const std::string& tag) {
    ASSERT_TRUE(m->Forward({with(Input(a, 1, false), id), Input(b, 1, false),
                            with(Input(d, 1, false), id)},
                           &logits, &err))
        << err;
    EXPECT_TRUE(testing::AllClose(tag + " a", Row(logits, 0, c.vocab), ra.Step(a.tokens[a.done]),
                                  kTol, kTol));
    EXPECT_TRUE(testing::AllClose(tag + " b", Row(logits, 1, c.vocab), rb.Step(b.tokens[b.done]),
                                  kTol, kTol));
    EXPECT_TRUE(testing::AllClose(tag + " d", Row(logits, 2, c.vocab), rd.Step(d.tokens[d.done]),
                                  kTol, kTol));
    a.done++, b.done++, d.done++;
  };
  for (int step = 0; step < 4; ++step) {
    decode_step(1, "decode " + std::to_string(step));
    EXPECT_EQ(m->last_stats().graph_replayed, step >= 1) << "step " << step;
  }
  // Removed: its id is refused; the same adapter added again gets id 2 and a fresh graph.
  m->RemoveLora(1);
  EXPECT_FALSE(m->Forward({with(Input(a, 1, false), 1)}, &logits, &err));
  EXPECT_NE(err.find("LoRA adapter id 1 is not loaded"), std::string::npos) << err;
  ASSERT_EQ(m->AddLora(lora.layers, &err), 2) << err;
  for (int step = 0; step < 3; ++step) {
    decode_step(2, "re-added " + std::to_string(step));
    EXPECT_EQ(m->last_stats().graph_replayed, step >= 1) << "step " << step;
  }
  // Shapes that do not fit.
  std::vector<DeviceLoraLayer> bad = lora.layers;
  bad.pop_back();
  EXPECT_EQ(m->AddLora(bad, &err), 0);
  EXPECT_NE(err.find("layers"), std::string::npos) << err;
  bad = lora.layers;
  bad[2].o.b.pop_back();
  EXPECT_EQ(m->AddLora(bad, &err), 0);
  EXPECT_NE(err.find("layer 2 o"), std::string::npos) << err;
}

TEST_F(DeviceModelTest, BadInputIsRefused) {
  const DeviceModelConfig c = SmallConfig();
  auto m = Upload(c, MakeWeights(c, 1));
  ASSERT_NE(m, nullptr);
  std::string err;
  std::vector<float> logits;
  Seq s{{1, 2, 3}, {0}, 0};
  s.tokens[1] = c.vocab;
  EXPECT_FALSE(m->Forward({Input(s, 3, false)}, &logits, &err));
  EXPECT_NE(err.find("out of range"), std::string::npos) << err;
  Seq t{std::vector<int32_t>(40, 1), {0, 1}, 0};  // 40 tokens need 3 pages
  EXPECT_FALSE(m->Forward({Input(t, 40, false)}, &logits, &err));
  EXPECT_NE(err.find("page table"), std::string::npos) << err;
  std::vector<float> one(5);
  EXPECT_FALSE(m->SetWeight(WeightSlot::kWq, 0, one.data(), 5, &err));
  EXPECT_NE(err.find("expected"), std::string::npos) << err;
  DeviceModelConfig bad = c;
  bad.head_dim = 32;
  EXPECT_EQ(DeviceModel::Create(bad, &err), nullptr);
  EXPECT_NE(err.find("head_dim"), std::string::npos) << err;
}

}  // namespace
}  // namespace tinyserve::cuda
