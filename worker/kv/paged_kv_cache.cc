#include "worker/kv/paged_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/attention.h"

namespace tinyserve {
namespace {

constexpr float kQMax = 127.0f;
constexpr fp16_t kPosInf = 0x7c00u, kNegInf = 0xfc00u;

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
    kmin_[l].assign(meta, kPosInf);
    kmax_[l].assign(meta, kNegInf);
  }
  if (int8) {
    stage_of_.assign(static_cast<size_t>(config.num_pages), -1);
    stages_.reserve(static_cast<size_t>(std::max(1, config.max_staged_pages)));
  }
}

int64_t PagedKvCache::BytesPerToken() const {
  return 2LL * config_.n_layers * config_.n_kv_heads * config_.head_dim *
         KvDtypeBytes(config_.dtype);
}

int64_t PagedKvCache::BytesForPages(const KvCacheConfig& c, int64_t n) {
  const int64_t kv =
      2LL * c.n_layers * c.n_kv_heads * c.page_size * c.head_dim * KvDtypeBytes(c.dtype);
  const int64_t meta = 2LL * c.n_layers * c.n_kv_heads * c.head_dim * 2;  // fp16 box
  // int8: per-channel K scales and one V scale per layer and head.
  const int64_t scales =
      c.dtype == KvDtype::kInt8 ? 1LL * c.n_layers * c.n_kv_heads * (c.head_dim + 1) * 4 : 0;
  return n * (kv + meta + scales);
}

void PagedKvCache::ResetPage(int32_t page) {
  for (int l = 0; l < config_.n_layers; ++l)
    for (int h = 0; h < config_.n_kv_heads; ++h) {
      fp16_t* mn = kmin_[l].data() + MetaOffset(page, h);
      fp16_t* mx = kmax_[l].data() + MetaOffset(page, h);
      std::fill(mn, mn + config_.head_dim, kPosInf);
      std::fill(mx, mx + config_.head_dim, kNegInf);
      if (config_.dtype == KvDtype::kInt8) {
        std::fill_n(kscale_[l].data() + MetaOffset(page, h), config_.head_dim, 0.0f);
        vscale_[l][ScaleOffset(page, h)] = 0.0f;
      }
    }
  if (config_.dtype == KvDtype::kInt8) DropStage(page);
}

const fp16_t* PagedKvCache::StagedK(int layer, int32_t page, int head) const {
  const Stage* st = StageOf(page);
  return st == nullptr || st->quantized[layer] ? nullptr : st->k.data() + StageOffset(layer, head);
}

const fp16_t* PagedKvCache::StagedV(int layer, int32_t page, int head) const {
  const Stage* st = StageOf(page);
  return st == nullptr || st->quantized[layer] ? nullptr : st->v.data() + StageOffset(layer, head);
}

int PagedKvCache::staged_pages() const {
  return static_cast<int>(stages_.size() - free_stages_.size());
}

void PagedKvCache::DropStage(int32_t page) {
  const int32_t i = stage_of_[page];
  if (i < 0) return;
  stages_[i]->page = -1;
  free_stages_.push_back(i);
  stage_of_[page] = -1;
}

