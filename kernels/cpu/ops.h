// File: kernels/cpu/ops.h
// Elementwise and normalisation ops of the transformer on the CPU (fp32).
#pragma once

#include <cstdint>
#include <vector>

namespace tinyserve {

// y = x / rms(x) * w over n elements (RMSNorm, eps inside the root).
void RmsNorm(const float* x, const float* w, int n, float eps, float* y);
// y = (x - mean) / sqrt(var + eps) * w + b (LayerNorm; b may be null).
void LayerNorm(const float* x, const float* w, const float* b, int n, float eps, float* y);

// Rotates one head's vector in place for position pos. adjacent: pairs (x[2i], x[2i+1])
// (GGUF llama); otherwise rotate-half pairs (x[i], x[i + d/2]) (Hugging Face). Angle of pair i:
// pos * theta^(-2i/d).
void ApplyRope(float* x, int head_dim, int64_t pos, float theta, bool adjacent);

// gate[i] = silu(gate[i]) * up[i]
void SwiGlu(float* gate, const float* up, int n);
// x[i] = gelu_new(x[i]) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void GeluNew(float* x, int n);
// gate[i] = gelu_new(gate[i]) * up[i] (GeGLU with the tanh GELU: Gemma's MLP)
void GeGlu(float* gate, const float* up, int n);
// y += x
void AddInPlace(float* y, const float* x, int n);

}  // namespace tinyserve

namespace tinyserve {

// cos/sin of every (position, pair) for positions [0, reserved): RoPE without transcendental
// calls on the hot path. The table grows with the positions used (Reserve), so a model whose
// context is far longer than any sequence it runs (or a corrupt context length) costs nothing.
class RopeTable {
 public:
  // Pair i turns by pos * freq_scale * theta^(-2i/head_dim) / freq_factors[i] (factors empty:
  // all 1; else head_dim / 2 of them); its cos and sin are scaled by attn_factor (YaRN).
  RopeTable(int head_dim, int max_pos, float theta, float freq_scale = 1.0f,
            const std::vector<float>& freq_factors = {}, float attn_factor = 1.0f);
  int max_pos() const { return max_pos_; }
  // Makes positions [0, n) available (n <= max_pos), growing the table by at least half; not
  // safe to call while another thread is in Apply.
  void Reserve(int64_t n);
  // Rotates x [head_dim] in place for pos < the reserved size (see ApplyRope for the pairing).
  void Apply(float* x, int64_t pos, bool adjacent) const;

 private:
  int head_dim_, max_pos_;
  float attn_factor_;
  std::vector<double> freq_;  // [head_dim / 2] radians per position
  int64_t reserved_ = 0;
  std::vector<float> cos_, sin_;  // [reserved][head_dim / 2]
};

}  // namespace tinyserve
