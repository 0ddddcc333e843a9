#include "worker/kv/paged_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace tinyserve {
namespace {

constexpr float kQMax = 127.0f;

// q * r rounded to the nearest integer (r <= 1, so the result stays in [-127, 127]).
inline int8_t Requantize(int q, float r) {
  return static_cast<int8_t>(std::nearbyint(static_cast<float>(q) * r));
}

}  // namespace

const char* KvDtypeName(KvDtype d) { return d == KvDtype::kInt8 ? "int8" : "f16"; }

bool ParseKvDtype(const std::string& name, KvDtype* out) {
  if (name == "f16" || name == "fp16") {
    *out = KvDtype::kF16;
    return true;
  }
  if (name == "int8") {
    *out = KvDtype::kInt8;
    return true;
  }
  return false;
}

PagedKvCache::PagedKvCache(const KvCacheConfig& config) : config_(config) {
  const size_t kv = static_cast<size_t>(config.num_pages) * config.n_kv_heads *
                    config.page_size * config.head_dim;
  const size_t meta = static_cast<size_t>(config.num_pages) * config.n_kv_heads * config.head_dim;
  const size_t scales = static_cast<size_t>(config.num_pages) * config.n_kv_heads;
  const bool int8 = config.dtype == KvDtype::kInt8;
  if (int8) {
    k8_.resize(config.n_layers);
    v8_.resize(config.n_layers);
    kscale_.resize(config.n_layers);
    vscale_.resize(config.n_layers);
  } else {
    k_.resize(config.n_layers);
    v_.resize(config.n_layers);
  }
  kmin_.resize(config.n_layers);
  kmax_.resize(config.n_layers);
  for (int l = 0; l < config.n_layers; ++l) {
    if (int8) {
      k8_[l].assign(kv, 0);
      v8_[l].assign(kv, 0);
      kscale_[l].assign(meta, 0.0f);
      vscale_[l].assign(scales, 0.0f);
    } else {
      k_[l].assign(kv, 0);
      v_[l].assign(kv, 0);
    }
    kmin_[l].assign(meta, std::numeric_limits<float>::infinity());
    kmax_[l].assign(meta, -std::numeric_limits<float>::infinity());
  }
}

int64_t PagedKvCache::BytesPerToken() const {
  return 2LL * config_.n_layers * config_.n_kv_heads * config_.head_dim *
         KvDtypeBytes(config_.dtype);
}

int64_t PagedKvCache::BytesForPages(const KvCacheConfig& c, int64_t n) {
  const int64_t kv =
      2LL * c.n_layers * c.n_kv_heads * c.page_size * c.head_dim * KvDtypeBytes(c.dtype);
  const int64_t meta = 2LL * c.n_layers * c.n_kv_heads * c.head_dim * 4;
  // int8: per-channel K scales and one V scale per layer and head.
  const int64_t scales =
      c.dtype == KvDtype::kInt8 ? 1LL * c.n_layers * c.n_kv_heads * (c.head_dim + 1) * 4 : 0;
  return n * (kv + meta + scales);
}

void PagedKvCache::ResetPage(int32_t page) {
  for (int l = 0; l < config_.n_layers; ++l)
    for (int h = 0; h < config_.n_kv_heads; ++h) {
      float* mn = kmin_[l].data() + MetaOffset(page, h);
      float* mx = kmax_[l].data() + MetaOffset(page, h);
      std::fill(mn, mn + config_.head_dim, std::numeric_limits<float>::infinity());
      std::fill(mx, mx + config_.head_dim, -std::numeric_limits<float>::infinity());
      if (config_.dtype == KvDtype::kInt8) {
        std::fill_n(kscale_[l].data() + MetaOffset(page, h), config_.head_dim, 0.0f);
        vscale_[l][ScaleOffset(page, h)] = 0.0f;
      }
    }
}