PagedKvCache::Stage& PagedKvCache::Staged(int32_t page) {
  if (stage_of_[page] >= 0) return *stages_[stage_of_[page]];
  const int cap = std::max(1, config_.max_staged_pages);
  if (free_stages_.empty() && static_cast<int>(stages_.size()) >= cap) {
    // Full: quantize the least recently staged page as it is and take its stage.
    Stage* old = nullptr;
    for (auto& st : stages_)
      if (st->page >= 0 && (old == nullptr || st->born < old->born)) old = st.get();
    for (int l = 0; l < config_.n_layers; ++l)
      if (!old->quantized[l]) QuantizeLayer(l, old->page, *old);
    DropStage(old->page);
  }
  int32_t i;
  if (!free_stages_.empty()) {
    i = free_stages_.back();
    free_stages_.pop_back();
  } else {
    i = static_cast<int32_t>(stages_.size());
    stages_.push_back(std::make_unique<Stage>());
  }
  Stage& st = *stages_[i];
  const size_t n = static_cast<size_t>(config_.n_layers) * config_.n_kv_heads *
                   config_.page_size * config_.head_dim;
  st.k.assign(n, 0);
  st.v.assign(n, 0);
  st.quantized.assign(config_.n_layers, 0);
  st.layers_left = config_.n_layers;
  st.page = page;
  st.born = ++stage_clock_;
  // Start from what the page holds (zeros for a reset page): a page quantized early to free a
  // stage and written again keeps its earlier tokens.
  const int d = config_.head_dim, ps = config_.page_size;
  for (int l = 0; l < config_.n_layers; ++l)
    for (int h = 0; h < config_.n_kv_heads; ++h) {
      const float* ks = KScale(l, page, h);
      const float vs = VScale(l, page, h);
      if (vs == 0.0f && std::all_of(ks, ks + d, [](float x) { return x == 0.0f; })) continue;
      const int8_t* k8 = K8(l, page, h);
      const int8_t* v8 = V8(l, page, h);
      fp16_t* kd = st.k.data() + StageOffset(l, h);
      fp16_t* vd = st.v.data() + StageOffset(l, h);
      for (int t = 0; t < ps; ++t)
        for (int c = 0; c < d; ++c) {
          kd[t * d + c] = FloatToFp16(static_cast<float>(k8[t * d + c]) * ks[c]);
          vd[t * d + c] = FloatToFp16(static_cast<float>(v8[t * d + c]) * vs);
        }
    }
  stage_of_[page] = i;
  return st;
}

void PagedKvCache::QuantizeLayer(int layer, int32_t page, const Stage& st) {
  const int d = config_.head_dim, ps = config_.page_size;
  for (int h = 0; h < config_.n_kv_heads; ++h) {
    const fp16_t* ks = st.k.data() + StageOffset(layer, h);
    const fp16_t* vs = st.v.data() + StageOffset(layer, h);
    float* kscale = kscale_[layer].data() + MetaOffset(page, h);
    int8_t* k8 = k8_[layer].data() + Offset(page, h);
    int8_t* v8 = v8_[layer].data() + Offset(page, h);
    fp16_t* mn = kmin_[layer].data() + MetaOffset(page, h);
    fp16_t* mx = kmax_[layer].data() + MetaOffset(page, h);
    // K: one scale per channel over the page's rows; the box over the dequantized keys.
    for (int c = 0; c < d; ++c) {
      float amax = 0.0f;
      for (int t = 0; t < ps; ++t) amax = std::max(amax, std::fabs(Fp16ToFloat(ks[t * d + c])));
      const float scale = amax / kQMax;
      kscale[c] = scale;
      float lo = std::numeric_limits<float>::infinity(), hi = -lo;
      for (int t = 0; t < ps; ++t) {
        const float q = scale > 0.0f ? std::nearbyint(Fp16ToFloat(ks[t * d + c]) / scale) : 0.0f;
        k8[t * d + c] = static_cast<int8_t>(std::clamp(q, -kQMax, kQMax));
        const float stored = static_cast<float>(k8[t * d + c]) * scale;  // what attention reads
        lo = std::min(lo, stored);
        hi = std::max(hi, stored);
      }
      // Slots past the written ones are zeros in the stage, so the box may include 0: still a
      // bound of the valid keys. Rounded outwards to fp16.
      mn[c] = FloatToFp16Down(lo);
      mx[c] = FloatToFp16Up(hi);
    }
    // V: one scale for the block.
    float amax = 0.0f;
    for (int i = 0; i < ps * d; ++i) amax = std::max(amax, std::fabs(Fp16ToFloat(vs[i])));
    const float scale = amax / kQMax;
    vscale_[layer][ScaleOffset(page, h)] = scale;
    for (int i = 0; i < ps * d; ++i) {
      const float q = scale > 0.0f ? std::nearbyint(Fp16ToFloat(vs[i]) / scale) : 0.0f;
      v8[i] = static_cast<int8_t>(std::clamp(q, -kQMax, kQMax));
    }
  }
}

