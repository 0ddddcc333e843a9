#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/gguf/gguf_test_util.h"
#include "worker/model/weight_source.h"

namespace tinyserve {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing_gguf::GgufBuilder;
using testing_gguf::TinyLlama;
using testing_gguf::TinyLlamaOptions;

std::string WriteTemp(const std::string& name, const GgufBuilder& b) {
  const std::string path = ::testing::TempDir() + "/" + name;
  EXPECT_TRUE(testing_gguf::WriteFile(path, b.Build()));
  return path;
}

absl::StatusOr<std::unique_ptr<WeightSource>> OpenBuilt(const std::string& name,
                                                        const GgufBuilder& b) {
  return OpenGgufWeightSource(WriteTemp(name, b));
}

// Gives tensor `name` a new shape (and data of the matching size).
void Reshape(GgufBuilder& b, const std::string& name, std::vector<uint64_t> ne) {
  for (auto& t : b.tensors()) {
    if (t.name != name) continue;
    const GgmlTypeInfo* info = GetGgmlTypeInfo(t.type);
    uint64_t n = 1;
    for (uint64_t d : ne) n *= d;
    t.ne = std::move(ne);
    t.data.assign(n / info->block_size * info->block_bytes, 0);
    return;
  }
  ADD_FAILURE() << "no tensor " << name;
}

void ExpectOpenFails(const std::string& name, const GgufBuilder& b,
                     std::vector<std::string> parts) {
  auto r = OpenBuilt(name, b);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  for (const std::string& p : parts) EXPECT_THAT(std::string(r.status().message()), HasSubstr(p));
}

TEST(GgufWeightSourceTest, Stories260k) {
  auto r = OpenGgufWeightSource(Stories260kPath());
  ASSERT_TRUE(r.ok()) << r.status();
  const WeightSource& s = **r;
  const ModelConfig& c = s.config();
  EXPECT_EQ(c.arch, Arch::kLlama);
  EXPECT_EQ(c.name, "llama");
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.ffn_dim, 172);
  EXPECT_EQ(c.vocab_size, 512);     // from the token array: no llama.vocab_size
  EXPECT_EQ(c.max_context, 2048);   // the converter's default, as stored
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_EQ(c.rope_theta, 10000.0f);  // no llama.rope.freq_base
  EXPECT_EQ(c.rope_style, RopeStyle::kAdjacent);
  EXPECT_FALSE(c.tied_embeddings);  // an explicit output.weight (a copy of the embedding)

  const TokenizerData& t = s.tokenizer_data();
  EXPECT_EQ(t.model, "llama");
  ASSERT_EQ(t.tokens.size(), 512u);
  EXPECT_EQ(t.scores.size(), 512u);
  ASSERT_EQ(t.types.size(), 512u);
  EXPECT_EQ(t.types[0], TokenType::kUnknown);
  EXPECT_EQ(t.types[1], TokenType::kControl);
  EXPECT_EQ(t.types[2], TokenType::kControl);
  EXPECT_EQ(t.types[3], TokenType::kByte);
  EXPECT_EQ(t.types[258], TokenType::kByte);
  EXPECT_EQ(t.tokens[3], "<0x00>");
  EXPECT_EQ(t.bos_id, 1);
  EXPECT_EQ(t.eos_id, 2);
  EXPECT_EQ(t.unk_id, 0);
  EXPECT_EQ(t.pad_id, -1);  // stored as 0xFFFFFFFF
  EXPECT_TRUE(t.add_bos);
  EXPECT_TRUE(t.add_space_prefix);
  EXPECT_THAT(t.eog_ids, ElementsAre(2));
  EXPECT_TRUE(t.merges.empty());
  EXPECT_TRUE(t.chat_template.empty());

  auto q = s.Get("blk.1.attn_q.weight");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->type, GgmlType::kF32);
  EXPECT_EQ(q->ne, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(q->nbytes, 64u * 64u * 4u);
  ASSERT_NE(q->data, nullptr);
  EXPECT_TRUE(s.Has("output.weight"));
  EXPECT_FALSE(s.Has("blk.5.attn_q.weight"));
  auto missing = s.Get("blk.5.attn_q.weight");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("blk.5.attn_q.weight"));
  EXPECT_THAT(s.Describe(), HasSubstr("stories260K.gguf"));
}

