#include "worker/hf/hf_names.h"

#include <charconv>
#include <span>

namespace tinyserve {
namespace {

struct Rule {
  std::string_view hf;    // suffix after the layer prefix, or the whole name for globals
  std::string_view gguf;  // same, on the GGUF side
  bool transpose;
};

constexpr Rule kLlamaGlobal[] = {
    {"model.embed_tokens.weight", "token_embd.weight", false},
    {"model.norm.weight", "output_norm.weight", false},
    {"lm_head.weight", "output.weight", false},
};
constexpr Rule kLlamaLayer[] = {
    {"input_layernorm.weight", "attn_norm.weight", false},
    {"self_attn.q_proj.weight", "attn_q.weight", false},
    {"self_attn.k_proj.weight", "attn_k.weight", false},
    {"self_attn.v_proj.weight", "attn_v.weight", false},
    {"self_attn.o_proj.weight", "attn_output.weight", false},
    {"self_attn.q_proj.bias", "attn_q.bias", false},
    {"self_attn.k_proj.bias", "attn_k.bias", false},
    {"self_attn.v_proj.bias", "attn_v.bias", false},
    {"self_attn.o_proj.bias", "attn_output.bias", false},
    {"self_attn.q_norm.weight", "attn_q_norm.weight", false},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", false},
    {"post_attention_layernorm.weight", "ffn_norm.weight", false},
    {"mlp.gate_proj.weight", "ffn_gate.weight", false},
    {"mlp.up_proj.weight", "ffn_up.weight", false},
    {"mlp.down_proj.weight", "ffn_down.weight", false},
};
// Gemma 3: a Llama layer whose post_attention_layernorm is the attention output's post-norm,
// with pre- and post-feedforward norms.
constexpr Rule kGemma3Layer[] = {
    {"input_layernorm.weight", "attn_norm.weight", false},
    {"self_attn.q_proj.weight", "attn_q.weight", false},
    {"self_attn.k_proj.weight", "attn_k.weight", false},
    {"self_attn.v_proj.weight", "attn_v.weight", false},
    {"self_attn.o_proj.weight", "attn_output.weight", false},
    {"self_attn.q_norm.weight", "attn_q_norm.weight", false},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", false},
    {"post_attention_layernorm.weight", "post_attention_norm.weight", false},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight", false},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight", false},
    {"mlp.gate_proj.weight", "ffn_gate.weight", false},
    {"mlp.up_proj.weight", "ffn_up.weight", false},
    {"mlp.down_proj.weight", "ffn_down.weight", false},
};
constexpr std::string_view kLlamaLayerSkip[] = {"self_attn.rotary_emb.inv_freq"};

constexpr Rule kGpt2Global[] = {
    {"wte.weight", "token_embd.weight", false},   {"wpe.weight", "position_embd.weight", false},
    {"ln_f.weight", "output_norm.weight", false}, {"ln_f.bias", "output_norm.bias", false},
    {"lm_head.weight", "output.weight", false},
};
constexpr Rule kGpt2Layer[] = {
    {"ln_1.weight", "attn_norm.weight", false},
    {"ln_1.bias", "attn_norm.bias", false},
    {"attn.c_attn.weight", "attn_qkv.weight", true},
    {"attn.c_attn.bias", "attn_qkv.bias", false},
    {"attn.c_proj.weight", "attn_output.weight", true},
    {"attn.c_proj.bias", "attn_output.bias", false},
    {"ln_2.weight", "ffn_norm.weight", false},
    {"ln_2.bias", "ffn_norm.bias", false},
    {"mlp.c_fc.weight", "ffn_up.weight", true},
    {"mlp.c_fc.bias", "ffn_up.bias", false},
    {"mlp.c_proj.weight", "ffn_down.weight", true},
    {"mlp.c_proj.bias", "ffn_down.bias", false},
};
constexpr std::string_view kGpt2Prefix = "transformer.";
constexpr std::string_view kGpt2LayerSkip[] = {"attn.bias", "attn.masked_bias"};

// Splits "<prefix><N>.<rest>" into N and rest.
bool SplitLayer(std::string_view name, std::string_view prefix, int* layer,
                std::string_view* rest) {
  if (!name.starts_with(prefix)) return false;
  name.remove_prefix(prefix.size());
  const size_t dot = name.find('.');
  if (dot == std::string_view::npos || dot == 0) return false;
  const std::string_view digits = name.substr(0, dot);
  for (char ch : digits) {
    if (ch < '0' || ch > '9') return false;
  }
  if (digits.size() > 1 && digits[0] == '0') return false;  // "01" would alias "1"
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), *layer);
  if (ec != std::errc() || end != digits.data() + digits.size()) return false;
  *rest = name.substr(dot + 1);
  return true;
}