void PagedKvCache::WriteToken(int layer, int32_t page, int slot, const float* k, const float* v) {
  const int d = config_.head_dim;
  if (config_.dtype == KvDtype::kInt8) {
    Stage* st = &Staged(page);
    for (int h = 0; h < config_.n_kv_heads; ++h) {
      fp16_t* mn = kmin_[layer].data() + MetaOffset(page, h);
      fp16_t* mx = kmax_[layer].data() + MetaOffset(page, h);
      fp16_t* kd = st->k.data() + StageOffset(layer, h) + static_cast<size_t>(slot) * d;
      fp16_t* vd = st->v.data() + StageOffset(layer, h) + static_cast<size_t>(slot) * d;
      FloatToFp16Row(k + h * d, kd, d);
      FloatToFp16Row(v + h * d, vd, d);
      WidenFp16Box(kd, mn, mx, d);  // read from the stage until quantized
    }
    st->quantized[layer] = 0;  // a re-staged page written again in a quantized layer
    if (slot == config_.page_size - 1) {
      QuantizeLayer(layer, page, *st);
      st->quantized[layer] = 1;
      if (--st->layers_left == 0) DropStage(page);
    }
    return;
  }
  for (int h = 0; h < config_.n_kv_heads; ++h) {
    fp16_t* mn = kmin_[layer].data() + MetaOffset(page, h);
    fp16_t* mx = kmax_[layer].data() + MetaOffset(page, h);
    const float* kh = k + static_cast<size_t>(h) * d;
    const float* vh = v + static_cast<size_t>(h) * d;
    fp16_t* kd = K(layer, page, h) + static_cast<size_t>(slot) * d;
    fp16_t* vd = V(layer, page, h) + static_cast<size_t>(slot) * d;
    FloatToFp16Row(kh, kd, d);
    FloatToFp16Row(vh, vd, d);
    WidenFp16Box(kd, mn, mx, d);  // the box bounds what attention will read
  }
}

void PagedKvCache::TruncatePage(int32_t page, int valid) {
  if (valid <= 0) return ResetPage(page);
  const int d = config_.head_dim;
  const Stage* st = config_.dtype == KvDtype::kInt8 ? StageOf(page) : nullptr;
  if (config_.dtype == KvDtype::kInt8 && st == nullptr) return;  // quantized: nothing staged
  for (int l = 0; l < config_.n_layers; ++l)
    for (int h = 0; h < config_.n_kv_heads; ++h) {
      fp16_t* mn = kmin_[l].data() + MetaOffset(page, h);
      fp16_t* mx = kmax_[l].data() + MetaOffset(page, h);
      std::fill(mn, mn + d, kPosInf);
      std::fill(mx, mx + d, kNegInf);
      const fp16_t* keys = st != nullptr ? st->k.data() + StageOffset(l, h) : K(l, page, h);
      for (int slot = 0; slot < valid; ++slot)
        WidenFp16Box(keys + static_cast<size_t>(slot) * d, mn, mx, d);
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
                m * sizeof(fp16_t));
    std::memcpy(kmax_[l].data() + MetaOffset(dst, 0), kmax_[l].data() + MetaOffset(src, 0),
                m * sizeof(fp16_t));
  }
  if (config_.dtype != KvDtype::kInt8) return;
  DropStage(dst);
  if (const Stage* s = StageOf(src)) {
    // Copied out first: staging dst may have to quantize src to free a stage.
    Stage copy = *s;
    Stage& d = Staged(dst);
    d.k = std::move(copy.k);
    d.v = std::move(copy.v);
    d.quantized = std::move(copy.quantized);
    d.layers_left = copy.layers_left;
  }
}

}  // namespace tinyserve
