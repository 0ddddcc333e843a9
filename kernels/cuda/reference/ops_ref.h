// File: kernels/cuda/reference/ops_ref.h
// Naive CPU references (plain C++, float in/out, double inside where it matters) for the
// elementwise and GEMM-side kernels: norms, RoPE, SwiGLU, GELU, embedding, argmax, softmax
// top-k, ggml block dequantization, GEMV/GEMM.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

namespace tinyserve::cuda::ref {

inline float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal
      float f = std::ldexp(float(man), -24);
      std::memcpy(&bits, &f, 4);
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// h = x + residual (if residual), residual = h, out = h / rms * w. x/out [rows][n].
inline void RmsNorm(const float* x, const float* w, float* out, float* residual, int rows, int n,
                    float eps) {
  for (int r = 0; r < rows; ++r) {
    std::vector<double> h(n);
    double ss = 0;
    for (int i = 0; i < n; ++i) {
      h[i] = x[size_t(r) * n + i] + (residual ? residual[size_t(r) * n + i] : 0.f);
      ss += h[i] * h[i];
    }
    if (residual)
      for (int i = 0; i < n; ++i) residual[size_t(r) * n + i] = float(h[i]);
    const double inv = 1.0 / std::sqrt(ss / n + eps);
    for (int i = 0; i < n; ++i) out[size_t(r) * n + i] = float(h[i] * inv * w[i]);
  }
}

inline void LayerNorm(const float* x, const float* w, const float* b, float* out, int rows, int n,
                      float eps) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + size_t(r) * n;
    double mean = 0, var = 0;
    for (int i = 0; i < n; ++i) mean += xr[i];
    mean /= n;
    for (int i = 0; i < n; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= n;
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int i = 0; i < n; ++i)
      out[size_t(r) * n + i] = float((xr[i] - mean) * inv * w[i] + (b ? b[i] : 0.f));
  }
}

// In place on one head row x[d]; adjacent = (2i, 2i+1) pairs, else (i, i + rot/2). Pair i's
// angle is scaled by freq_scale and divided by factors[i] when factors is given.
inline void RopeRow(float* x, int rot, int pos, double theta, bool adjacent,
                    double freq_scale = 1.0, const float* factors = nullptr,
                    double attn_factor = 1.0) {
  const int half = rot / 2;
  for (int i = 0; i < half; ++i) {
    const double ang =
        pos * freq_scale * std::pow(theta, -2.0 * i / rot) / (factors ? factors[i] : 1.0);
    const double c = attn_factor * std::cos(ang), s = attn_factor * std::sin(ang);
    const int i0 = adjacent ? 2 * i : i, i1 = adjacent ? 2 * i + 1 : i + half;
    const double x0 = x[i0], x1 = x[i1];
    x[i0] = float(x0 * c - x1 * s);
    x[i1] = float(x0 * s + x1 * c);
  }
}

// y[r][c] += bias[c] for rows of `stride` elements.
inline void AddBias(float* y, int64_t stride, const float* bias, int rows, int cols) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) y[size_t(r) * stride + c] += bias[c];
}

inline float Silu(float g) { return float(g / (1.0 + std::exp(-double(g)))); }
inline float GeluTanh(float x) {
  const double v = x;
  return float(0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
}

// Lowest index of the largest non-NaN value; 0 if none.
inline int Argmax(const float* x, int n) {
  int best = -1;
  for (int i = 0; i < n; ++i)
    if (x[i] == x[i] && (best < 0 || x[i] > x[best])) best = i;
  return best < 0 ? 0 : best;
}

// softmax(x / temp) over the top_k largest (ties to the lower index), zeros elsewhere.
inline void SoftmaxTopK(const float* x, int n, float temp, int top_k, float* probs) {
  std::vector<int> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return x[a] > x[b]; });
  const int k = (top_k <= 0 || top_k >= n) ? n : top_k;
  const double m = x[idx[0]];
  double sum = 0;
  std::vector<double> p(n, 0.0);
  for (int i = 0; i < k; ++i) {
    p[idx[i]] = std::exp((x[idx[i]] - m) / temp);
    sum += p[idx[i]];
  }
  for (int i = 0; i < n; ++i) probs[i] = float(p[i] / sum);
}

// ggml blocks -> floats (type 0 = Q4_0, 1 = Q4_1, 2 = Q8_0), nblocks blocks.
inline void DequantBlocks(int type, const uint8_t* b, int64_t nblocks, float* y) {
  const int bytes = type == 0 ? 18 : (type == 1 ? 20 : 34);
  for (int64_t i = 0; i < nblocks; ++i, b += bytes, y += 32) {
    uint16_t dh, mh = 0;
    std::memcpy(&dh, b, 2);
    const float d = HalfBitsToFloat(dh);
    if (type == 2) {
      for (int j = 0; j < 32; ++j) y[j] = float(int8_t(b[2 + j])) * d;
      continue;
    }
    if (type == 1) std::memcpy(&mh, b + 2, 2);
    const float m = type == 1 ? HalfBitsToFloat(mh) : 0.f;
    const uint8_t* qs = b + (type == 1 ? 4 : 2);
    for (int j = 0; j < 16; ++j) {
      if (type == 0) {
        y[j] = float((qs[j] & 0xF) - 8) * d;
        y[j + 16] = float((qs[j] >> 4) - 8) * d;
      } else {
        y[j] = float(qs[j] & 0xF) * d + m;
        y[j + 16] = float(qs[j] >> 4) * d + m;
      }
    }
  }
}

// y[M][N] = x[M][K] . w[N][K]^T, double accumulation.
inline void Linear(const float* x, const float* w, float* y, int M, int N, int K) {
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += double(x[size_t(m) * K + k]) * w[size_t(n) * K + k];
      y[size_t(m) * N + n] = float(s);
    }
}

}  // namespace tinyserve::cuda::ref
