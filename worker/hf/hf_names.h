// File: worker/hf/hf_names.h
// Hugging Face tensor names -> the GGUF names and orientation that WeightSource presents
// (worker/model/weight_source.h; table in shared/reference/model-formats.md §8).
//
//   llama: model.embed_tokens -> token_embd, model.norm -> output_norm, lm_head -> output,
//          model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
//          mlp.{gate,up,down}_proj} -> blk.N.{attn_norm, attn_q/k/v, attn_output, ffn_norm,
//          ffn_gate/up/down}. Q and K rows are NOT permuted: HF llama runs rotate-half RoPE.
//   gemma3_text: the llama names but for the layer norms (below).
//   gpt2:  with or without the "transformer." prefix: wte -> token_embd, wpe -> position_embd,
//          h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj} -> blk.N.{attn_norm,
//          attn_qkv, attn_output, ffn_norm, ffn_up, ffn_down}, ln_f -> output_norm; the four
//          Conv1D weights ([in, out]) must be transposed. lm_head -> output.
// Skipped: buffers (rotary_emb.inv_freq, attn.bias, attn.masked_bias) and lm_head.weight when
// the embeddings are tied (transformers ties it to the embedding whatever the file holds).
//
// Thread safety: plain functions.
#pragma once

#include <string>
#include <string_view>

#include "worker/model/model_config.h"

namespace tinyserve {

struct HfNameMapping {
  enum class Action { kMap, kSkip, kUnknown };
  Action action = Action::kUnknown;
  std::string gguf_name;   // for kMap
  bool transpose = false;  // Conv1D weight [in, out]: transpose into out rows of in
};

// gemma: Gemma 3's layer names (post_attention_layernorm -> post_attention_norm,
// pre_feedforward_layernorm -> ffn_norm, post_feedforward_layernorm -> post_ffw_norm).
HfNameMapping MapHfTensorName(Arch arch, bool tied_embeddings, std::string_view hf_name,
                              bool gemma = false);

// The canonical HF name for a GGUF name (for error messages): the llama (or gemma) names, and
// the gpt2 names without the "transformer." prefix. Empty if there is none.
std::string HfNameForGguf(Arch arch, std::string_view gguf_name, bool gemma = false);

}  // namespace tinyserve
