// File: kernels/cuda/reference/attention_ref.h
// Naive CPU references (plain C++, float storage, double accumulation) for the paged KV append,
// Quest page scores and selection, decode attention over a page list, and causal prefill.
// Layout as in kernels/cuda/paged_kv.cuh: K/V [num_pages][H_kv][P][d], boxes [num_pages][H_kv][d].
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace tinyserve::cuda::ref {

struct HostPagedKv {
  int num_pages = 0, num_kv_heads = 0, page_size = 0, head_dim = 0;
  std::vector<float> k, v;        // [num_pages][H_kv][P][d]
  std::vector<float> kmin, kmax;  // [num_pages][H_kv][d]

  void Resize(int pages, int hkv, int p, int d) {
    num_pages = pages, num_kv_heads = hkv, page_size = p, head_dim = d;
    k.assign(size_t(pages) * hkv * p * d, 0.f);
    v.assign(k.size(), 0.f);
    kmin.assign(size_t(pages) * hkv * d, 0.f);
    kmax.assign(kmin.size(), 0.f);
  }
  size_t Kv(int page, int head, int slot) const {
    return ((size_t(page) * num_kv_heads + head) * page_size + slot) * head_dim;
  }
  size_t Meta(int page, int head) const { return (size_t(page) * num_kv_heads + head) * head_dim; }
};

// Appends n tokens (k_new/v_new [n][H_kv][d]) to a sequence of len_old tokens whose page table
// is `table`, then recomputes the boxes of every touched page over its valid slots.
inline void AppendKv(HostPagedKv& kv, const std::vector<int32_t>& table, int len_old,
                     const float* k_new, const float* v_new, int n) {
  const int P = kv.page_size, d = kv.head_dim, H = kv.num_kv_heads;
  for (int i = 0; i < n; ++i) {
    const int t = len_old + i;
    for (int h = 0; h < H; ++h)
      for (int e = 0; e < d; ++e) {
        kv.k[kv.Kv(table[t / P], h, t % P) + e] = k_new[(size_t(i) * H + h) * d + e];
        kv.v[kv.Kv(table[t / P], h, t % P) + e] = v_new[(size_t(i) * H + h) * d + e];
      }
  }
  const int len = len_old + n;
  for (int lp = len_old / P; lp <= (len - 1) / P && n > 0; ++lp) {
    const int valid = std::min(P, len - lp * P);
    for (int h = 0; h < H; ++h)
      for (int e = 0; e < d; ++e) {
        float mn = std::numeric_limits<float>::infinity(), mx = -mn;
        for (int s = 0; s < valid; ++s) {
          const float x = kv.k[kv.Kv(table[lp], h, s) + e];
          mn = std::min(mn, x);
          mx = std::max(mx, x);
        }
        kv.kmin[kv.Meta(table[lp], h) + e] = mn;
        kv.kmax[kv.Meta(table[lp], h) + e] = mx;
      }
  }
}

// Aggregated score of logical page j for KV head g: over the group's query heads (q [H_q][d]) of
// U_h = sum_e max(q_e kmin_e, q_e kmax_e); max (kv_max) or sum (kv_sum).
inline double PageScore(const HostPagedKv& kv, const std::vector<int32_t>& table, int j, int g,
                        const float* q, int group, bool kv_sum) {
  const int d = kv.head_dim;
  double agg = kv_sum ? 0.0 : -std::numeric_limits<double>::infinity();
  for (int h = g * group; h < (g + 1) * group; ++h) {
    double u = 0;
    for (int e = 0; e < d; ++e) {
      const double qe = q[size_t(h) * d + e];
      u += std::max(qe * kv.kmin[kv.Meta(table[j], g) + e], qe * kv.kmax[kv.Meta(table[j], g) + e]);
    }
    agg = kv_sum ? agg + u : std::max(agg, u);
  }
  return agg;
}

// The budget rule of decode_attention.cuh given the candidate scores (score[j] for j in
// [n_sink, n-1)); returns logical pages in ascending order.
inline std::vector<int> SelectPages(const std::vector<double>& score, int n, int budget,
                                    int n_sink) {
  std::vector<int> out;
  if (n <= budget) {
    for (int j = 0; j < n; ++j) out.push_back(j);
    return out;
  }
  std::vector<int> cand;
  for (int j = n_sink; j < n - 1; ++j) cand.push_back(j);
  std::stable_sort(cand.begin(), cand.end(), [&](int a, int b) { return score[a] > score[b]; });
  cand.resize(budget - 1 - n_sink);
  for (int j = 0; j < n_sink; ++j) out.push_back(j);
  std::sort(cand.begin(), cand.end());
  out.insert(out.end(), cand.begin(), cand.end());
  out.push_back(n - 1);
  return out;
}

// Exact attention of query heads [g*group, (g+1)*group) over the tokens of logical pages
// `pages` (all pages if empty) of a sequence of length len. q [H_q][d], out [H_q][d].
inline void DecodeAttentionKvHead(const HostPagedKv& kv, const std::vector<int32_t>& table,
                                  int len, const float* q, int group, int g,
                                  const std::vector<int>& pages, double scale, float* out) {
  const int P = kv.page_size, d = kv.head_dim, n = (len + P - 1) / P;
  std::vector<int> list = pages;
  if (list.empty())
    for (int j = 0; j < n; ++j) list.push_back(j);
  for (int h = g * group; h < (g + 1) * group; ++h) {
    std::vector<double> s;
    std::vector<size_t> rows;
    for (int j : list)
      for (int slot = 0; slot < P && j * P + slot < len; ++slot) {
        const size_t off = kv.Kv(table[j], g, slot);
        double dot = 0;
        for (int e = 0; e < d; ++e) dot += double(q[size_t(h) * d + e]) * kv.k[off + e];
        s.push_back(dot * scale);
        rows.push_back(off);
      }
    const double m = *std::max_element(s.begin(), s.end());
    double den = 0;
    std::vector<double> acc(d, 0.0);
    for (size_t i = 0; i < s.size(); ++i) {
      const double p = std::exp(s[i] - m);
      den += p;
      for (int e = 0; e < d; ++e) acc[e] += p * kv.v[rows[i] + e];
    }
    for (int e = 0; e < d; ++e) out[size_t(h) * d + e] = static_cast<float>(acc[e] / den);
  }
}

// Causal prefill: the last nq tokens of a sequence of length len attend to positions <= theirs.
// q [nq][H_q][d], out [nq][H_q][d].
inline void PrefillAttention(const HostPagedKv& kv, const std::vector<int32_t>& table, int len,
                             int nq, const float* q, int hq, double scale, float* out) {
  const int P = kv.page_size, d = kv.head_dim, group = hq / kv.num_kv_heads;
  for (int i = 0; i < nq; ++i) {
    const int pos = len - nq + i;
    for (int h = 0; h < hq; ++h) {
      const int g = h / group;
      const float* qr = q + (size_t(i) * hq + h) * d;
      std::vector<double> s(pos + 1);
      double m = -std::numeric_limits<double>::infinity();
      for (int t = 0; t <= pos; ++t) {
        const size_t off = kv.Kv(table[t / P], g, t % P);
        double dot = 0;
        for (int e = 0; e < d; ++e) dot += double(qr[e]) * kv.k[off + e];
        s[t] = dot * scale;
        m = std::max(m, s[t]);
      }
      double den = 0;
      std::vector<double> acc(d, 0.0);
      for (int t = 0; t <= pos; ++t) {
        const double p = std::exp(s[t] - m);
        den += p;
        const size_t off = kv.Kv(table[t / P], g, t % P);
        for (int e = 0; e < d; ++e) acc[e] += p * kv.v[off + e];
      }
      for (int e = 0; e < d; ++e) out[(size_t(i) * hq + h) * d + e] = float(acc[e] / den);
    }
  }
}

}  // namespace tinyserve::cuda::ref