void PagedKvCache::WriteInt8Row(const float* x, int8_t* block, int slot, float* scale,
                                bool per_channel, float* box_min, float* box_max) {
  const int d = config_.head_dim, ps = config_.page_size;
  // Grows scale[c] to cover amax, re-quantizing channels [c0, c1) of every slot and their box.
  auto grow = [&](int c, float amax, int c0, int c1) {
    const float old_scale = scale[c], new_scale = amax / kQMax;
    if (old_scale > 0.0f) {
      // Slots not yet written hold stale values no one reads; re-quantizing them is harmless.
      const float r = old_scale / new_scale;
      for (int t = 0; t < ps; ++t) {
        int8_t* row = block + static_cast<size_t>(t) * d;
        for (int i = c0; i < c1; ++i) row[i] = Requantize(row[i], r);
      }
      if (box_min != nullptr)
        for (int i = c0; i < c1; ++i) {
          if (!(box_min[i] <= box_max[i])) continue;  // empty box
          // Bounds are q * old_scale of stored keys: recover q, re-quantize like the keys.
          const int qmin = static_cast<int>(std::lrint(box_min[i] / old_scale));
          const int qmax = static_cast<int>(std::lrint(box_max[i] / old_scale));
          box_min[i] = static_cast<float>(Requantize(qmin, r)) * new_scale;
          box_max[i] = static_cast<float>(Requantize(qmax, r)) * new_scale;
        }
    }
    scale[c] = new_scale;
  };
  if (per_channel) {
    for (int i = 0; i < d; ++i)
      if (std::fabs(x[i]) > scale[i] * kQMax) grow(i, std::fabs(x[i]), i, i + 1);
  } else {
    float amax = 0.0f;
    for (int i = 0; i < d; ++i) amax = std::max(amax, std::fabs(x[i]));
    if (amax > scale[0] * kQMax) grow(0, amax, 0, d);
  }
  int8_t* row = block + static_cast<size_t>(slot) * d;
  for (int i = 0; i < d; ++i) {
    const float s = scale[per_channel ? i : 0];
    const float q = s > 0.0f ? std::nearbyint(x[i] / s) : 0.0f;
    row[i] = static_cast<int8_t>(std::clamp(q, -kQMax, kQMax));
    if (box_min != nullptr) {
      const float stored = static_cast<float>(row[i]) * s;  // what attention reads
      box_min[i] = std::min(box_min[i], stored);
      box_max[i] = std::max(box_max[i], stored);
    }
  }
}

void PagedKvCache::WriteToken(int layer, int32_t page, int slot, const float* k, const float* v) {
  const int d = config_.head_dim;
  for (int h = 0; h < config_.n_kv_heads; ++h) {
    float* mn = kmin_[layer].data() + MetaOffset(page, h);
    float* mx = kmax_[layer].data() + MetaOffset(page, h);
    const float* kh = k + static_cast<size_t>(h) * d;
    const float* vh = v + static_cast<size_t>(h) * d;
    if (config_.dtype == KvDtype::kInt8) {
      const size_t off = Offset(page, h), so = ScaleOffset(page, h);
      WriteInt8Row(kh, k8_[layer].data() + off, slot, kscale_[layer].data() + MetaOffset(page, h),
                   /*per_channel=*/true, mn, mx);
      WriteInt8Row(vh, v8_[layer].data() + off, slot, &vscale_[layer][so], /*per_channel=*/false,
                   nullptr, nullptr);
      continue;
    }
    fp16_t* kd = K(layer, page, h) + static_cast<size_t>(slot) * d;
    fp16_t* vd = V(layer, page, h) + static_cast<size_t>(slot) * d;
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
  const size_t h = static_cast<size_t>(config_.n_kv_heads);
  for (int l = 0; l < config_.n_layers; ++l) {
    if (config_.dtype == KvDtype::kInt8) {
      std::memcpy(k8_[l].data() + Offset(dst, 0), k8_[l].data() + Offset(src, 0), n);
      std::memcpy(v8_[l].data() + Offset(dst, 0), v8_[l].data() + Offset(src, 0), n);
      std::memcpy(kscale_[l].data() + MetaOffset(dst, 0), kscale_[l].data() + MetaOffset(src, 0),
                  m * sizeof(float));
      std::memcpy(vscale_[l].data() + ScaleOffset(dst, 0), vscale_[l].data() + ScaleOffset(src, 0),
                  h * sizeof(float));
    } else {
      std::memcpy(K(l, dst, 0), K(l, src, 0), n * sizeof(fp16_t));
      std::memcpy(V(l, dst, 0), V(l, src, 0), n * sizeof(fp16_t));
    }
    std::memcpy(kmin_[l].data() + MetaOffset(dst, 0), kmin_[l].data() + MetaOffset(src, 0),
                m * sizeof(float));
    std::memcpy(kmax_[l].data() + MetaOffset(dst, 0), kmax_[l].data() + MetaOffset(src, 0),
                m * sizeof(float));
  }
}

}  // namespace tinyserve
