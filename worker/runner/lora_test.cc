// LoRA adapters in the CPU runner (worker/model/lora_adapter.h, TransformerRunner::AddLora):
//   - rows with an adapter equal the base model with merged weights W + scale·B·A (computed
//     here, independently of the runner's low-rank path), and rows without equal the base;
//   - a batch mixing adapters and the base gives each sequence its own run's logits;
//   - two tensor-parallel half-shards with the adapter sum to the unsharded result;
//   - malformed adapters are refused at open with an error naming what is wrong;
//   - PEFT folders: on a Hugging Face model (llama-tiny, GQA) against merged weights, and on the
//     same model presented as GGUF presents it (Q/K rows permuted, adjacent-pair RoPE) against
//     the Hugging Face result, which checks the Q/K update permutation.
// On stories260K (F32 llama) and scripts/make_test_models.py's llama-tiny. The end-to-end check
// against llama.cpp with a LoRA on SmolLM2-135M is tests/cluster/lora_test.py.
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <thread>

#include "common/fp16.h"
#include "common/paths.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/dequant.h"
#include "worker/gguf/gguf_test_util.h"
#include "worker/hf/safetensors_test_util.h"
#include "worker/model/lora_adapter.h"
#include "worker/model/weight_source.h"
#include "worker/runner/lora_test_util.h"
#include "worker/runner/transformer.h"
#include "worker/tp/communicator.h"

namespace tinyserve {
namespace {

using lora_testing::Bytes;
using lora_testing::RandomUpdates;
using lora_testing::Update;
using lora_testing::WriteAdapter;
using testing_gguf::GgufBuilder;

// A source with some tensors replaced by F32 values (and, optionally, another config).
class ReplacedSource : public WeightSource {
 public:
  explicit ReplacedSource(const WeightSource& base) : base_(base), config_(base.config()) {}
  const ModelConfig& config() const override { return config_; }
  const TokenizerData& tokenizer_data() const override { return base_.tokenizer_data(); }
  bool Has(const std::string& name) const override { return base_.Has(name); }
  std::string Describe() const override { return "replaced " + base_.Describe(); }
  absl::StatusOr<TensorRef> Get(const std::string& name) const override {
    TS_ASSIGN_OR_RETURN(TensorRef t, base_.Get(name));
    auto it = replaced_.find(name);
    if (it == replaced_.end()) return t;
    t.type = GgmlType::kF32;
    t.data = reinterpret_cast<const uint8_t*>(it->second.data());
    t.nbytes = it->second.size() * sizeof(float);
    return t;
  }

 protected:
  // The base's values of tensor `name` ([rows][cols] in ggml orientation) as floats.
  std::vector<float> Floats(const std::string& name) const {
    TensorRef t = *base_.Get(name);
    int64_t n = 1;
    for (int64_t e : t.ne) n *= e;
    std::vector<float> w(static_cast<size_t>(n));
    EXPECT_TRUE(DequantizeRow(t.type, t.data, w.data(), n).ok());
    return w;
  }

