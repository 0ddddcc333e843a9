// OpenHfWeightSource over the random models of scripts/make_test_models.py (the CTest fixture
// make_test_models writes them to $TINYSERVE_TEST_MODELS). Checks names, GGUF orientation
// against the raw file values (the GPT-2 Conv1D transposes explicitly), shards, dtypes and
// the errors for broken folders.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/fp16.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/hf/safetensors.h"
#include "worker/hf/safetensors_test_util.h"
#include "worker/model/weight_source.h"
#include "worker/tokenizer/unicode.h"

namespace tinyserve {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path ModelsDir() {
  const char* env = std::getenv("TINYSERVE_TEST_MODELS");
  return env != nullptr ? fs::path(env) : fs::path("build") / "test-models";
}

float ReadF32(const uint8_t* p, size_t i) {
  float f;
  std::memcpy(&f, p + 4 * i, 4);
  return f;
}

float ReadF16(const uint8_t* p, size_t i) {
  fp16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return Fp16ToFloat(h);
}

class HfWeightSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(ModelsDir() / "gpt2-tiny-lmhead-f16" / "config.json")) {
      GTEST_SKIP() << "no test models in " << ModelsDir()
                   << ": run `ctest -R make_test_models` or scripts/make_test_models.py "
                      "(set TINYSERVE_TEST_MODELS to the folder)";
    }
  }
  void TearDown() override {
    if (!scratch_.empty()) fs::remove_all(scratch_);
  }

  std::unique_ptr<WeightSource> Open(const std::string& model) {
    auto src = OpenHfWeightSource((ModelsDir() / model).string());
    EXPECT_TRUE(src.ok()) << src.status();
    return src.ok() ? std::move(src).value() : nullptr;
  }

  std::unique_ptr<SafetensorsFile> Raw(const std::string& model) {
    auto f = SafetensorsFile::Open((ModelsDir() / model / "model.safetensors").string());
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? std::move(f).value() : nullptr;
  }

  // A writable copy of a test model whose config.json fields are replaced by `patch`.
  fs::path CopyWithConfig(const std::string& model, const nlohmann::json& patch) {
    scratch_ = fs::temp_directory_path() / ("ts_hf_ws_test_" + std::to_string(::getpid()));
    fs::remove_all(scratch_);
    fs::create_directories(scratch_);
    const fs::path dir = scratch_ / model;
    fs::copy(ModelsDir() / model, dir, fs::copy_options::recursive);
    std::ifstream in(dir / "config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    config.merge_patch(patch);
    std::ofstream(dir / "config.json", std::ios::trunc) << config.dump(1);
    return dir;
  }

  fs::path scratch_;
};

TEST_F(HfWeightSourceTest, LlamaTiny) {
  auto src = Open("llama-tiny");
  ASSERT_NE(src, nullptr);
  const ModelConfig& c = src->config();
  EXPECT_EQ(c.arch, Arch::kLlama);
  EXPECT_EQ(c.name, "llama-tiny");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.ffn_dim, 96);
  EXPECT_EQ(c.vocab_size, 272);
  EXPECT_EQ(c.max_context, 128);
  EXPECT_EQ(c.rope_style, RopeStyle::kRotateHalf);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_EQ(src->tokenizer_data().model, "gpt2");
  EXPECT_EQ(src->tokenizer_data().tokens.size(), 272u);
  EXPECT_THAT(src->Describe(), HasSubstr("llama-tiny"));

  struct Want {
    const char* gguf;
    const char* hf;
    std::vector<int64_t> ne;
  };
  const Want wants[] = {
      {"token_embd.weight", "model.embed_tokens.weight", {64, 272}},
      {"output.weight", "lm_head.weight", {64, 272}},
      {"output_norm.weight", "model.norm.weight", {64}},
      {"blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight", {64}},
      {"blk.1.attn_q.weight", "model.layers.1.self_attn.q_proj.weight", {64, 64}},
      {"blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight", {64, 32}},
      {"blk.1.attn_v.weight", "model.layers.1.self_attn.v_proj.weight", {64, 32}},
      {"blk.1.attn_output.weight", "model.layers.1.self_attn.o_proj.weight", {64, 64}},
      {"blk.1.ffn_norm.weight", "model.layers.1.post_attention_layernorm.weight", {64}},
      {"blk.1.ffn_gate.weight", "model.layers.1.mlp.gate_proj.weight", {64, 96}},
      {"blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight", {64, 96}},
      {"blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight", {96, 64}},
  };
  auto raw = Raw("llama-tiny");
  ASSERT_NE(raw, nullptr);
  for (const Want& w : wants) {
    auto t = src->Get(w.gguf);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->name, w.gguf);
    EXPECT_EQ(t->type, GgmlType::kF32) << w.gguf;
    EXPECT_EQ(t->ne, w.ne) << w.gguf;
    // Same bytes as the file: in particular Q and K rows are not RoPE-permuted.
    const SafetensorsTensor* r = raw->Find(w.hf);
    ASSERT_NE(r, nullptr) << w.hf;
    ASSERT_EQ(t->nbytes, r->nbytes) << w.gguf;
    EXPECT_EQ(std::memcmp(t->data, r->data, r->nbytes), 0) << w.gguf;
  }
  auto missing = src->Get("blk.2.attn_q.weight");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("blk.2.attn_q.weight"));
  EXPECT_FALSE(src->Has("blk.2.attn_q.weight"));
  EXPECT_TRUE(src->Has("blk.0.ffn_gate.weight"));
}

