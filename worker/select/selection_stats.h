// File: worker/select/selection_stats.h
// Instrumentation of token selection: per decode step and accumulated per request.
#pragma once

#include <cstdint>

namespace tinyserve {

// One decode step of one sequence, summed over layers and KV heads where selection applied.
struct StepStats {
  int64_t pages_scored = 0;     // pages whose metadata was read (or scored otherwise)
  int64_t pages_selected = 0;   // pages attended (over selecting layers and heads)
  int64_t pages_total = 0;      // pages a dense step would attend on the same layers/heads
  int64_t kv_bytes_read = 0;    // K+V bytes of the attended tokens + metadata bytes read
  int64_t kv_bytes_dense = 0;   // K+V bytes dense attention reads on the same layers/heads
  double select_seconds = 0;    // time inside Select (scoring + top-k)
  int64_t reuse_hits = 0;       // selected pages that were also selected last step
  int64_t reuse_total = 0;      // selected pages on (layer, head)s that had a last step
  // Oracle comparison (only on sampled steps; counts are 0 otherwise).
  int64_t oracle_samples = 0;   // (layer, head) pairs compared
  double hit_rate_sum = 0;      // sum over samples of |chosen ∩ oracle top| / |oracle top|
  double mass_recall_sum = 0;   // sum over samples of dense attention mass inside chosen pages
};

struct SelectionStats {
  int64_t steps = 0;
  StepStats total;  // sums over steps
  void Add(const StepStats& s) {
    ++steps;
    total.pages_scored += s.pages_scored;
    total.pages_selected += s.pages_selected;
    total.pages_total += s.pages_total;
    total.kv_bytes_read += s.kv_bytes_read;
    total.kv_bytes_dense += s.kv_bytes_dense;
    total.select_seconds += s.select_seconds;
    total.reuse_hits += s.reuse_hits;
    total.reuse_total += s.reuse_total;
    total.oracle_samples += s.oracle_samples;
    total.hit_rate_sum += s.hit_rate_sum;
    total.mass_recall_sum += s.mass_recall_sum;
  }
  double PageHitRate() const {
    return total.oracle_samples ? total.hit_rate_sum / total.oracle_samples : -1;
  }
  double MassRecall() const {
    return total.oracle_samples ? total.mass_recall_sum / total.oracle_samples : -1;
  }
  double Reuse() const {
    return total.reuse_total ? static_cast<double>(total.reuse_hits) / total.reuse_total : -1;
  }
};

}  // namespace tinyserve
