// File: worker/model/model_config.h
// The architecture-level description of a model, filled from GGUF metadata or a Hugging Face
// config.json.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace tinyserve {

enum class Arch { kLlama, kGpt2 };

// How a sequence's hidden states (after the final norm) become an embedding: none (it
// generates), the last token's, or the mean over its tokens.
enum class Pooling { kNone, kLast, kMean };

// Which channel pairs RoPE rotates (shared/reference/model-formats.md §5).
enum class RopeStyle {
  kAdjacent,    // (x[2i], x[2i+1]): GGUF "llama" (Q/K rows were permuted by the converter)
  kRotateHalf,  // (x[i], x[i + d/2]): Hugging Face Llama checkpoints
  kNone,        // learned absolute positions (GPT-2)
};

struct ModelConfig {
  Arch arch = Arch::kLlama;
  // The architecture's own name when it is a variant run as `arch` ("qwen2": a Llama with Q/K/V
  // biases and rotate-half RoPE; "qwen3": with qk_norm instead); empty otherwise.
  // ArchName(config) gives the name.
  std::string variant;
  std::string name;
  int n_layers = 0;
  int dim = 0;          // hidden size
  int n_heads = 0;      // query heads
  int n_kv_heads = 0;   // key/value heads (GQA when < n_heads)
  int head_dim = 0;
  int ffn_dim = 0;      // MLP inner size
  int vocab_size = 0;
  int max_context = 0;  // trained context length
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  // Channel pair i turns by pos * rope_freq_scale * theta^(-2i/head_dim) / rope_freq_factors[i]:
  // linear scaling (GGUF rope.scaling.type "linear") and Llama 3's per-frequency factors (GGUF
  // tensor rope_freqs.weight, or config.json rope_scaling "llama3"); empty factors are all 1.
  // YaRN (rope scaling "yarn") is per-pair factors (YarnFreqDivisors) plus rope_attn_factor:
  // every rotated pair's cos and sin are scaled by it, so q·k by its square.
  float rope_freq_scale = 1.0f;
  std::vector<float> rope_freq_factors;
  float rope_attn_factor = 1.0f;
  RopeStyle rope_style = RopeStyle::kAdjacent;
  // Qwen3: each Q and K head RMS-normalized (weights attn_q_norm / attn_k_norm, [head_dim])
  // before RoPE.
  bool qk_norm = false;
  bool tied_embeddings = false;  // LM head is the token embedding

  // Gemma 3 (variant "gemma3"): token embeddings scaled by embed_scale (sqrt(dim)); each
  // layer's attention and MLP outputs RMS-normalized (attn_post_norm / ffn_post_norm) before
  // the residual adds; a GeGLU MLP (gelu_tanh(gate) * up) instead of SwiGLU.
  float embed_scale = 1.0f;
  bool post_norms = false;
  bool gelu_gate = false;
  // Attention scores are scale * q·k; 0: 1/sqrt(head_dim).
  float attn_scale = 0.0f;
  // Sliding-window attention: a layer l with swa_layers[l] attends only the sliding_window
  // latest positions (its own included: position p sees [p - sliding_window + 1, p]), with RoPE
  // base rope_theta_swa and no scaling or factors; the others attend everything and use the
  // rope_* fields above. sliding_window 0 (swa_layers empty): no sliding layers.
  int sliding_window = 0;
  std::vector<bool> swa_layers;
  float rope_theta_swa = 10000.0f;

  bool SlidingLayer(int l) const {
    return sliding_window > 0 && l < static_cast<int>(swa_layers.size()) && swa_layers[l];
  }
  float AttentionScale() const {
    return attn_scale > 0 ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }
};

inline const char* ArchName(Arch arch) {
  switch (arch) {
    case Arch::kLlama:
      return "llama";
    case Arch::kGpt2:
      return "gpt2";
  }
  return "unknown";
}

// YaRN's per-pair divisors for rope_freq_factors (transformers' _compute_yarn_parameters,
// llama.cpp's rope_yarn with ext_factor 1): pair i's frequency blends the base frequency
// (extrapolation) and the base divided by `factor` (interpolation) by a linear ramp over the
// pairs between the correction dims of beta_fast and beta_slow rotations in the original
// context (floored and ceiled when `truncate`, as both do by default).
inline std::vector<float> YarnFreqDivisors(int rot_dim, double theta, double factor,
                                           double original_context, double beta_fast = 32,
                                           double beta_slow = 1, bool truncate = true) {
  auto corr_dim = [&](double rotations) {
    return rot_dim * std::log(original_context / (rotations * 2 * M_PI)) / (2 * std::log(theta));
  };
  double low = corr_dim(beta_fast), high = corr_dim(beta_slow);
  if (truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, rot_dim - 1.0);
  std::vector<float> divisors(rot_dim / 2);
  for (int i = 0; i < rot_dim / 2; ++i) {
    const double ramp = std::clamp((i - low) / std::max(high - low, 0.001), 0.0, 1.0);
    const double extrapolation = 1.0 - ramp;  // the share of the unscaled frequency
    divisors[i] = static_cast<float>(1.0 / (extrapolation + (1.0 - extrapolation) / factor));
  }
  return divisors;
}

// The context YaRN extends to: original x factor, at most 2^30 tokens.
inline int YarnContext(double original_context, double factor) {
  return static_cast<int>(std::min(std::round(original_context * factor), double{1 << 30}));
}

// YaRN's default attention factor (the scale on cos and sin): 0.1 * mscale * ln(factor) + 1.
inline double YarnMscale(double factor, double mscale = 1.0) {
  return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

// The architecture's name: the variant's ("qwen2", "gemma3", ...) when it has one.
inline std::string ArchName(const ModelConfig& c) {
  return c.variant.empty() ? ArchName(c.arch) : c.variant;
}

}  // namespace tinyserve