TEST_F(HfWeightSourceTest, ShardedMatchesSingleFile) {
  auto single = Open("llama-tiny");
  auto sharded = Open("llama-tiny-sharded");
  ASSERT_NE(single, nullptr);
  ASSERT_NE(sharded, nullptr);
  EXPECT_THAT(sharded->Describe(), HasSubstr("2 safetensors files"));
  const char* names[] = {"token_embd.weight",    "output.weight",         "output_norm.weight",
                         "blk.0.attn_q.weight",  "blk.0.ffn_down.weight", "blk.1.attn_k.weight",
                         "blk.1.ffn_gate.weight"};
  for (const char* name : names) {
    auto a = single->Get(name);
    auto b = sharded->Get(name);
    ASSERT_TRUE(a.ok() && b.ok()) << name;
    EXPECT_EQ(a->ne, b->ne);
    ASSERT_EQ(a->nbytes, b->nbytes);
    EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes), 0) << name;
  }
}

TEST_F(HfWeightSourceTest, TiedBf16Llama) {
  auto src = Open("llama-tiny-tied-bf16");
  ASSERT_NE(src, nullptr);
  EXPECT_TRUE(src->config().tied_embeddings);
  EXPECT_FALSE(src->Has("output.weight"));
  auto e = src->Get("token_embd.weight");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->type, GgmlType::kBF16);
  EXPECT_EQ(e->ne, (std::vector<int64_t>{64, 272}));
  EXPECT_EQ(e->nbytes, 64u * 272u * 2u);
}