TEST(GgufWeightSourceTest, SmolLm2) {
  const std::string path = DefaultModelPath();
  if (!FileExists(path)) GTEST_SKIP() << "no " << path;
  auto r = OpenWeightSource(path);
  ASSERT_TRUE(r.ok()) << r.status();
  const ModelConfig& c = (*r)->config();
  EXPECT_EQ(c.arch, Arch::kLlama);
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_EQ(c.dim, 576);
  EXPECT_EQ(c.n_heads, 9);
  EXPECT_EQ(c.n_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.ffn_dim, 1536);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_context, 8192);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_EQ(c.rope_theta, 100000.0f);
  EXPECT_EQ(c.rope_style, RopeStyle::kAdjacent);
  EXPECT_TRUE(c.tied_embeddings);

  const TokenizerData& t = (*r)->tokenizer_data();
  EXPECT_EQ(t.model, "gpt2");
  EXPECT_EQ(t.pre, "smollm");
  EXPECT_EQ(t.tokens.size(), 49152u);
  EXPECT_EQ(t.merges.size(), 48900u);
  EXPECT_EQ(t.merges[0], "Ġ t");
  EXPECT_EQ(t.tokens[198], "Ċ");
  EXPECT_EQ(t.bos_id, 1);
  EXPECT_EQ(t.eos_id, 2);
  EXPECT_EQ(t.unk_id, 0);
  EXPECT_EQ(t.pad_id, 2);
  EXPECT_EQ(t.types[16], TokenType::kControl);
  EXPECT_EQ(t.types[17], TokenType::kNormal);
  // eos <|im_end|> first, then <|endoftext|> (a CONTROL token llama.cpp also treats as EOG).
  EXPECT_THAT(t.eog_ids, ElementsAre(2, 0));
  EXPECT_THAT(t.chat_template, StartsWith("{% for message in messages %}"));
  EXPECT_THAT(t.chat_template, HasSubstr("You are a helpful AI assistant named SmolLM"));

  auto e = (*r)->Get("token_embd.weight");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->type, GgmlType::kQ8_0);
  EXPECT_EQ(e->ne, (std::vector<int64_t>{576, 49152}));
  auto k = (*r)->Get("blk.29.attn_k.weight");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->type, GgmlType::kQ4_1);
  EXPECT_EQ(k->ne, (std::vector<int64_t>{576, 192}));
  EXPECT_EQ(k->nbytes, 69120u);
}

TEST(GgufWeightSourceTest, TinyLlamaDefaultsAndEog) {
  TinyLlamaOptions o;
  o.with_freq_base = false;
  auto r = OpenBuilt("tiny_defaults.gguf", TinyLlama(o));
  ASSERT_TRUE(r.ok()) << r.status();
  const ModelConfig& c = (*r)->config();
  EXPECT_EQ(c.name, "tiny");
  EXPECT_EQ(c.dim, 32);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.vocab_size, 8);
  EXPECT_EQ(c.max_context, 128);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-6f);
  EXPECT_EQ(c.rope_theta, 10000.0f);
  EXPECT_TRUE(c.tied_embeddings);
  const TokenizerData& t = (*r)->tokenizer_data();
  EXPECT_EQ(t.pre, "default");
  EXPECT_EQ(t.pad_id, -1);
  // eos, then the CONTROL <|im_end|>; the NORMAL <|endoftext|> is not an end of generation.
  EXPECT_THAT(t.eog_ids, ElementsAre(2, 3));
  auto v = (*r)->Get("blk.1.attn_v.weight");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->type, GgmlType::kQ5_0);
  EXPECT_EQ(v->nbytes, 32u / 32 * 22 * 16);
}

TEST(GgufWeightSourceTest, UntiedAndExplicitValues) {
  TinyLlamaOptions o;
  o.with_output = true;
  o.with_vocab_size = true;
  GgufBuilder b = TinyLlama(o);
  b.AddU32("tokenizer.ggml.eot_token_id", 6);
  b.AddBool("tokenizer.ggml.add_bos_token", false);
  b.AddString("tokenizer.chat_template", "{{ x }}");
  auto r = OpenBuilt("tiny_untied.gguf", b);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE((*r)->config().tied_embeddings);
  EXPECT_EQ((*r)->config().rope_theta, 500000.0f);
  const TokenizerData& t = (*r)->tokenizer_data();
  EXPECT_FALSE(t.add_bos);
  EXPECT_TRUE(t.add_space_prefix);
  EXPECT_THAT(t.eog_ids, ElementsAre(2, 6, 3));
  EXPECT_EQ(t.chat_template, "{{ x }}");
}