  const WeightSource& base_;
  ModelConfig config_;
  std::map<std::string, std::vector<float>> replaced_;
};

// The base model with W + scale·B·A in place of each updated weight (F32), computed directly.
class MergedSource : public ReplacedSource {
 public:
  MergedSource(const WeightSource& base, const std::vector<Update>& ups, float alpha,
               bool rslora = false)
      : ReplacedSource(base) {
    for (const Update& up : ups) {
      std::vector<float> w = Floats(up.weight);
      const float scale =
          alpha == 0 ? 1.0f
                     : alpha / (rslora ? std::sqrt(static_cast<float>(up.r)) : static_cast<float>(up.r));
      for (int64_t o = 0; o < up.out; ++o)
        for (int64_t i = 0; i < up.in; ++i) {
          double s = 0;
          for (int64_t j = 0; j < up.r; ++j) s += double{up.b[o * up.r + j]} * up.a[j * up.in + i];
          w[o * up.in + i] += scale * static_cast<float>(s);
        }
      replaced_[up.weight] = std::move(w);
    }
  }
};

struct Seq {
  std::vector<int32_t> ids;
  int lora = 0;
};

// Prefills every sequence in one batch (each in its own pages), then decodes one more token
// each in a second batch; returns per sequence its [n + 1][vocab] logits.
std::vector<std::vector<float>> RunBatch(TransformerRunner& r, const std::vector<Seq>& seqs,
                                         int32_t next = 7) {
  constexpr int kPage = 16;
  int64_t pages_needed = 0;
  for (const Seq& s : seqs) pages_needed += (static_cast<int64_t>(s.ids.size()) + kPage) / kPage;
  PagedKvCache kv(r.MakeKvConfig(kPage, pages_needed));
  std::vector<std::vector<int32_t>> tables(seqs.size());
  std::vector<std::vector<int32_t>> decode_ids(seqs.size(), std::vector<int32_t>{next});
  int32_t p = 0;
  for (size_t i = 0; i < seqs.size(); ++i)
    for (int64_t k = 0; k < (static_cast<int64_t>(seqs[i].ids.size()) + kPage) / kPage; ++k) {
      kv.ResetPage(p);
      tables[i].push_back(p++);
    }
  std::vector<std::vector<float>> out(seqs.size());
  const int vocab = r.config().vocab_size;
  for (int phase = 0; phase < 2; ++phase) {
    std::vector<SeqInput> batch;
    for (size_t i = 0; i < seqs.size(); ++i) {
      SeqInput in;
      in.tokens = phase == 0 ? seqs[i].ids.data() : decode_ids[i].data();
      in.n = phase == 0 ? static_cast<int>(seqs[i].ids.size()) : 1;
      in.start_pos = phase == 0 ? 0 : static_cast<int64_t>(seqs[i].ids.size());
      in.pages = &tables[i];
      in.all_logits = phase == 0;
      in.lora = seqs[i].lora;
      batch.push_back(in);
    }
    std::vector<float> logits;
    absl::Status st = r.Forward(batch, &kv, &logits);
    EXPECT_TRUE(st.ok()) << st;
    size_t row = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const size_t rows = phase == 0 ? seqs[i].ids.size() : 1;
      out[i].insert(out[i].end(), logits.begin() + row * vocab,
                    logits.begin() + (row + rows) * vocab);
      row += rows;
    }
  }
  return out;
}

// max |got - want| relative to max |want|.
float RelErr(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  float scale = 0, err = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    scale = std::max(scale, std::fabs(want[i]));
    err = std::max(err, std::fabs(got[i] - want[i]));
  }
  return err / std::max(scale, 1e-30f);
}

const std::vector<int32_t> kPrompt = {1,   403, 407, 261, 378, 432, 383, 286, 261, 376,
                                      290, 300, 301, 350, 380, 412, 420, 266, 267, 268};

class LoraRunner : public ::testing::Test {
 protected:
  void SetUp() override {
    auto src = OpenWeightSource(Stories260kPath());
    ASSERT_TRUE(src.ok()) << src.status();
    src_ = std::move(*src);
    ups1_ = RandomUpdates(src_->config(), 4, 1);
    ups2_ = RandomUpdates(src_->config(), 8, 2);
    ups2_.resize(ups2_.size() / 2);  // the second adapter updates only the first layers
    path1_ = WriteAdapter("lora1.gguf", ups1_, 8.0f);
    path2_ = WriteAdapter("lora2.gguf", ups2_, 4.0f);
  }
  std::unique_ptr<TransformerRunner> Runner(const WeightSource& src, ThreadPool* pool = nullptr) {
    RunnerOptions ro;
    ro.pool = pool;
    auto r = TransformerRunner::Create(src, ro);
    EXPECT_TRUE(r.ok()) << r.status();
    return std::move(*r);
  }
  std::unique_ptr<WeightSource> src_;
  std::vector<Update> ups1_, ups2_;
  std::string path1_, path2_;
};