TEST_F(HfWeightSourceTest, Gpt2TinyTransposesConv1D) {
  auto src = Open("gpt2-tiny");
  auto raw = Raw("gpt2-tiny");
  ASSERT_NE(src, nullptr);
  ASSERT_NE(raw, nullptr);
  const ModelConfig& c = src->config();
  EXPECT_EQ(c.arch, Arch::kGpt2);
  EXPECT_EQ(c.rope_style, RopeStyle::kNone);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.ffn_dim, 256);
  EXPECT_EQ(c.max_context, 128);
  EXPECT_FALSE(src->Has("output.weight"));

  // Conv1D [in, out] in the file; GGUF ne = [in, out] with element (row o, col i) at o*in + i.
  struct Conv {
    const char* gguf;
    const char* hf;
    int64_t in, out;
  };
  const Conv convs[] = {
      {"blk.1.attn_qkv.weight", "h.1.attn.c_attn.weight", 64, 192},
      {"blk.1.attn_output.weight", "h.1.attn.c_proj.weight", 64, 64},  // square: must transpose
      {"blk.1.ffn_up.weight", "h.1.mlp.c_fc.weight", 64, 256},
      {"blk.1.ffn_down.weight", "h.1.mlp.c_proj.weight", 256, 64},
  };
  for (const Conv& cv : convs) {
    auto t = src->Get(cv.gguf);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->type, GgmlType::kF32);
    EXPECT_EQ(t->ne, (std::vector<int64_t>{cv.in, cv.out}));
    ASSERT_EQ(t->nbytes, static_cast<size_t>(cv.in * cv.out * 4));
    const SafetensorsTensor* r = raw->Find(cv.hf);
    ASSERT_NE(r, nullptr);
    ASSERT_EQ(r->shape, (std::vector<int64_t>{cv.in, cv.out}));
    int mismatches = 0;
    for (int64_t i = 0; i < cv.in; ++i) {
      for (int64_t o = 0; o < cv.out; ++o) {
        mismatches += ReadF32(t->data, o * cv.in + i) != ReadF32(r->data, i * cv.out + o);
      }
    }
    EXPECT_EQ(mismatches, 0) << cv.gguf;
  }
  // The square c_proj is not symmetric, so forgetting the transpose would have been caught.
  auto t = src->Get("blk.0.attn_output.weight");
  const SafetensorsTensor* r = raw->Find("h.0.attn.c_proj.weight");
  ASSERT_TRUE(t.ok());
  EXPECT_NE(std::memcmp(t->data, r->data, r->nbytes), 0);

  // Rows of attn_qkv: q rows 0..63, k 64..127, v 128..191, each row is a c_attn column.
  auto qkv = src->Get("blk.0.attn_qkv.weight");
  const SafetensorsTensor* c_attn = raw->Find("h.0.attn.c_attn.weight");
  ASSERT_TRUE(qkv.ok());
  EXPECT_EQ(ReadF32(qkv->data, 130 * 64 + 5), ReadF32(c_attn->data, 5 * 192 + 130));

  // Plain tensors: views with the file's shape reversed.
  auto wpe = src->Get("position_embd.weight");
  ASSERT_TRUE(wpe.ok());
  EXPECT_EQ(wpe->ne, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(std::memcmp(wpe->data, raw->Find("wpe.weight")->data, wpe->nbytes), 0);
  auto bias = src->Get("blk.0.attn_qkv.bias");
  ASSERT_TRUE(bias.ok());
  EXPECT_EQ(bias->ne, (std::vector<int64_t>{192}));
  EXPECT_TRUE(src->Has("output_norm.bias"));
  EXPECT_FALSE(src->Has("blk.0.attn.bias"));  // buffers skipped
}

TEST_F(HfWeightSourceTest, Gpt2PrefixedF16WithLmHead) {
  auto src = Open("gpt2-tiny-lmhead-f16");
  auto f32 = Open("gpt2-tiny");
  ASSERT_NE(src, nullptr);
  ASSERT_NE(f32, nullptr);
  EXPECT_FALSE(src->Has("output.weight"));  // tied: lm_head.weight ignored
  auto e = src->Get("token_embd.weight");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->type, GgmlType::kF16);
  // Transposed F16 -> F32, equal to the F32 model's values rounded to F16.
  auto a = src->Get("blk.1.ffn_down.weight");
  auto b = f32->Get("blk.1.ffn_down.weight");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->type, GgmlType::kF32);
  ASSERT_EQ(a->ne, b->ne);
  int mismatches = 0;
  for (size_t i = 0; i < 256 * 64; ++i) {
    mismatches += ReadF32(a->data, i) != Fp16ToFloat(FloatToFp16(ReadF32(b->data, i)));
  }
  EXPECT_EQ(mismatches, 0);
  auto bias = src->Get("blk.1.ffn_down.bias");
  ASSERT_TRUE(bias.ok());
  EXPECT_EQ(bias->type, GgmlType::kF16);
  EXPECT_NEAR(ReadF16(bias->data, 3), ReadF32(f32->Get("blk.1.ffn_down.bias")->data, 3), 1e-3);
}

// The generated tokenizer.json through the C++ tokenizer gives the ids the Hugging Face
// `tokenizers` library recorded in tests/golden/hf/manifest.json.
TEST_F(HfWeightSourceTest, TokenizerMatchesHfTokenizers) {
  auto src = Open("gpt2-tiny");
  ASSERT_NE(src, nullptr);
  auto tok = Tokenizer::Create(src->tokenizer_data());
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::ifstream in("tests/golden/hf/manifest.json");
  ASSERT_TRUE(in) << "run from the source root";
  const nlohmann::json manifest = nlohmann::json::parse(in);
  for (const auto& c : manifest.at("tokenizer").at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    EXPECT_EQ((*tok)->Encode(text, /*parse_special=*/true, /*add_bos=*/false),
              c.at("ids").get<std::vector<int32_t>>())
        << text;
  }
}