TEST(GgufWeightSourceTest, Gpt2) {
  constexpr uint64_t kDim = 32, kFfn = 128, kVocab = 4, kCtx = 16;
  GgufBuilder b;
  b.AddString("general.architecture", "gpt2");
  b.AddU32("gpt2.context_length", kCtx);
  b.AddU32("gpt2.embedding_length", kDim);
  b.AddU32("gpt2.block_count", 1);
  b.AddU32("gpt2.feed_forward_length", kFfn);
  b.AddU32("gpt2.attention.head_count", 4);
  b.AddF32("gpt2.attention.layer_norm_epsilon", 1e-4f);
  b.AddString("tokenizer.ggml.model", "gpt2");
  b.AddString("tokenizer.ggml.pre", "gpt-2");
  b.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "ab", "<|endoftext|>"});
  b.AddArray<int32_t>("tokenizer.ggml.token_type", GgufValueType::kI32, {1, 1, 1, 3});
  b.AddStringArray("tokenizer.ggml.merges", {"a b"});
  b.AddU32("tokenizer.ggml.bos_token_id", 3);
  b.AddU32("tokenizer.ggml.eos_token_id", 3);
  b.AddTensor("token_embd.weight", GgmlType::kF16, {kDim, kVocab});
  b.AddTensor("position_embd.weight", GgmlType::kF32, {kDim, kCtx});
  b.AddTensor("output_norm.weight", GgmlType::kF32, {kDim});
  b.AddTensor("output_norm.bias", GgmlType::kF32, {kDim});
  b.AddTensor("output.weight", GgmlType::kF16, {kDim, kVocab});
  for (const char* n : {"attn_norm", "ffn_norm"}) {
    b.AddTensor(std::string("blk.0.") + n + ".weight", GgmlType::kF32, {kDim});
    b.AddTensor(std::string("blk.0.") + n + ".bias", GgmlType::kF32, {kDim});
  }
  b.AddTensor("blk.0.attn_qkv.weight", GgmlType::kQ8_0, {kDim, 3 * kDim});
  b.AddTensor("blk.0.attn_qkv.bias", GgmlType::kF32, {3 * kDim});
  b.AddTensor("blk.0.attn_output.weight", GgmlType::kQ8_0, {kDim, kDim});
  b.AddTensor("blk.0.attn_output.bias", GgmlType::kF32, {kDim});
  b.AddTensor("blk.0.ffn_up.weight", GgmlType::kQ8_0, {kDim, kFfn});
  b.AddTensor("blk.0.ffn_up.bias", GgmlType::kF32, {kFfn});
  b.AddTensor("blk.0.ffn_down.weight", GgmlType::kQ8_0, {kFfn, kDim});
  b.AddTensor("blk.0.ffn_down.bias", GgmlType::kF32, {kDim});
  auto r = OpenBuilt("tiny_gpt2.gguf", b);
  ASSERT_TRUE(r.ok()) << r.status();
  const ModelConfig& c = (*r)->config();
  EXPECT_EQ(c.arch, Arch::kGpt2);
  EXPECT_EQ(c.rope_style, RopeStyle::kNone);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-4f);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.ffn_dim, 128);
  EXPECT_EQ(c.max_context, 16);
  EXPECT_FALSE(c.tied_embeddings);
  const TokenizerData& t = (*r)->tokenizer_data();
  EXPECT_FALSE(t.add_bos);
  EXPECT_FALSE(t.add_space_prefix);
  EXPECT_EQ(t.pre, "gpt-2");
  EXPECT_THAT(t.eog_ids, ElementsAre(3));

  // A transposed (Conv1D-shaped) attn_qkv is caught at open.
  Reshape(b, "blk.0.attn_qkv.weight", {3 * kDim, kDim});
  ExpectOpenFails("tiny_gpt2_bad.gguf", b,
                  {"blk.0.attn_qkv.weight", "[96, 32]", "[32, 96]"});
}

TEST(GgufWeightSourceTest, UnknownArchitecture) {
  TinyLlamaOptions o;
  o.arch = "mamba";
  ExpectOpenFails("tiny_mamba.gguf", TinyLlama(o), {"architecture", "'mamba'"});
}