template <size_t NG, size_t NL, size_t NS>
HfNameMapping MapWith(const Rule (&global)[NG], std::string_view layer_prefix,
                      const Rule (&per_layer)[NL], const std::string_view (&skip)[NS], bool tied,
                      std::string_view name) {
  HfNameMapping m;
  for (const Rule& r : global) {
    if (name != r.hf) continue;
    if (r.gguf == "output.weight" && tied) {
      m.action = HfNameMapping::Action::kSkip;
      return m;
    }
    m.action = HfNameMapping::Action::kMap;
    m.gguf_name = std::string(r.gguf);
    m.transpose = r.transpose;
    return m;
  }
  int layer = 0;
  std::string_view rest;
  if (!SplitLayer(name, layer_prefix, &layer, &rest)) return m;
  for (std::string_view s : skip) {
    if (rest == s) {
      m.action = HfNameMapping::Action::kSkip;
      return m;
    }
  }
  for (const Rule& r : per_layer) {
    if (rest != r.hf) continue;
    m.action = HfNameMapping::Action::kMap;
    m.gguf_name = "blk." + std::to_string(layer) + "." + std::string(r.gguf);
    m.transpose = r.transpose;
    return m;
  }
  return m;
}

}  // namespace

HfNameMapping MapHfTensorName(Arch arch, bool tied_embeddings, std::string_view hf_name,
                              bool gemma) {
  switch (arch) {
    case Arch::kLlama:
      if (gemma)
        return MapWith(kLlamaGlobal, "model.layers.", kGemma3Layer, kLlamaLayerSkip,
                       tied_embeddings, hf_name);
      return MapWith(kLlamaGlobal, "model.layers.", kLlamaLayer, kLlamaLayerSkip, tied_embeddings,
                     hf_name);
    case Arch::kGpt2:
      // GPT2LMHeadModel checkpoints prefix the body with "transformer." (lm_head has none).
      if (hf_name.starts_with(kGpt2Prefix)) hf_name.remove_prefix(kGpt2Prefix.size());
      return MapWith(kGpt2Global, "h.", kGpt2Layer, kGpt2LayerSkip, tied_embeddings, hf_name);
  }
  return {};
}

std::string HfNameForGguf(Arch arch, std::string_view gguf_name, bool gemma) {
  const bool llama = arch == Arch::kLlama;
  const std::span<const Rule> global =
      llama ? std::span<const Rule>(kLlamaGlobal) : std::span<const Rule>(kGpt2Global);
  const std::span<const Rule> per_layer = !llama  ? std::span<const Rule>(kGpt2Layer)
                                          : gemma ? std::span<const Rule>(kGemma3Layer)
                                                  : std::span<const Rule>(kLlamaLayer);
  for (const Rule& r : global) {
    if (gguf_name == r.gguf) return std::string(r.hf);
  }
  int layer = 0;
  std::string_view rest;
  if (!SplitLayer(gguf_name, "blk.", &layer, &rest)) return "";
  for (const Rule& r : per_layer) {
    if (rest == r.gguf) {
      return (llama ? "model.layers." : "h.") + std::to_string(layer) + "." + std::string(r.hf);
    }
  }
  return "";
}

}  // namespace tinyserve
