#include "worker/kv/paged_kv_cache.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace tinyserve {
namespace {

TEST(PagedKvCache, LayoutAndMetadataBoundStoredKeys) {
  KvCacheConfig c{/*n_layers=*/2, /*n_kv_heads=*/3, /*head_dim=*/8, /*page_size=*/4,
                  /*num_pages=*/5};
  PagedKvCache cache(c);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  const int32_t page = 3;
  cache.ResetPage(page);
  std::vector<float> k(3 * 8), v(3 * 8);
  std::vector<std::vector<float>> keys;
  for (int slot = 0; slot < 3; ++slot) {  // a partial page: 3 of 4 slots
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    cache.WriteToken(1, page, slot, k.data(), v.data());
    keys.push_back(k);
  }
  for (int h = 0; h < 3; ++h) {
    const fp16_t* kp = cache.K(1, page, h);
    for (int slot = 0; slot < 3; ++slot)
      for (int d = 0; d < 8; ++d) {
        const float stored = Fp16ToFloat(kp[slot * 8 + d]);
        EXPECT_NEAR(stored, keys[slot][h * 8 + d], 2e-3f);
        EXPECT_LE(cache.KMin(1, page, h)[d], stored);
        EXPECT_GE(cache.KMax(1, page, h)[d], stored);
      }
    // The box is tight: each bound is attained by some stored key.
    for (int d = 0; d < 8; ++d) {
      bool min_hit = false, max_hit = false;
      for (int slot = 0; slot < 3; ++slot) {
        const float stored = Fp16ToFloat(kp[slot * 8 + d]);
        min_hit |= stored == cache.KMin(1, page, h)[d];
        max_hit |= stored == cache.KMax(1, page, h)[d];
      }
      EXPECT_TRUE(min_hit && max_hit);
    }
  }
  // Layer 0 of the page was not written: its box is empty.
  EXPECT_GT(cache.KMin(0, page, 0)[0], cache.KMax(0, page, 0)[0]);
  cache.ResetPage(page);
  EXPECT_GT(cache.KMin(1, page, 0)[0], cache.KMax(1, page, 0)[0]);
  EXPECT_EQ(cache.BytesPerToken(), 2 * 2 * 3 * 8 * 2);
}

float Dequant(const PagedKvCache& c, bool key, int layer, int32_t page, int h, int slot, int i) {
  const int d = c.config().head_dim;
  return key ? static_cast<float>(c.K8(layer, page, h)[slot * d + i]) * c.KScale(layer, page, h)[i]
             : static_cast<float>(c.V8(layer, page, h)[slot * d + i]) * c.VScale(layer, page, h);
}

// int8 pages: every token grows the magnitude, so the page is re-quantized on most writes.
// A value is within scale / 2 of what was written when written, each re-quantization adds at
// most half of its new scale, the scales are max |x| / 127 (per channel for K, per block for V),
// and the box is tight around the dequantized keys.
TEST(PagedKvCache, Int8RoundTripRescalesAndBox) {
  const int L = 2, H = 3, D = 24, P = 8, N = 6;
  KvCacheConfig c{L, H, D, P, /*num_pages=*/4, KvDtype::kInt8};
  PagedKvCache cache(c);
  EXPECT_EQ(cache.dtype(), KvDtype::kInt8);
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  const int32_t page = 2;
  cache.ResetPage(page);
  std::vector<float> k(H * D), v(H * D);
  std::vector<std::vector<float>> keys, values;
  // Scales after each write [slot][h * D + i] (V: i = 0), to bound earlier tokens' errors.
  std::vector<std::vector<float>> ksc(N, std::vector<float>(H * D)), vsc = ksc;
  for (int slot = 0; slot < N; ++slot) {  // a partial page
    const float grow = 1.0f + slot;      // forces re-quantization
    for (auto& x : k) x = grow * nd(rng);
    for (auto& x : v) x = grow * nd(rng);
    if (slot == 3) k[5] = 0.0f;
    cache.WriteToken(1, page, slot, k.data(), v.data());
    keys.push_back(k);
    values.push_back(v);
    for (int h = 0; h < H; ++h) {
      const float vs = cache.VScale(1, page, h);
      for (int i = 0; i < D; ++i) {
        const float ks = cache.KScale(1, page, h)[i];
        ksc[slot][h * D + i] = ks;
        vsc[slot][h * D + i] = vs;
        // The latest token is quantized at the current scale: half a step.
        EXPECT_LE(std::fabs(Dequant(cache, true, 1, page, h, slot, i) - k[h * D + i]),
                  0.5f * ks * (1 + 1e-5f));
        EXPECT_LE(std::fabs(Dequant(cache, false, 1, page, h, slot, i) - v[h * D + i]),
                  0.5f * vs * (1 + 1e-5f));
      }
    }
  }
  auto bound = [&](const std::vector<std::vector<float>>& sc, int slot, int x) {
    float b = 0.5f * sc[slot][x];
    for (int u = slot + 1; u < N; ++u)
      if (sc[u][x] != sc[u - 1][x]) b += 0.5f * sc[u][x];
    return b * (1 + 1e-5f);
  };
  int rescaled = 0;
  for (int h = 0; h < H; ++h) {
    float vmax_abs = 0;
    for (int slot = 0; slot < N; ++slot)
      for (int i = 0; i < D; ++i) vmax_abs = std::max(vmax_abs, std::fabs(values[slot][h * D + i]));
    EXPECT_FLOAT_EQ(cache.VScale(1, page, h), vmax_abs / 127);
    for (int i = 0; i < D; ++i) {
      float kmax_abs = 0;
      for (int slot = 0; slot < N; ++slot)
        kmax_abs = std::max(kmax_abs, std::fabs(keys[slot][h * D + i]));
      EXPECT_FLOAT_EQ(cache.KScale(1, page, h)[i], kmax_abs / 127);
      rescaled += cache.KScale(1, page, h)[i] != ksc[0][h * D + i];
      bool min_hit = false, max_hit = false;
      for (int slot = 0; slot < N; ++slot) {
        const float kd = Dequant(cache, true, 1, page, h, slot, i);
        EXPECT_LE(std::fabs(kd - keys[slot][h * D + i]), bound(ksc, slot, h * D + i));
        EXPECT_LE(std::fabs(Dequant(cache, false, 1, page, h, slot, i) - values[slot][h * D + i]),
                  bound(vsc, slot, h * D + i));
        EXPECT_LE(cache.KMin(1, page, h)[i], kd);
        EXPECT_GE(cache.KMax(1, page, h)[i], kd);
        min_hit |= kd == cache.KMin(1, page, h)[i];
        max_hit |= kd == cache.KMax(1, page, h)[i];
      }
      EXPECT_TRUE(min_hit && max_hit) << "head " << h << " dim " << i;
    }
  }
  EXPECT_GT(rescaled, H * D / 2);  // most channels were re-quantized at least once
  // Copy-on-write keeps data, scales and box.
  cache.ResetPage(3);
  cache.CopyPage(page, 3);
  for (int h = 0; h < H; ++h) {
    EXPECT_EQ(cache.KScale(1, 3, h)[4], cache.KScale(1, page, h)[4]);
    EXPECT_EQ(cache.VScale(1, 3, h), cache.VScale(1, page, h));
    EXPECT_EQ(cache.K8(1, 3, h)[5], cache.K8(1, page, h)[5]);
    EXPECT_EQ(cache.KMin(1, 3, h)[7], cache.KMin(1, page, h)[7]);
  }
  // A reset page starts over: scales 0, empty box; an all-zero token stays zero.
  cache.ResetPage(page);
  EXPECT_EQ(cache.KScale(1, page, 0)[0], 0.0f);
  EXPECT_EQ(cache.VScale(1, page, 0), 0.0f);
  EXPECT_GT(cache.KMin(1, page, 0)[0], cache.KMax(1, page, 0)[0]);
  std::vector<float> zero(H * D, 0.0f);
  cache.WriteToken(1, page, 0, zero.data(), zero.data());
  EXPECT_EQ(cache.KScale(1, page, 0)[0], 0.0f);
  EXPECT_EQ(Dequant(cache, true, 1, page, 0, 0, 0), 0.0f);
  EXPECT_EQ(cache.KMin(1, page, 0)[0], 0.0f);
}

TEST(PagedKvCache, Int8HalvesKvBytes) {
  KvCacheConfig f16{30, 3, 64, 16, 1};
  KvCacheConfig i8 = f16;
  i8.dtype = KvDtype::kInt8;
  EXPECT_EQ(PagedKvCache(f16).BytesPerToken(), 23040);  // SmolLM2-135M
  EXPECT_EQ(PagedKvCache(i8).BytesPerToken(), 11520);
  // Per page: K+V, the fp32 box and (int8) fp32 scales: one per K channel, one for V.
  EXPECT_EQ(PagedKvCache::BytesForPages(f16, 1), 16 * 23040 + 2 * 30 * 3 * 64 * 4);
  EXPECT_EQ(PagedKvCache::BytesForPages(i8, 1),
            16 * 11520 + 2 * 30 * 3 * 64 * 4 + 30 * 3 * (64 + 1) * 4);
}

}  // namespace
}  // namespace tinyserve