TEST(GgufWeightSourceTest, Qwen2IsALlamaWithBiasesAndRotateHalfRope) {
  TinyLlamaOptions o;
  o.arch = "qwen2";
  GgufBuilder b = TinyLlama(o);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    b.AddTensor(p + "attn_q.bias", GgmlType::kF32, {32});
    b.AddTensor(p + "attn_k.bias", GgmlType::kF32, {16});
    b.AddTensor(p + "attn_v.bias", GgmlType::kF32, {16});
  }
  auto r = OpenBuilt("tiny_qwen2.gguf", b);
  ASSERT_TRUE(r.ok()) << r.status();
  const ModelConfig& c = (*r)->config();
  EXPECT_EQ(c.arch, Arch::kLlama);
  EXPECT_EQ(ArchName(c), "qwen2");
  EXPECT_EQ(c.rope_style, RopeStyle::kRotateHalf);
  EXPECT_EQ(c.rope_theta, 500000.0f);

  Reshape(b, "blk.1.attn_k.bias", {32});
  ExpectOpenFails("tiny_qwen2_bad_bias.gguf", b, {"blk.1.attn_k.bias", "[32]", "[16]"});
}

TEST(GgufWeightSourceTest, Gemma3SlidingLayersPostNormsAndGeGlu) {
  TinyLlamaOptions o;
  o.arch = "gemma3";
  GgufBuilder b = TinyLlama(o);
  // Without the window (or a post-norm) the file is refused by name.
  ExpectOpenFails("tiny_gemma3_no_window.gguf", b, {"gemma3.attention.sliding_window"});
  b.AddU32("gemma3.attention.sliding_window", 512);
  ExpectOpenFails("tiny_gemma3_no_qnorm.gguf", b, {"blk.0.attn_q_norm.weight", "missing"});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    b.AddTensor(p + "attn_q_norm.weight", GgmlType::kF32, {8});
    b.AddTensor(p + "attn_k_norm.weight", GgmlType::kF32, {8});
    b.AddTensor(p + "post_attention_norm.weight", GgmlType::kF32, {32});
    if (l == 0) ExpectOpenFails("tiny_gemma3_no_post_ffw.gguf", b, {"blk.0.post_ffw_norm.weight"});
    b.AddTensor(p + "post_ffw_norm.weight", GgmlType::kF32, {32});
  }
  auto r = OpenBuilt("tiny_gemma3.gguf", b);
  ASSERT_TRUE(r.ok()) << r.status();
  const ModelConfig& c = (*r)->config();
  EXPECT_EQ(ArchName(c), "gemma3");
  EXPECT_EQ(c.rope_style, RopeStyle::kRotateHalf);
  EXPECT_TRUE(c.qk_norm && c.post_norms && c.gelu_gate);
  EXPECT_FLOAT_EQ(c.embed_scale, std::sqrt(32.0f));
  EXPECT_FLOAT_EQ(c.AttentionScale(), 1.0f / std::sqrt(8.0f));
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_THAT(c.swa_layers, ElementsAre(true, true));  // every sixth layer is global
  EXPECT_TRUE(c.SlidingLayer(1));
  EXPECT_FALSE(c.SlidingLayer(2));
  EXPECT_EQ(c.rope_theta, 500000.0f);     // the global layers'
  EXPECT_EQ(c.rope_theta_swa, 10000.0f);  // the sliding layers'

  b.AddF32("gemma3.final_logit_softcapping", 30.0f);
  ExpectOpenFails("tiny_gemma3_softcap.gguf", b, {"gemma3.final_logit_softcapping"});
}

