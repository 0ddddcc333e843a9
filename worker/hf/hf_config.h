// File: worker/hf/hf_config.h
// Hugging Face config.json -> ModelConfig, for model_type "llama", "qwen2", "qwen3" and "gpt2".
//
//   llama: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size,
//          max_position_embeddings, rms_norm_eps (required); num_key_value_heads (default: the
//          heads), head_dim (default hidden / heads), rope_theta (default 10000, also read from
//          transformers 5's rope_parameters), tie_word_embeddings (default false, as in
//          transformers' LlamaConfig), rope_scaling (or rope_parameters) of type default,
//          linear, llama3 or yarn (max_context becomes the original context times the factor).
//          RoPE pairs rotate-half (model-formats.md §5). Attention biases
//          (attention_bias) are read when the checkpoint has them.
//   qwen2: as llama (Q/K/V biases in every checkpoint); use_sliding_window must be false.
//   qwen3: as qwen2 with per-head Q/K RMSNorms (q_norm, k_norm) and usually no biases.
//          Unimplemented: other RoPE scalings (dynamic, longrope, ...), mlp_bias, hidden_act other
//          than silu, use_sliding_window.
//   gpt2:  n_embd, n_layer, n_head, vocab_size (required); n_inner (null -> 4 * n_embd),
//          n_positions (or n_ctx; default 1024), layer_norm_epsilon (default 1e-5),
//          tie_word_embeddings (default true). No RoPE. Unimplemented: activation_function
//          other than gelu_new / gelu_pytorch_tanh, scale_attn_weights false,
//          scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn.
// Any other model_type is Unimplemented. A missing or mistyped field is InvalidArgument naming
// the file and the field.
//
// Thread safety: plain functions.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "worker/model/model_config.h"

namespace tinyserve {

// Parses config.json text; `label` names the file in errors. ModelConfig::name is left empty.
absl::StatusOr<ModelConfig> ParseHfConfig(std::string_view json_text, const std::string& label);

// Replaces c's RoPE scaling (rope_freq_scale, rope_freq_factors, rope_attn_factor) with a
// rope_scaling object as config.json holds it, e.g. {"rope_type": "yarn", "factor": 4.0,
// "original_max_position_embeddings": 32768}: vLLM's --rope-scaling, llama.cpp's
// --rope-scaling / --rope-scale / --yarn-orig-ctx. c's rope_theta, head_dim and max_context
// must be set (YaRN's original context defaults to max_context and extends it). `label` names
// the setting in errors.
absl::Status ApplyRopeScaling(std::string_view json_text, const std::string& label, ModelConfig* c);

// Reads and parses a config.json file. NotFound naming the path if it is absent.
absl::StatusOr<ModelConfig> ReadHfConfig(const std::string& path);

}  // namespace tinyserve
