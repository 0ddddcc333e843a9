#include "worker/hf/hf_config.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tinyserve {
namespace {

using ::testing::HasSubstr;

constexpr char kLlama[] = R"({
  "model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30,
  "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
  "vocab_size": 49152, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05,
  "rope_theta": 100000, "rope_scaling": null, "tie_word_embeddings": true,
  "hidden_act": "silu"
})";

constexpr char kGpt2[] = R"({
  "model_type": "gpt2", "n_embd": 1024, "n_layer": 24, "n_head": 16, "n_inner": null,
  "n_positions": 1024, "n_ctx": 1024, "layer_norm_epsilon": 1e-05, "vocab_size": 50257,
  "activation_function": "gelu_new"
})";

// kLlama or kGpt2 with one field replaced (or removed when value is empty).
std::string With(const char* base, const std::string& key, const std::string& value) {
  auto doc = nlohmann::json::parse(base);
  if (value.empty()) {
    doc.erase(key);
  } else {
    doc[key] = nlohmann::json::parse(value);
  }
  return doc.dump();
}

TEST(HfConfigTest, LlamaSmolLM2) {
  auto c = ParseHfConfig(kLlama, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Arch::kLlama);
  EXPECT_EQ(c->dim, 576);
  EXPECT_EQ(c->n_layers, 30);
  EXPECT_EQ(c->n_heads, 9);
  EXPECT_EQ(c->n_kv_heads, 3);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->ffn_dim, 1536);
  EXPECT_EQ(c->vocab_size, 49152);
  EXPECT_EQ(c->max_context, 8192);
  EXPECT_FLOAT_EQ(c->norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c->rope_theta, 100000.0f);
  EXPECT_EQ(c->rope_style, RopeStyle::kRotateHalf);
  EXPECT_TRUE(c->tied_embeddings);
}

TEST(HfConfigTest, LlamaDefaults) {
  std::string text = With(kLlama, "num_key_value_heads", "");
  text = With(text.c_str(), "rope_theta", "");
  text = With(text.c_str(), "tie_word_embeddings", "");
  text = With(text.c_str(), "hidden_act", "");
  auto c = ParseHfConfig(text, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_kv_heads, 9);
  EXPECT_FLOAT_EQ(c->rope_theta, 10000.0f);
  EXPECT_FALSE(c->tied_embeddings);  // transformers' LlamaConfig default

  c = ParseHfConfig(With(kLlama, "head_dim", "32"), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 32);
}