TEST(GgufWeightSourceTest, RopeScaling) {
  {
    GgufBuilder b = TinyLlama();
    b.AddString("llama.rope.scaling.type", "linear");
    b.AddF32("llama.rope.scaling.factor", 4.0f);
    std::vector<uint8_t> factors(4 * sizeof(float));
    const float f[4] = {1.0f, 1.5f, 2.0f, 8.0f};
    std::memcpy(factors.data(), f, sizeof(f));
    b.AddTensor("rope_freqs.weight", GgmlType::kF32, {4}, factors);
    auto r = OpenBuilt("tiny_rope_linear.gguf", b);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FLOAT_EQ((*r)->config().rope_freq_scale, 0.25f);
    EXPECT_THAT((*r)->config().rope_freq_factors, ElementsAre(1.0f, 1.5f, 2.0f, 8.0f));
  }
  {
    // YaRN as llama.cpp's converter writes it for Qwen2.5 / Qwen3; the divisors and attention
    // factor are what transformers 5.25's _compute_yarn_parameters gives for head_dim 8, theta
    // 500000, factor 4 over 256 (a GGUF attn_factor multiplies the latter, as in llama.cpp).
    GgufBuilder b = TinyLlama();
    b.AddString("llama.rope.scaling.type", "yarn");
    b.AddF32("llama.rope.scaling.factor", 4.0f);
    b.AddU32("llama.rope.scaling.original_context_length", 256);
    b.AddF32("llama.rope.scaling.attn_factor", 2.0f);
    auto r = OpenBuilt("tiny_rope_yarn.gguf", b);
    ASSERT_TRUE(r.ok()) << r.status();
    const ModelConfig& c = (*r)->config();
    EXPECT_FLOAT_EQ(c.rope_freq_scale, 1.0f);
    EXPECT_THAT(c.rope_freq_factors, ElementsAre(1.0f, 1.6f, 4.0f, 4.0f));
    EXPECT_NEAR(c.rope_attn_factor, 2 * 1.138629436, 1e-6);
    EXPECT_EQ(c.max_context, 1024);  // 256 x 4 (the file says 128)
  }
  {
    GgufBuilder b = TinyLlama();
    b.AddString("llama.rope.scaling.type", "yarn");
    b.AddF32("llama.rope.scaling.factor", 4.0f);
    b.AddF32("llama.rope.scaling.yarn_ext_factor", 0.5f);
    ExpectOpenFails("tiny_rope_yarn_ext.gguf", b, {"llama.rope.scaling.yarn_ext_factor", "0.5"});
  }
  {
    GgufBuilder b = TinyLlama();
    b.AddString("llama.rope.scaling.type", "longrope");
    ExpectOpenFails("tiny_rope_longrope.gguf", b, {"llama.rope.scaling.type", "'longrope'"});
  }
  {
    GgufBuilder b = TinyLlama();
    b.AddTensor("rope_freqs.weight", GgmlType::kF32, {4});  // zeros
    ExpectOpenFails("tiny_rope_zero.gguf", b, {"rope_freqs.weight", "positive"});
  }
}

TEST(GgufWeightSourceTest, ShapesTinyServeDoesNotRunAreRefused) {
  {
    GgufBuilder b = TinyLlama();
    b.AddU32("llama.rope.dimension_count", 4);  // partial RoPE (head size 8)
    ExpectOpenFails("tiny_partial_rope.gguf", b, {"llama.rope.dimension_count", "4"});
  }
  {
    GgufBuilder b = TinyLlama();
    b.AddU32("llama.attention.value_length", 16);  // K heads of 8
    ExpectOpenFails("tiny_value_length.gguf", b, {"llama.attention.value_length", "16"});
  }
  {
    // Heads of 16 over a hidden size of 32 (Qwen3's shape): the projections follow.
    GgufBuilder b = TinyLlama();
    b.AddU32("llama.attention.key_length", 16);
    ExpectOpenFails("tiny_key_length.gguf", b, {"blk.0.attn_q.weight", "[32, 64]"});
    for (int l = 0; l < 2; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      Reshape(b, p + "attn_q.weight", {32, 64});
      Reshape(b, p + "attn_k.weight", {32, 32});
      Reshape(b, p + "attn_v.weight", {32, 32});
      Reshape(b, p + "attn_output.weight", {64, 32});
    }
    auto r = OpenBuilt("tiny_key_length_ok.gguf", b);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)->config().head_dim, 16);
  }
  {
    GgufBuilder b = TinyLlama();
    b.AddU32("llama.rope.dimension_count", 8);  // equal to the head size: fine
    b.AddU32("llama.attention.value_length", 8);
    EXPECT_TRUE(OpenBuilt("tiny_full_rope.gguf", b).ok());
  }
}

// This process's resident memory, from /proc/self/statm.
int64_t RssBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

