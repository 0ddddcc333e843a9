#include "kernels/cpu/ops.h"

#include <cmath>

namespace tinyserve {

void RmsNorm(const float* x, const float* w, int n, float eps, float* y) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
  for (int i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
}

void LayerNorm(const float* x, const float* w, const float* b, int n, float eps, float* y) {
  double mean = 0;
  for (int i = 0; i < n; ++i) mean += x[i];
  mean /= n;
  double var = 0;
  for (int i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= n;
  const float inv = 1.0f / std::sqrt(static_cast<float>(var) + eps);
  const float m = static_cast<float>(mean);
  for (int i = 0; i < n; ++i) y[i] = (x[i] - m) * inv * w[i] + (b ? b[i] : 0.0f);
}

void ApplyRope(float* x, int d, int64_t pos, float theta, bool adjacent) {
  const int half = d / 2;
  for (int i = 0; i < half; ++i) {
    // Angles in double: positions up to 8K times frequencies near 1 lose digits in float.
    const double freq = std::pow(static_cast<double>(theta), -2.0 * i / d);
    const double a = static_cast<double>(pos) * freq;
    const float c = static_cast<float>(std::cos(a)), s = static_cast<float>(std::sin(a));
    float* x0 = adjacent ? &x[2 * i] : &x[i];
    float* x1 = adjacent ? &x[2 * i + 1] : &x[i + half];
    const float a0 = *x0, a1 = *x1;
    *x0 = a0 * c - a1 * s;
    *x1 = a0 * s + a1 * c;
  }
}

void SwiGlu(float* gate, const float* up, int n) {
  for (int i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void GeluNew(float* x, int n) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2/pi)
  for (int i = 0; i < n; ++i) {
    const float v = x[i];
    x[i] = 0.5f * v * (1.0f + std::tanh(kC * (v + 0.044715f * v * v * v)));
  }
}

void AddInPlace(float* y, const float* x, int n) {
  for (int i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace tinyserve

namespace tinyserve {

RopeTable::RopeTable(int head_dim, int max_pos, float theta)
    : head_dim_(head_dim), max_pos_(max_pos) {
  const int half = head_dim / 2;
  cos_.resize(static_cast<size_t>(max_pos) * half);
  sin_.resize(cos_.size());
  for (int i = 0; i < half; ++i) {
    const double freq = std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
    for (int p = 0; p < max_pos; ++p) {
      const double a = p * freq;
      cos_[static_cast<size_t>(p) * half + i] = static_cast<float>(std::cos(a));
      sin_[static_cast<size_t>(p) * half + i] = static_cast<float>(std::sin(a));
    }
  }
}

void RopeTable::Apply(float* x, int64_t pos, bool adjacent) const {
  const int half = head_dim_ / 2;
  const float* c = &cos_[static_cast<size_t>(pos) * half];
  const float* s = &sin_[static_cast<size_t>(pos) * half];
  if (adjacent) {
    for (int i = 0; i < half; ++i) {
      const float a0 = x[2 * i], a1 = x[2 * i + 1];
      x[2 * i] = a0 * c[i] - a1 * s[i];
      x[2 * i + 1] = a0 * s[i] + a1 * c[i];
    }
  } else {
    for (int i = 0; i < half; ++i) {
      const float a0 = x[i], a1 = x[i + half];
      x[i] = a0 * c[i] - a1 * s[i];
      x[i + half] = a0 * s[i] + a1 * c[i];
    }
  }
}

}  // namespace tinyserve