TEST(HfConfigTest, LlamaRopeParameters) {
  // transformers 5 writes rope_parameters instead of rope_theta.
  auto c = ParseHfConfig(
      With(kLlama, "rope_parameters", R"({"rope_type": "default", "rope_theta": 500000.0})"),
      "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);

  c = ParseHfConfig(With(kLlama, "rope_parameters", R"({"rope_type": "dynamic", "factor": 4})"),
                    "config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(c.status().message(), HasSubstr("field 'rope_parameters'"));
}

// YaRN against the divisors and attention factors transformers 5.25's _compute_yarn_parameters
// gives for the same settings (base inv_freq / yarn inv_freq, printed there).
TEST(HfConfigTest, RopeScalingYarn) {
  // Qwen3-0.6B's shape with its model card's setting for 128K.
  std::string qwen3 = With(kLlama, "model_type", R"("qwen3")");
  qwen3 = With(qwen3.c_str(), "head_dim", "128");
  qwen3 = With(qwen3.c_str(), "max_position_embeddings", "40960");
  auto c = ParseHfConfig(With(qwen3.c_str(), "rope_parameters",
                              R"({"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
               "original_max_position_embeddings": 32768})"),
                         "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->rope_freq_factors.size(), 64u);
  EXPECT_FLOAT_EQ(c->rope_freq_scale, 1.0f);
  EXPECT_NEAR(c->rope_attn_factor, 1.138629436, 1e-6);
  const std::vector<std::pair<int, float>> want = {{0, 1.0f},       {23, 1.0f},   {24, 1.046154f},
                                                   {30, 1.446809f}, {35, 2.125f}, {39, 3.4f},
                                                   {40, 4.0f},      {63, 4.0f}};
  for (const auto& [i, f] : want) EXPECT_NEAR(c->rope_freq_factors[i], f, 2e-6 * f) << i;
  EXPECT_EQ(c->max_context, 131072);  // 32768 x 4, as vLLM derives it

  // The same in rope_scaling ("type" spelling); DeepSeek's mscale / mscale_all_dim and betas.
  auto d = ParseHfConfig(With(With(kLlama, "rope_theta", "10000").c_str(), "rope_scaling",
                              R"({"type": "yarn", "factor": 8.0, "beta_fast": 16,
                                  "beta_slow": 2, "mscale": 1.0, "mscale_all_dim": 0.5,
                                  "original_max_position_embeddings": 1024})"),
                         "config.json");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->rope_freq_factors.size(), 32u);  // kLlama: head_dim 64
  EXPECT_NEAR(d->rope_attn_factor, 1.094179988, 1e-6);
  const std::vector<std::pair<int, float>> want2 = {
      {8, 1.0f}, {9, 1.122807f}, {12, 1.777778f}, {15, 4.266666f}, {16, 8.0f}, {31, 8.0f}};
  for (const auto& [i, f] : want2) EXPECT_NEAR(d->rope_freq_factors[i], f, 2e-6 * f) << i;

  // An explicit attention_factor wins; a wrong field is named.
  auto e = ParseHfConfig(With(kLlama, "rope_scaling",
                              R"({"rope_type": "yarn", "factor": 2, "attention_factor": 1.5})"),
                         "config.json");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_FLOAT_EQ(e->rope_attn_factor, 1.5f);
  e = ParseHfConfig(With(kLlama, "rope_scaling", R"({"rope_type": "yarn", "factor": -2})"),
                    "config.json");
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(e.status().message(), HasSubstr("factor"));
}