TEST_F(LoraRunner, AdapterRowsMatchMergedWeightsAndBaseRowsTheBase) {
  ThreadPool pool(2);
  auto base = Runner(*src_, &pool);
  auto with = Runner(*src_, &pool);
  auto infos = AddLoras({{"one", path1_}, {"two", path2_}}, with.get());
  ASSERT_TRUE(infos.ok()) << infos.status();
  ASSERT_EQ(infos->size(), 2u);
  EXPECT_EQ((*infos)[0].max_rank, 4);
  EXPECT_EQ((*infos)[0].tensors, 7 * src_->config().n_layers);
  EXPECT_EQ(with->num_loras(), 2);

  MergedSource merged1(*src_, ups1_, 8.0f), merged2(*src_, ups2_, 4.0f);
  auto m1 = Runner(merged1, &pool);
  auto m2 = Runner(merged2, &pool);
  const auto want_base = RunBatch(*base, {{kPrompt, 0}})[0];
  const auto want1 = RunBatch(*m1, {{kPrompt, 0}})[0];
  const auto want2 = RunBatch(*m2, {{kPrompt, 0}})[0];
  // The adapters change the output, so the comparisons below can fail.
  EXPECT_GT(RelErr(want1, want_base), 0.05f);
  EXPECT_GT(RelErr(want2, want_base), 0.02f);

  EXPECT_EQ(RunBatch(*with, {{kPrompt, 0}})[0], want_base);  // no adapter: the base, bit for bit
  // K/V are stored in fp16, where the two ways of computing them round apart (as in
  // transformer_test's comparisons): about 6e-4 of the largest logit here.
  EXPECT_LE(RelErr(RunBatch(*with, {{kPrompt, 1}})[0], want1), 2e-3f);
  EXPECT_LE(RelErr(RunBatch(*with, {{kPrompt, 2}})[0], want2), 2e-3f);
}

// No adapter.lora.alpha: scale 1 (llama.cpp's rule); the weights of one adapter may have
// different ranks (each update is scaled by its own).
TEST_F(LoraRunner, AbsentAlphaMeansScaleOneAndRanksMayDiffer) {
  std::vector<Update> ups = RandomUpdates(src_->config(), 2, 5);
  const std::vector<Update> wide = RandomUpdates(src_->config(), 6, 6);
  for (size_t i = 0; i < ups.size(); i += 2) ups[i] = wide[i];
  auto with = Runner(*src_);
  ASSERT_TRUE(AddLoras({{"mixed", WriteAdapter("mixed.gguf", ups, -1)}}, with.get()).ok());
  MergedSource merged(*src_, ups, 0.0f);
  auto m = Runner(merged);
  const auto want = RunBatch(*m, {{kPrompt, 0}})[0];
  EXPECT_GT(RelErr(want, RunBatch(*with, {{kPrompt, 0}})[0]), 0.02f);
  EXPECT_LE(RelErr(RunBatch(*with, {{kPrompt, 1}})[0], want), 2e-3f);
}

// GPT-2's fused Q/K/V weight: one update whose B rows split into the three projections.
TEST(Gpt2Lora, FusedQkvUpdateMatchesMergedWeights) {
  const char* models = std::getenv("TINYSERVE_TEST_MODELS");
  if (models == nullptr) GTEST_SKIP() << "TINYSERVE_TEST_MODELS is not set (CTest fixture)";
  auto src = OpenWeightSource(std::string(models) + "/gpt2-tiny");
  ASSERT_TRUE(src.ok()) << src.status();
  const std::vector<Update> ups = RandomUpdates((*src)->config(), 4, 9);
  const std::string path = WriteAdapter("gpt2.gguf", ups, 8.0f, "gpt2");
  MergedSource merged(**src, ups, 8.0f);
  auto m = TransformerRunner::Create(merged, RunnerOptions());
  auto with = TransformerRunner::Create(**src, RunnerOptions());
  ASSERT_TRUE(m.ok() && with.ok());
  ASSERT_TRUE(AddLoras({{"g", path}}, with->get()).ok());
  const std::vector<int32_t> ids = {5, 9, 200, 17, 33, 1, 80, 81, 82, 150};
  const auto want = RunBatch(**m, {{ids, 0}})[0];
  EXPECT_GT(RelErr(want, RunBatch(**with, {{ids, 0}})[0]), 0.02f);
  EXPECT_LE(RelErr(RunBatch(**with, {{ids, 1}})[0], want), 2e-3f);
}