// Qwen's NFC normalizer (qwen3-tiny-yarn's tokenizer.json): the normalized text and the ids
// are those of the `tokenizers` library (its own Unicode normalization); without the
// normalizer some ids differ, so the cases exercise it.
TEST_F(HfWeightSourceTest, NfcNormalizerMatchesHfTokenizers) {
  auto src = Open("qwen3-tiny-yarn");
  ASSERT_NE(src, nullptr);
  ASSERT_TRUE(src->tokenizer_data().normalize_nfc);
  auto tok = Tokenizer::Create(src->tokenizer_data());
  ASSERT_TRUE(tok.ok()) << tok.status();
  TokenizerData plain_data = src->tokenizer_data();
  plain_data.normalize_nfc = false;
  auto plain = Tokenizer::Create(std::move(plain_data));
  ASSERT_TRUE(plain.ok()) << plain.status();
  std::ifstream in("tests/golden/hf/manifest.json");
  ASSERT_TRUE(in) << "run from the source root";
  const nlohmann::json manifest = nlohmann::json::parse(in);
  int differ = 0;
  for (const auto& c : manifest.at("tokenizer_nfc").at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    std::string nfc;
    if (!NormalizeNfc(text, &nfc)) nfc = text;
    EXPECT_EQ(nfc, c.at("normalized").get<std::string>()) << text;
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ((*tok)->Encode(text, /*parse_special=*/true, /*add_bos=*/false), ids) << text;
    differ += (*plain)->Encode(text, true, false) != ids;
  }
  EXPECT_GE(differ, 6);
}

TEST_F(HfWeightSourceTest, Errors) {
  auto none = OpenHfWeightSource((ModelsDir() / "no-such-model").string());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("no-such-model"));

  // More layers than the file holds: the first missing tensor is named.
  fs::path dir = CopyWithConfig("llama-tiny", {{"num_hidden_layers", 3}});
  auto s = OpenHfWeightSource(dir.string());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr("model.layers.2."));

  // Fewer layers: layer 1's tensors are unexpected.
  dir = CopyWithConfig("llama-tiny", {{"num_hidden_layers", 1}});
  s = OpenHfWeightSource(dir.string());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("tensor 'model.layers.1."));

  // A shape that disagrees with the config.
  dir = CopyWithConfig("llama-tiny", {{"intermediate_size", 100}});
  s = OpenHfWeightSource(dir.string());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(),
              HasSubstr("'model.layers.0.mlp.down_proj.weight' ('blk.0.ffn_down.weight') has "
                        "shape [64, 96], the config needs [64, 100]"));

  // GPT-2 Conv1D shapes are checked in the file's [in, out] order: a c_fc weight stored in
  // nn.Linear layout [out, in] is rejected.
  dir = CopyWithConfig("gpt2-tiny", nlohmann::json::object());
  {
    auto raw = Raw("gpt2-tiny");
    ASSERT_NE(raw, nullptr);
    std::vector<testing::FloatTensor> tensors;
    for (const auto& [name, t] : raw->tensors()) {
      testing::FloatTensor ft{name, t.shape, std::vector<float>(t.NumElements())};
      std::memcpy(ft.values.data(), t.data, t.nbytes);
      if (name == "h.1.mlp.c_fc.weight") ft.shape = {256, 64};
      tensors.push_back(std::move(ft));
    }
    std::ofstream(dir / "model.safetensors", std::ios::binary | std::ios::trunc)
        << testing::MakeF32Safetensors(tensors);
  }
  s = OpenHfWeightSource(dir.string());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(),
              HasSubstr("'h.1.mlp.c_fc.weight' ('blk.1.ffn_up.weight') has shape [256, 64], "
                        "the config needs [64, 256]"));

  // Tied in the config while the file has lm_head.weight: transformers ignores it, so do we.
  dir = CopyWithConfig("llama-tiny", {{"tie_word_embeddings", true}});
  s = OpenHfWeightSource(dir.string());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE((*s)->Has("output.weight"));

  // No tokenizer.json.
  dir = CopyWithConfig("llama-tiny", nlohmann::json::object());
  fs::remove(dir / "tokenizer.json");
  s = OpenHfWeightSource(dir.string());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr("tokenizer.json"));

  // No config.json.
  dir = CopyWithConfig("llama-tiny", nlohmann::json::object());
  fs::remove(dir / "config.json");
  s = OpenHfWeightSource(dir.string());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr("config.json"));
}

}  // namespace
}  // namespace tinyserve
