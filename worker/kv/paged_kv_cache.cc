#include "worker/kv/paged_kv_cache.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace tinyserve {

PagedKvCache::PagedKvCache(const KvCacheConfig& config) : config_(config) {
  const size_t kv = static_cast<size_t>(config.num_pages) * config.n_kv_heads *
                    config.page_size * config.head_dim;
  const size_t meta = static_cast<size_t>(config.num_pages) * config.n_kv_heads * config.head_dim;
  k_.resize(config.n_layers);
  v_.resize(config.n_layers);
  kmin_.resize(config.n_layers);
  kmax_.resize(config.n_layers);
  for (int l = 0; l < config.n_layers; ++l) {
    k_[l].assign(kv, 0);
    v_[l].assign(kv, 0);
    kmin_[l].assign(meta, std::numeric_limits<float>::infinity());
    kmax_[l].assign(meta, -std::numeric_limits<float>::infinity());
  }
}

int64_t PagedKvCache::BytesPerToken() const {
  return 2LL * config_.n_layers * config_.n_kv_heads * config_.head_dim * sizeof(fp16_t);
}

int64_t PagedKvCache::BytesForPages(const KvCacheConfig& c, int64_t n) {
  const int64_t kv = 2LL * c.n_layers * c.n_kv_heads * c.page_size * c.head_dim * 2;
  const int64_t meta = 2LL * c.n_layers * c.n_kv_heads * c.head_dim * 4;
  return n * (kv + meta);
}

void PagedKvCache::ResetPage(int32_t page) {
  for (int l = 0; l < config_.n_layers; ++l)
    for (int h = 0; h < config_.n_kv_heads; ++h) {
      float* mn = kmin_[l].data() + MetaOffset(page, h);
      float* mx = kmax_[l].data() + MetaOffset(page, h);
      std::fill(mn, mn + config_.head_dim, std::numeric_limits<float>::infinity());
      std::fill(mx, mx + config_.head_dim, -std::numeric_limits<float>::infinity());
    }
}

void PagedKvCache::WriteToken(int layer, int32_t page, int slot, const float* k, const float* v) {
  const int d = config_.head_dim;
  for (int h = 0; h < config_.n_kv_heads; ++h) {
    fp16_t* kd = K(layer, page, h) + static_cast<size_t>(slot) * d;
    fp16_t* vd = V(layer, page, h) + static_cast<size_t>(slot) * d;
    float* mn = kmin_[layer].data() + MetaOffset(page, h);
    float* mx = kmax_[layer].data() + MetaOffset(page, h);
    const float* kh = k + static_cast<size_t>(h) * d;
    const float* vh = v + static_cast<size_t>(h) * d;
    for (int i = 0; i < d; ++i) {
      kd[i] = FloatToFp16(kh[i]);
      vd[i] = FloatToFp16(vh[i]);
      const float stored = Fp16ToFloat(kd[i]);  // the box bounds what attention will read
      mn[i] = std::min(mn[i], stored);
      mx[i] = std::max(mx[i], stored);
    }
  }
}

void PagedKvCache::CopyPage(int32_t src, int32_t dst) {
  const size_t n = static_cast<size_t>(config_.n_kv_heads) * config_.page_size * config_.head_dim;
  const size_t m = static_cast<size_t>(config_.n_kv_heads) * config_.head_dim;
  for (int l = 0; l < config_.n_layers; ++l) {
    std::memcpy(K(l, dst, 0), K(l, src, 0), n * sizeof(fp16_t));
    std::memcpy(V(l, dst, 0), V(l, src, 0), n * sizeof(fp16_t));
    std::memcpy(kmin_[l].data() + MetaOffset(dst, 0), kmin_[l].data() + MetaOffset(src, 0),
                m * sizeof(float));
    std::memcpy(kmax_[l].data() + MetaOffset(dst, 0), kmax_[l].data() + MetaOffset(src, 0),
                m * sizeof(float));
  }
}

}  // namespace tinyserve