TEST_F(LoraRunner, MixedBatchGivesEachSequenceItsOwnResult) {
  auto r = Runner(*src_);
  ASSERT_TRUE(AddLoras({{"one", path1_}, {"two", path2_}}, r.get()).ok());
  std::vector<int32_t> other(kPrompt.begin() + 3, kPrompt.end());
  const std::vector<Seq> seqs = {{kPrompt, 1}, {kPrompt, 1}, {other, 0}, {kPrompt, 2}, {other, 1}};
  const auto together = RunBatch(*r, seqs);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto alone = RunBatch(*r, {seqs[i]})[0];
    EXPECT_LE(RelErr(together[i], alone), 1e-6f) << "sequence " << i;
  }
  EXPECT_GT(RelErr(together[0], together[3]), 0.01f);  // adapters 1 and 2 differ
}

TEST_F(LoraRunner, TwoHalfShardsWithAnAdapterSumToTheWhole) {
  auto whole = Runner(*src_);
  ASSERT_TRUE(AddLoras({{"one", path1_}}, whole.get()).ok());
  const auto want = RunBatch(*whole, {{kPrompt, 1}})[0];
  auto comms = MakeInProcessGroup(2);
  std::vector<std::vector<float>> got(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank)
    threads.emplace_back([&, rank] {
      RunnerOptions ro;
      ro.rank = rank;
      ro.world_size = 2;
      ro.comm = comms[rank].get();
      auto r = TransformerRunner::Create(*src_, ro);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_TRUE(AddLoras({{"one", path1_}}, r->get()).ok());
      got[rank] = RunBatch(**r, {{kPrompt, 1}})[0];
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(got[0], got[1]);
  EXPECT_LE(RelErr(got[0], want), 1e-4f);
}

TEST_F(LoraRunner, ForwardRefusesAnUnknownAdapterId) {
  auto r = Runner(*src_);
  PagedKvCache kv(r->MakeKvConfig(16, 2));
  std::vector<int32_t> pages = {0, 1};
  SeqInput in;
  in.tokens = kPrompt.data();
  in.n = 3;
  in.pages = &pages;
  in.lora = 1;  // none loaded
  std::vector<float> logits;
  absl::Status st = r->Forward({in}, &kv, &logits);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("LoRA adapter id 1"), std::string::npos) << st;
}

// The Hugging Face module of a GGUF weight name ("blk.1.attn_q.weight" -> "model.layers.1.
// self_attn.q_proj").
std::string HfModule(const std::string& gguf) {
  const size_t a = gguf.find('.', 4), b = gguf.rfind('.');
  const std::string layer = gguf.substr(4, a - 4), what = gguf.substr(a + 1, b - a - 1);
  static const std::map<std::string, std::string> kModules = {
      {"attn_q", "self_attn.q_proj"}, {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"}, {"attn_output", "self_attn.o_proj"},
      {"ffn_gate", "mlp.gate_proj"},  {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"}};
  return "model.layers." + layer + "." + kModules.at(what);
}

// A PEFT folder (adapter_config.json, adapter_model.safetensors) holding `ups`.
std::string WritePeft(const std::string& dir_name, const std::vector<Update>& ups, float alpha,
                      const std::string& extra_config = "") {
  const std::string dir = ::testing::TempDir() + "/" + dir_name;
  std::filesystem::remove_all(dir);  // (a FIFO left by an earlier run would block the writes)
  std::filesystem::create_directories(dir);
  int r = 0;
  std::vector<testing::FloatTensor> tensors;
  for (const Update& up : ups) {
    const std::string m = "base_model.model." + HfModule(up.weight);
    tensors.push_back({m + ".lora_A.weight", {up.r, up.in}, up.a});
    tensors.push_back({m + ".lora_B.weight", {up.out, up.r}, up.b});
    r = static_cast<int>(up.r);
  }
  std::ofstream(dir + "/adapter_config.json")
      << R"({"peft_type": "LORA", "r": )" << r << R"(, "lora_alpha": )" << alpha
      << R"(, "bias": "none", "target_modules": ["q_proj", "v_proj"], "modules_to_save": null)"
      << extra_config << "}";
  std::ofstream(dir + "/adapter_model.safetensors", std::ios::binary)
      << testing::MakeF32Safetensors(tensors);
  return dir;
}

// A Hugging Face llama presented as a GGUF file presents it: Q and K rows permuted as
// convert_hf_to_gguf.py permutes them (per head [2, hd/2] -> [hd/2, 2]) and adjacent-pair RoPE.
class GgufOrientedSource : public ReplacedSource {
 public:
  explicit GgufOrientedSource(const WeightSource& hf) : ReplacedSource(hf) {
    config_.rope_style = RopeStyle::kAdjacent;
    const int hd = config_.head_dim;
    for (int l = 0; l < config_.n_layers; ++l)
      for (const auto& [what, heads] : {std::pair<std::string, int>{"attn_q", config_.n_heads},
                                        {"attn_k", config_.n_kv_heads}}) {
        const std::string name = "blk." + std::to_string(l) + "." + what + ".weight";
        const std::vector<float> w = Floats(name);
        const size_t cols = w.size() / static_cast<size_t>(heads * hd);
        std::vector<float>& out = replaced_[name];
        out.resize(w.size());
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < hd / 2; ++i)
            for (int c = 0; c < 2; ++c)
              std::copy_n(&w[(h * hd + c * (hd / 2) + i) * cols], cols,
                          &out[(h * hd + 2 * i + c) * cols]);
      }
  }
};

TEST(PeftLora, HfModelMatchesMergedWeightsAndGgufOrientationMatchesHf) {
  const char* models = std::getenv("TINYSERVE_TEST_MODELS");
  if (models == nullptr) GTEST_SKIP() << "TINYSERVE_TEST_MODELS is not set (CTest fixture)";
  auto hf = OpenWeightSource(std::string(models) + "/llama-tiny");
  ASSERT_TRUE(hf.ok()) << hf.status();
  const ModelConfig& c = (*hf)->config();
  ASSERT_EQ(c.rope_style, RopeStyle::kRotateHalf);
  ASSERT_NE(c.n_heads, c.n_kv_heads);  // GQA: K permutes with the KV head count
  const std::vector<int32_t> ids = {5, 9, 200, 17, 33, 1,  80, 81, 82, 150, 151,
                                    7, 8, 9,   10, 11, 12, 13, 14, 15, 16,  99};
  auto runner = [&](const WeightSource& src) {
    auto r = TransformerRunner::Create(src, RunnerOptions());
    EXPECT_TRUE(r.ok()) << r.status();
    return std::move(*r);
  };
  const std::vector<Update> ups = RandomUpdates(c, 4, 7);
  for (const bool rslora : {false, true}) {
    const std::string dir =
        WritePeft(rslora ? "peft-rs" : "peft", ups, 8.0f, rslora ? R"(, "use_rslora": true)" : "");
    MergedSource merged(**hf, ups, 8.0f, rslora);
    const auto want = RunBatch(*runner(merged), {{ids, 0}})[0];
    auto with = runner(**hf);
    auto infos = AddLoras({{"p", dir}}, with.get());
    ASSERT_TRUE(infos.ok()) << infos.status();
    const auto got = RunBatch(*with, {{ids, 1}})[0];
    EXPECT_GT(RelErr(want, RunBatch(*with, {{ids, 0}})[0]), 0.02f);  // the adapter matters
    EXPECT_LE(RelErr(got, want), 2e-3f) << (rslora ? "rslora" : "lora");

    // The same model as GGUF orients it: the base agrees with the HF one (RoPE pairs and
    // permuted rows are the same computation), and so does the adapter, whose Q/K updates the
    // reader permutes.
    GgufOrientedSource gguf(**hf);
    auto g = runner(gguf);
    EXPECT_LE(RelErr(RunBatch(*g, {{ids, 0}})[0], RunBatch(*with, {{ids, 0}})[0]), 1e-4f);
    ASSERT_TRUE(AddLoras({{"p", dir}}, g.get()).ok());
    EXPECT_LE(RelErr(RunBatch(*g, {{ids, 1}})[0], got), 2e-3f) << (rslora ? "rslora" : "lora");
    // A GGUF adapter does not fit a Hugging Face base.
    const std::string as_gguf = WriteAdapter("hf-base.gguf", ups, 8.0f);
    auto refused = AddLoras({{"g", as_gguf}}, with.get());
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("give the adapter as a PEFT folder"),
              std::string::npos);
  }
}

TEST_F(LoraRunner, MalformedPeftFoldersAreRefusedNamingWhatIsWrong) {
  const ModelConfig& c = src_->config();
  std::vector<Update> one(ups1_.begin(), ups1_.begin() + 2);
  auto expect_error = [&](const std::string& dir, const std::string& needle) {
    auto a = LoraAdapter::Open("x", dir, c);
    ASSERT_FALSE(a.ok()) << needle;
    EXPECT_NE(a.status().message().find(needle), std::string::npos) << a.status();
  };
  EXPECT_TRUE(LoraAdapter::Open("x", WritePeft("peft-ok", one, 8), c).ok());
  expect_error(WritePeft("peft-save", one, 8, R"(, "modules_to_save": ["lm_head"])"),
               "modules_to_save");
  expect_error(WritePeft("peft-dora", one, 8, R"(, "use_dora": true)"), "DoRA");
  {
    const std::string dir = WritePeft("peft-bin", one, 8);
    std::filesystem::remove(dir + "/adapter_model.safetensors");
    std::ofstream(dir + "/adapter_model.bin") << "pickle";
    expect_error(dir, "safe_serialization=True");
  }
  {
    const std::string dir = ::testing::TempDir() + "/peft-none";
    std::filesystem::create_directories(dir);
    expect_error(dir, "without adapter_config.json");
  }
  {
    // What a run-time load could name: neither waited on (a FIFO) nor read without end.
    const std::string dir = WritePeft("peft-zero", one, 8);
    std::filesystem::remove(dir + "/adapter_config.json");
    std::filesystem::create_symlink("/dev/zero", dir + "/adapter_config.json");
    expect_error(dir,
                 "adapter_config.json: '" + dir + "/adapter_config.json' is not a regular file");
    const std::string fifo = ::testing::TempDir() + "/adapter.fifo";
    std::filesystem::remove(fifo);
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    expect_error(fifo, "is not a regular file");
    std::filesystem::remove(dir + "/adapter_config.json");
    std::ofstream(dir + "/adapter_config.json")
        << R"({"peft_type": "LORA", "r": 8, "lora_alpha": 8})";
    std::filesystem::remove(dir + "/adapter_model.safetensors");
    std::filesystem::rename(fifo, dir + "/adapter_model.safetensors");
    expect_error(dir, "is not a regular file");
    std::filesystem::remove_all(dir);
  }
  {
    std::vector<Update> bad = one;
    bad[0].weight = "blk.0.attn_q.weight";
    const std::string dir = WritePeft("peft-half", {bad[0]}, 8);
    // Drop the B factor: rewrite the safetensors with A only.
    std::ofstream(dir + "/adapter_model.safetensors", std::ios::binary)
        << testing::MakeF32Safetensors(
               {{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                 {bad[0].r, bad[0].in},
                 bad[0].a}});
    expect_error(dir, "'blk.0.attn_q.weight' has only its lora_A factor");
    std::ofstream(dir + "/adapter_model.safetensors", std::ios::binary)
        << testing::MakeF32Safetensors({{"base_model.model.model.embed_tokens.lora_embedding_A",
                                         {4, 8},
                                         std::vector<float>(32, 0.0f)}});
    expect_error(dir, "is not a LoRA factor");
  }
}

TEST_F(LoraRunner, MalformedAdaptersAreRefusedNamingWhatIsWrong) {
  const ModelConfig& c = src_->config();
  auto open = [&](const std::string& path) { return LoraAdapter::Open("x", path, c); };
  auto expect_error = [&](const absl::StatusOr<std::unique_ptr<LoraAdapter>>& a,
                          const std::string& needle) {
    ASSERT_FALSE(a.ok()) << needle;
    EXPECT_NE(a.status().message().find(needle), std::string::npos) << a.status();
  };
  std::vector<Update> one(ups1_.begin(), ups1_.begin() + 1);  // blk.0.attn_q

  expect_error(open(::testing::TempDir() + "/missing.gguf"), "no such file");
  expect_error(open(Stories260kPath()), "general.type");  // a model, not an adapter
  expect_error(open(WriteAdapter("arch.gguf", one, 8, "gpt2")),
               "general.architecture is 'gpt2' but the model is 'llama'");
  {
    std::vector<Update> bad = one;
    bad[0].weight = "token_embd.weight";
    expect_error(open(WriteAdapter("embd.gguf", bad, 8)), "'token_embd.weight' is not a weight");
    bad[0].weight = "blk.99.attn_q.weight";
    expect_error(open(WriteAdapter("layer.gguf", bad, 8)), "'blk.99.attn_q.weight' is not");
  }
  {
    std::vector<Update> bad = one;
    bad[0].in += 1;
    bad[0].a.resize(static_cast<size_t>(bad[0].r * bad[0].in));
    expect_error(open(WriteAdapter("shape.gguf", bad, 8)),
                 "tensor 'blk.0.attn_q.weight': lora_a [65, 4]");
  }
  {
    GgufBuilder b;
    b.AddString("general.architecture", "llama");
    b.AddString("general.type", "adapter");
    b.AddString("adapter.type", "lora");
    b.AddTensor("blk.0.attn_q.weight.lora_a", GgmlType::kF32, {64, 4},
                Bytes(std::vector<float>(256, 0.0f), GgmlType::kF32));
    const std::string path = ::testing::TempDir() + "/half.gguf";
    ASSERT_TRUE(testing_gguf::WriteFile(path, b.Build()));
    expect_error(open(path), "'blk.0.attn_q.weight.lora_a' has no .lora_b partner");
  }
  {
    std::vector<Update> bad = one;
    bad[0].b[3] = std::numeric_limits<float>::quiet_NaN();
    auto r = Runner(*src_);
    auto st = AddLoras({{"nan", WriteAdapter("nan.gguf", bad, 8)}}, r.get());
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.status().message().find("blk.0.attn_q.weight.lora_b': row 0 holds nan"),
              std::string::npos)
        << st.status();
  }
  // Names, for --lora.
  std::string name, path;
  EXPECT_TRUE(ParseLoraFlag("sql-expert=/tmp/a.gguf", &name, &path).ok());
  EXPECT_EQ(name, "sql-expert");
  EXPECT_EQ(path, "/tmp/a.gguf");
  EXPECT_FALSE(ParseLoraFlag("no-path=", &name, &path).ok());
  EXPECT_FALSE(ParseLoraFlag("/tmp/a.gguf", &name, &path).ok());
  EXPECT_FALSE(ParseLoraFlag("bad name=/tmp/a.gguf", &name, &path).ok());
  // Two adapters of one name.
  auto r = Runner(*src_);
  auto dup = AddLoras({{"a", path1_}, {"a", path2_}}, r.get());
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("'a' is given twice"), std::string::npos);
}

}  // namespace
}  // namespace tinyserve