TEST(GgufWeightSourceTest, DropPagesReleasesACopiedTensor) {
  GgufBuilder b = TinyLlama();
  constexpr int64_t kCols = 1024, kRows = 8192;  // 32 MiB of F32
  b.AddTensor("big.weight", GgmlType::kF32, {kCols, kRows});
  auto r = OpenBuilt("tiny_big.gguf", b);
  ASSERT_TRUE(r.ok()) << r.status();
  auto t = (*r)->Get("big.weight");
  ASSERT_TRUE(t.ok());
  volatile uint64_t sum = 0;
  for (size_t i = 0; i < t->nbytes; i += 4096) sum = sum + t->data[i];  // fault every page in
  const int64_t before = RssBytes();
  (*r)->DropPages(t->data, t->nbytes);
  const int64_t after = RssBytes();
  EXPECT_GT(before - after, static_cast<int64_t>(t->nbytes) * 9 / 10)
      << "RSS " << before << " -> " << after;
  // The bytes read back the same (from the file).
  for (size_t i = 0; i < t->nbytes; i += 4096) EXPECT_EQ(t->data[i], 0) << i;
  // Memory the source does not map is never touched.
  std::vector<uint8_t> heap(1 << 20, 7);
  (*r)->DropPages(heap.data(), heap.size());
  EXPECT_EQ(heap[12345], 7);
}

TEST(GgufWeightSourceTest, ShapeMismatchNamesTensorAndShapes) {
  GgufBuilder b = TinyLlama();
  Reshape(b, "blk.1.attn_q.weight", {32, 64});
  ExpectOpenFails("tiny_bad_q.gguf", b, {"blk.1.attn_q.weight", "[32, 64]", "[32, 32]"});
}

TEST(GgufWeightSourceTest, MissingTensor) {
  GgufBuilder b = TinyLlama();
  auto& ts = b.tensors();
  ts.erase(std::remove_if(ts.begin(), ts.end(),
                          [](const auto& t) { return t.name == "blk.0.ffn_down.weight"; }),
           ts.end());
  ExpectOpenFails("tiny_missing.gguf", b, {"blk.0.ffn_down.weight", "missing"});
}

TEST(GgufWeightSourceTest, MissingRequiredKey) {
  GgufBuilder b;
  b.AddString("general.architecture", "llama");
  b.AddString("tokenizer.ggml.model", "llama");
  b.AddStringArray("tokenizer.ggml.tokens", {"a"});
  ExpectOpenFails("tiny_nokeys.gguf", b, {"llama.block_count"});
}

TEST(GgufWeightSourceTest, BadValues) {
  {
    GgufBuilder b = TinyLlama();
    b.AddU32("tokenizer.ggml.eot_token_id", 8);  // one past the vocabulary
    ExpectOpenFails("tiny_bad_eot.gguf", b, {"tokenizer.ggml.eot_token_id", "8"});
  }
  {
    GgufBuilder b = TinyLlama();
    b.AddU32("llama.vocab_size", 9);
    ExpectOpenFails("tiny_bad_vocab.gguf", b, {"llama.vocab_size", "9"});
  }
  {
    GgufBuilder b = TinyLlama();
    b.AddString("tokenizer.ggml.add_bos_token", "yes");
    ExpectOpenFails("tiny_bad_bos.gguf", b, {"tokenizer.ggml.add_bos_token", "bool"});
  }
  {
    TinyLlamaOptions o;
    GgufBuilder b = TinyLlama(o);
    b.AddU32("llama.attention.head_count_kv", 3);  // duplicate key: a parse error
    ExpectOpenFails("tiny_dup.gguf", b, {"duplicate key"});
  }
}

TEST(OpenWeightSourceTest, MissingPathIsNotFound) {
  auto r = OpenWeightSource("/no/such/model.gguf");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("/no/such/model.gguf"));
}

TEST(OpenWeightSourceTest, FileIsGguf) {
  auto r = OpenWeightSource(Stories260kPath());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT((*r)->Describe(), StartsWith("gguf"));
}

TEST(OpenWeightSourceTest, DirectoryGoesToHuggingFaceReader) {
  const std::string dir = ::testing::TempDir() + "/hf_dir_for_test";
  ::mkdir(dir.c_str(), 0755);
  auto r = OpenWeightSource(dir);
  ASSERT_FALSE(r.ok());  // an empty folder is no checkpoint
  if (r.status().code() != absl::StatusCode::kUnimplemented)
    GTEST_SKIP() << "worker/hf is built: " << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(dir));
}

}  // namespace
}  // namespace tinyserve