TEST(HfConfigTest, RopeScaling) {
  auto c = ParseHfConfig(With(kLlama, "rope_scaling", R"({"type": "linear", "factor": 2.0})"),
                         "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->rope_freq_scale, 0.5f);
  EXPECT_TRUE(c->rope_freq_factors.empty());

  // Llama 3.2's: head_dim 64, theta 500000. Wavelengths under 8192 / 4 keep their frequency,
  // those over 8192 / 1 are divided by 8, the ones between interpolated.
  c = ParseHfConfig(With(With(kLlama, "rope_theta", "500000").c_str(), "rope_scaling",
                         R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"),
                    "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->rope_freq_factors.size(), 32u);
  EXPECT_FLOAT_EQ(c->rope_freq_scale, 1.0f);
  int ones = 0, eights = 0;
  float prev = 0;
  for (int i = 0; i < 32; ++i) {
    const double wavelen = 2 * M_PI * std::pow(500000.0, 2.0 * i / 64);
    const float f = c->rope_freq_factors[i];
    if (wavelen < 2048) {
      EXPECT_EQ(f, 1.0f) << i;
    }
    if (wavelen > 8192) {
      EXPECT_EQ(f, 8.0f) << i;
    }
    EXPECT_GE(f, prev) << i;  // monotone in the wavelength
    prev = f;
    ones += f == 1.0f;
    eights += f == 8.0f;
  }
  EXPECT_GT(ones, 0);
  EXPECT_GT(eights, 0);
  EXPECT_GT(32 - ones - eights, 0);  // some interpolated

  // transformers 5 keeps the same fields in rope_parameters.
  auto p = ParseHfConfig(
      With(kLlama, "rope_parameters",
           R"({"rope_type": "llama3", "rope_theta": 500000, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"),
      "config.json");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->rope_freq_factors, c->rope_freq_factors);

  c = ParseHfConfig(With(kLlama, "rope_scaling", R"({"rope_type": "llama3"})"), "config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("factor"));
}

TEST(HfConfigTest, Qwen2AndQwen3) {
  auto c = ParseHfConfig(With(kLlama, "model_type", R"("qwen2")"), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Arch::kLlama);
  EXPECT_EQ(c->variant, "qwen2");
  EXPECT_EQ(c->rope_style, RopeStyle::kRotateHalf);
  EXPECT_FALSE(c->qk_norm);
  // Qwen3-0.6B's heads: 16 of 128 over a hidden size of 1,024.
  c = ParseHfConfig(With(With(kLlama, "model_type", R"("qwen3")").c_str(), "head_dim", "128"),
                    "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->variant, "qwen3");
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->head_dim, 128);
  c = ParseHfConfig(
      With(With(kLlama, "model_type", R"("qwen2")").c_str(), "use_sliding_window", "true"),
      "config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(c.status().message(), HasSubstr("use_sliding_window"));
}

// google/gemma-3-270m's config.json (transformers 4.5x style: rope_theta for the full layers,
// rope_local_base_freq for the sliding ones).
constexpr char kGemma3[] = R"({
  "architectures": ["Gemma3ForCausalLM"], "_sliding_window_pattern": 6,
  "attention_bias": false, "attn_logit_softcapping": null, "final_logit_softcapping": null,
  "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640,
  "intermediate_size": 2048, "max_position_embeddings": 32768, "model_type": "gemma3_text",
  "num_attention_heads": 4, "num_hidden_layers": 18, "num_key_value_heads": 1,
  "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
  "rope_scaling": null, "rope_theta": 1000000.0, "sliding_window": 512,
  "use_bidirectional_attention": false, "vocab_size": 262144
})";

TEST(HfConfigTest, Gemma3) {
  auto c = ParseHfConfig(kGemma3, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->variant, "gemma3");
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_TRUE(c->qk_norm && c->post_norms && c->gelu_gate && c->tied_embeddings);
  EXPECT_FLOAT_EQ(c->embed_scale, std::sqrt(640.0f));
  EXPECT_FLOAT_EQ(c->AttentionScale(), 1.0f / 16);
  EXPECT_EQ(c->sliding_window, 512);
  ASSERT_EQ(c->swa_layers.size(), 18u);
  for (int l = 0; l < 18; ++l) EXPECT_EQ(c->swa_layers[l], l % 6 != 5) << l;
  EXPECT_EQ(c->rope_theta, 1e6f);
  EXPECT_EQ(c->rope_theta_swa, 1e4f);
  EXPECT_EQ(c->rope_freq_scale, 1.0f);

  // transformers 5: layer_types and rope_parameters per kind; scaling on the full layers only.
  std::string v5 = With(kGemma3, "layer_types", R"(["sliding_attention", "full_attention",
      "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
      "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
      "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
      "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"])");
  v5 = With(v5.c_str(), "rope_parameters", R"({
      "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
      "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}})");
  c = ParseHfConfig(With(v5.c_str(), "query_pre_attn_scalar", "64"), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->swa_layers[0] && !c->swa_layers[1] && c->swa_layers[5] && !c->swa_layers[17]);
  EXPECT_EQ(c->rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c->rope_freq_scale, 1.0f / 8);
  EXPECT_EQ(c->rope_theta_swa, 2e4f);
  EXPECT_FLOAT_EQ(c->AttentionScale(), 1.0f / 8);

  for (const auto& [key, value] :
       {std::pair{"final_logit_softcapping", "30.0"}, std::pair{"attn_logit_softcapping", "50.0"},
        std::pair{"use_bidirectional_attention", "true"},
        std::pair{"hidden_activation", R"("gelu")"}}) {
    c = ParseHfConfig(With(kGemma3, key, value), "config.json");
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << key;
    EXPECT_THAT(c.status().message(), HasSubstr(key));
  }
  c = ParseHfConfig(With(kGemma3, "layer_types", R"(["full_attention"])"), "config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("layer_types"));
  c = ParseHfConfig(With(kGemma3, "sliding_window", ""), "config.json");
  EXPECT_THAT(c.status().message(), HasSubstr("sliding_window"));
}

TEST(HfConfigTest, LlamaUnsupported) {
  auto c = ParseHfConfig(With(kLlama, "rope_scaling", R"({"type": "dynamic", "factor": 2.0})"),
                         "config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(c.status().message(), HasSubstr("'config.json': field 'rope_scaling'"));

  c = ParseHfConfig(With(kLlama, "hidden_act", R"("gelu")"), "config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(c.status().message(), HasSubstr("hidden_act"));

  c = ParseHfConfig(With(kLlama, "mlp_bias", "true"), "config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);

  c = ParseHfConfig(With(kLlama, "model_type", R"("mixtral")"), "config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(c.status().message(), HasSubstr("model_type 'mixtral'"));
}

TEST(HfConfigTest, LlamaInvalid) {
  auto c = ParseHfConfig(With(kLlama, "hidden_size", ""), "x/config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(),
              HasSubstr("config 'x/config.json': field 'hidden_size' is missing"));

  c = ParseHfConfig(With(kLlama, "num_hidden_layers", R"("30")"), "config.json");
  EXPECT_THAT(c.status().message(),
              HasSubstr("field 'num_hidden_layers' = \"30\" is not a positive integer"));

  c = ParseHfConfig(With(kLlama, "num_key_value_heads", "4"), "config.json");
  EXPECT_THAT(c.status().message(), HasSubstr("'num_key_value_heads' = 4 is not a divisor"));

  c = ParseHfConfig(With(kLlama, "rms_norm_eps", "-1"), "config.json");
  EXPECT_THAT(c.status().message(), HasSubstr("'rms_norm_eps' = -1 is not a positive number"));

  c = ParseHfConfig("not json", "config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);

  c = ParseHfConfig(With(kLlama, "model_type", ""), "config.json");
  EXPECT_THAT(c.status().message(), HasSubstr("field 'model_type' is missing"));
}

TEST(HfConfigTest, Gpt2Medium) {
  auto c = ParseHfConfig(kGpt2, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Arch::kGpt2);
  EXPECT_EQ(c->dim, 1024);
  EXPECT_EQ(c->n_layers, 24);
  EXPECT_EQ(c->n_heads, 16);
  EXPECT_EQ(c->n_kv_heads, 16);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->ffn_dim, 4096);  // n_inner null -> 4 * n_embd
  EXPECT_EQ(c->vocab_size, 50257);
  EXPECT_EQ(c->max_context, 1024);
  EXPECT_EQ(c->rope_style, RopeStyle::kNone);
  EXPECT_TRUE(c->tied_embeddings);

  c = ParseHfConfig(With(kGpt2, "n_inner", "3000"), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ffn_dim, 3000);
  c = ParseHfConfig(With(kGpt2, "activation_function", R"("gelu_pytorch_tanh")"), "config.json");
  EXPECT_TRUE(c.ok()) << c.status();
}

TEST(HfConfigTest, Gpt2Unsupported) {
  auto c = ParseHfConfig(With(kGpt2, "activation_function", R"("relu")"), "config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(c.status().message(), HasSubstr("field 'activation_function' = \"relu\""));

  c = ParseHfConfig(With(kGpt2, "scale_attn_by_inverse_layer_idx", "true"), "config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);

  c = ParseHfConfig(With(kGpt2, "n_head", "15"), "config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("'n_head' = 15 is not a divisor of n_embd"));
}

TEST(HfConfigTest, ReadMissingFile) {
  auto c = ReadHfConfig("/nonexistent/config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("/nonexistent/config.json"));
}

}  // namespace
}  // namespace tinyserve
