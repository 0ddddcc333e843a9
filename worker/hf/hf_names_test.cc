#include "worker/hf/hf_names.h"

#include "gtest/gtest.h"

namespace tinyserve {
namespace {

using Action = HfNameMapping::Action;

void ExpectMap(Arch arch, bool tied, const char* hf, const char* gguf, bool transpose) {
  const HfNameMapping m = MapHfTensorName(arch, tied, hf);
  EXPECT_EQ(m.action, Action::kMap) << hf;
  EXPECT_EQ(m.gguf_name, gguf) << hf;
  EXPECT_EQ(m.transpose, transpose) << hf;
}

TEST(HfNamesTest, Gemma3LayerNorms) {
  auto gemma = [](const char* hf) { return MapHfTensorName(Arch::kLlama, true, hf, true); };
  EXPECT_EQ(gemma("model.layers.2.post_attention_layernorm.weight").gguf_name,
            "blk.2.post_attention_norm.weight");
  EXPECT_EQ(gemma("model.layers.2.pre_feedforward_layernorm.weight").gguf_name,
            "blk.2.ffn_norm.weight");
  EXPECT_EQ(gemma("model.layers.2.post_feedforward_layernorm.weight").gguf_name,
            "blk.2.post_ffw_norm.weight");
  EXPECT_EQ(gemma("model.layers.2.self_attn.q_norm.weight").gguf_name, "blk.2.attn_q_norm.weight");
  EXPECT_EQ(gemma("model.layers.2.mlp.gate_proj.weight").gguf_name, "blk.2.ffn_gate.weight");
  EXPECT_EQ(gemma("model.layers.2.self_attn.q_proj.bias").action, Action::kUnknown);
  EXPECT_EQ(HfNameForGguf(Arch::kLlama, "blk.4.ffn_norm.weight", true),
            "model.layers.4.pre_feedforward_layernorm.weight");
  EXPECT_EQ(HfNameForGguf(Arch::kLlama, "blk.4.ffn_norm.weight"),
            "model.layers.4.post_attention_layernorm.weight");
}

TEST(HfNamesTest, Llama) {
  ExpectMap(Arch::kLlama, false, "model.embed_tokens.weight", "token_embd.weight", false);
  ExpectMap(Arch::kLlama, false, "model.norm.weight", "output_norm.weight", false);
  ExpectMap(Arch::kLlama, false, "lm_head.weight", "output.weight", false);
  ExpectMap(Arch::kLlama, false, "model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight",
            false);
  ExpectMap(Arch::kLlama, false, "model.layers.12.self_attn.q_proj.weight", "blk.12.attn_q.weight",
            false);
  ExpectMap(Arch::kLlama, false, "model.layers.3.self_attn.k_proj.weight", "blk.3.attn_k.weight",
            false);
  ExpectMap(Arch::kLlama, false, "model.layers.3.self_attn.v_proj.weight", "blk.3.attn_v.weight",
            false);
  ExpectMap(Arch::kLlama, false, "model.layers.3.self_attn.o_proj.weight",
            "blk.3.attn_output.weight", false);
  ExpectMap(Arch::kLlama, false, "model.layers.3.post_attention_layernorm.weight",
            "blk.3.ffn_norm.weight", false);
  ExpectMap(Arch::kLlama, false, "model.layers.3.mlp.gate_proj.weight", "blk.3.ffn_gate.weight",
            false);
  ExpectMap(Arch::kLlama, false, "model.layers.3.mlp.up_proj.weight", "blk.3.ffn_up.weight", false);
  ExpectMap(Arch::kLlama, false, "model.layers.3.mlp.down_proj.weight", "blk.3.ffn_down.weight",
            false);

  EXPECT_EQ(MapHfTensorName(Arch::kLlama, true, "lm_head.weight").action, Action::kSkip);
  EXPECT_EQ(
      MapHfTensorName(Arch::kLlama, false, "model.layers.0.self_attn.rotary_emb.inv_freq").action,
      Action::kSkip);
  ExpectMap(Arch::kLlama, false, "model.layers.0.self_attn.q_proj.bias", "blk.0.attn_q.bias",
            false);  // Qwen2, and Llama with attention_bias
  ExpectMap(Arch::kLlama, false, "model.layers.1.self_attn.o_proj.bias", "blk.1.attn_output.bias",
            false);
  ExpectMap(Arch::kLlama, false, "model.layers.2.self_attn.q_norm.weight",
            "blk.2.attn_q_norm.weight", false);  // Qwen3
  ExpectMap(Arch::kLlama, false, "model.layers.2.self_attn.k_norm.weight",
            "blk.2.attn_k_norm.weight", false);
  for (const char* bad : {"model.layers.0.mlp.up_proj.bias", "model.layers.x.mlp.up_proj.weight",
                          "model.layers.01.mlp.up_proj.weight", "model.layers..mlp.up_proj.weight",
                          "embed_tokens.weight", "wte.weight"}) {
    EXPECT_EQ(MapHfTensorName(Arch::kLlama, false, bad).action, Action::kUnknown) << bad;
  }
}

TEST(HfNamesTest, Gpt2WithAndWithoutPrefix) {
  for (const char* prefix : {"", "transformer."}) {
    const std::string p = prefix;
    ExpectMap(Arch::kGpt2, true, (p + "wte.weight").c_str(), "token_embd.weight", false);
    ExpectMap(Arch::kGpt2, true, (p + "wpe.weight").c_str(), "position_embd.weight", false);
    ExpectMap(Arch::kGpt2, true, (p + "ln_f.bias").c_str(), "output_norm.bias", false);
    ExpectMap(Arch::kGpt2, true, (p + "h.1.ln_1.weight").c_str(), "blk.1.attn_norm.weight", false);
    ExpectMap(Arch::kGpt2, true, (p + "h.1.attn.c_attn.weight").c_str(), "blk.1.attn_qkv.weight",
              true);
    ExpectMap(Arch::kGpt2, true, (p + "h.1.attn.c_attn.bias").c_str(), "blk.1.attn_qkv.bias",
              false);
    ExpectMap(Arch::kGpt2, true, (p + "h.1.attn.c_proj.weight").c_str(), "blk.1.attn_output.weight",
              true);
    ExpectMap(Arch::kGpt2, true, (p + "h.1.ln_2.bias").c_str(), "blk.1.ffn_norm.bias", false);
    ExpectMap(Arch::kGpt2, true, (p + "h.1.mlp.c_fc.weight").c_str(), "blk.1.ffn_up.weight", true);
    ExpectMap(Arch::kGpt2, true, (p + "h.1.mlp.c_proj.weight").c_str(), "blk.1.ffn_down.weight",
              true);
    ExpectMap(Arch::kGpt2, true, (p + "h.1.mlp.c_proj.bias").c_str(), "blk.1.ffn_down.bias", false);
    EXPECT_EQ(MapHfTensorName(Arch::kGpt2, true, p + "h.0.attn.bias").action, Action::kSkip);
    EXPECT_EQ(MapHfTensorName(Arch::kGpt2, true, p + "h.0.attn.masked_bias").action, Action::kSkip);
  }
  EXPECT_EQ(MapHfTensorName(Arch::kGpt2, true, "lm_head.weight").action, Action::kSkip);
  ExpectMap(Arch::kGpt2, false, "lm_head.weight", "output.weight", false);
  EXPECT_EQ(MapHfTensorName(Arch::kGpt2, true, "h.0.attn.c_attn.weight.extra").action,
            Action::kUnknown);
}

TEST(HfNamesTest, InverseForMessages) {
  EXPECT_EQ(HfNameForGguf(Arch::kLlama, "blk.7.attn_q.weight"),
            "model.layers.7.self_attn.q_proj.weight");
  EXPECT_EQ(HfNameForGguf(Arch::kLlama, "token_embd.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(HfNameForGguf(Arch::kGpt2, "blk.0.ffn_down.bias"), "h.0.mlp.c_proj.bias");
  EXPECT_EQ(HfNameForGguf(Arch::kGpt2, "position_embd.weight"), "wpe.weight");
  EXPECT_EQ(HfNameForGguf(Arch::kGpt2, "blk.0.nope"), "");
}

}  // namespace
}  // namespace tinyserve
