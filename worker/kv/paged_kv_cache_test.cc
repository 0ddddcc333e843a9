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
        EXPECT_LE(Fp16ToFloat(cache.KMin(1, page, h)[d]), stored);
        EXPECT_GE(Fp16ToFloat(cache.KMax(1, page, h)[d]), stored);
      }
    // The box is tight: each bound is attained by some stored key.
    for (int d = 0; d < 8; ++d) {
      bool min_hit = false, max_hit = false;
      for (int slot = 0; slot < 3; ++slot) {
        const float stored = Fp16ToFloat(kp[slot * 8 + d]);
        min_hit |= stored == Fp16ToFloat(cache.KMin(1, page, h)[d]);
        max_hit |= stored == Fp16ToFloat(cache.KMax(1, page, h)[d]);
      }
      EXPECT_TRUE(min_hit && max_hit);
    }
  }
  // Layer 0 of the page was not written: its box is empty.
  EXPECT_GT(Fp16ToFloat(cache.KMin(0, page, 0)[0]), Fp16ToFloat(cache.KMax(0, page, 0)[0]));
  cache.ResetPage(page);
  EXPECT_GT(Fp16ToFloat(cache.KMin(1, page, 0)[0]), Fp16ToFloat(cache.KMax(1, page, 0)[0]));
  EXPECT_EQ(cache.BytesPerToken(), 2 * 2 * 3 * 8 * 2);
}

float Dequant(const PagedKvCache& c, bool key, int layer, int32_t page, int h, int slot, int i) {
  const int d = c.config().head_dim;
  return key ? static_cast<float>(c.K8(layer, page, h)[slot * d + i]) * c.KScale(layer, page, h)[i]
             : static_cast<float>(c.V8(layer, page, h)[slot * d + i]) * c.VScale(layer, page, h);
}

// int8 pages are staged in fp16 while being filled and quantized once, when the last slot is
// written in a layer: per-channel K scales and one V scale of the whole page (max |x| / 127),
// every value within half a step of its fp16 value, the box tight around the dequantized keys.
TEST(PagedKvCache, Int8PagesAreStagedThenQuantizedOnce) {
  const int L = 2, H = 3, D = 24, P = 8;
  KvCacheConfig c{L, H, D, P, /*num_pages=*/4, KvDtype::kInt8};
  PagedKvCache cache(c);
  EXPECT_EQ(cache.dtype(), KvDtype::kInt8);
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  const int32_t page = 2;
  cache.ResetPage(page);
  std::vector<float> k(H * D), v(H * D);
  std::vector<std::vector<float>> keys, values;  // fp16-rounded, as staged
  auto r16 = [](float x) { return Fp16ToFloat(FloatToFp16(x)); };
  for (int slot = 0; slot < P; ++slot) {
    const float grow = 1.0f + slot;  // later tokens are larger: scales are the page's final ones
    for (auto& x : k) x = grow * nd(rng);
    for (auto& x : v) x = grow * nd(rng);
    if (slot == 3) k[5] = 0.0f;
    std::vector<float> k16(k.size()), v16(v.size());
    for (size_t i = 0; i < k.size(); ++i) k16[i] = r16(k[i]), v16[i] = r16(v[i]);
    keys.push_back(k16);
    values.push_back(v16);
    for (int l = 0; l < L; ++l) cache.WriteToken(l, page, slot, k.data(), v.data());
    if (slot < P - 1) {
      // Partial: read from the stage, exactly the fp16 values; the box bounds them.
      ASSERT_EQ(cache.staged_pages(), 1);
      for (int h = 0; h < H; ++h) {
        const fp16_t* sk = cache.StagedK(1, page, h);
        const fp16_t* sv = cache.StagedV(1, page, h);
        ASSERT_NE(sk, nullptr);
        for (int i = 0; i < D; ++i) {
          EXPECT_EQ(Fp16ToFloat(sk[slot * D + i]), k16[h * D + i]);
          EXPECT_EQ(Fp16ToFloat(sv[slot * D + i]), v16[h * D + i]);
          EXPECT_LE(Fp16ToFloat(cache.KMin(1, page, h)[i]), k16[h * D + i]);
          EXPECT_GE(Fp16ToFloat(cache.KMax(1, page, h)[i]), k16[h * D + i]);
        }
      }
    }
  }
  // Full in every layer: quantized, stage released.
  EXPECT_EQ(cache.staged_pages(), 0);
  for (int h = 0; h < H; ++h) {
    EXPECT_EQ(cache.StagedK(1, page, h), nullptr);
    float vmax_abs = 0;
    for (int slot = 0; slot < P; ++slot)
      for (int i = 0; i < D; ++i) vmax_abs = std::max(vmax_abs, std::fabs(values[slot][h * D + i]));
    const float vs = cache.VScale(1, page, h);
    EXPECT_FLOAT_EQ(vs, vmax_abs / 127);
    for (int i = 0; i < D; ++i) {
      float kmax_abs = 0;
      for (int slot = 0; slot < P; ++slot) kmax_abs = std::max(kmax_abs, std::fabs(keys[slot][h * D + i]));
      const float ks = cache.KScale(1, page, h)[i];
      EXPECT_FLOAT_EQ(ks, kmax_abs / 127);
      // The fp16 box is the dequantized keys' min and max rounded outwards.
      float lo = 1e30f, hi = -1e30f;
      for (int slot = 0; slot < P; ++slot) {
        const float kd = Dequant(cache, true, 1, page, h, slot, i);
        EXPECT_LE(std::fabs(kd - keys[slot][h * D + i]), 0.5f * ks * (1 + 1e-5f));
        EXPECT_LE(std::fabs(Dequant(cache, false, 1, page, h, slot, i) - values[slot][h * D + i]),
                  0.5f * vs * (1 + 1e-5f));
        lo = std::min(lo, kd);
        hi = std::max(hi, kd);
      }
      EXPECT_EQ(cache.KMin(1, page, h)[i], FloatToFp16Down(lo)) << "head " << h << " dim " << i;
      EXPECT_EQ(cache.KMax(1, page, h)[i], FloatToFp16Up(hi)) << "head " << h << " dim " << i;
    }
  }
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
  EXPECT_GT(Fp16ToFloat(cache.KMin(1, page, 0)[0]), Fp16ToFloat(cache.KMax(1, page, 0)[0]));
  std::vector<float> zero(H * D, 0.0f);
  cache.WriteToken(1, page, 0, zero.data(), zero.data());
  EXPECT_EQ(Fp16ToFloat(cache.StagedK(1, page, 0)[0]), 0.0f);
  EXPECT_EQ(Fp16ToFloat(cache.KMin(1, page, 0)[0]), 0.0f);
  cache.ResetPage(page);
  EXPECT_EQ(cache.staged_pages(), 0);
}

// Stages are bounded: past max_staged_pages the oldest staged page is quantized as it is and,
// written again, staged again from its dequantized values; a partial page copies its stage.
TEST(PagedKvCache, Int8StageBoundAndCopyOfAPartialPage) {
  const int L = 1, H = 2, D = 16, P = 8;
  KvCacheConfig c{L, H, D, P, /*num_pages=*/6, KvDtype::kInt8};
  c.max_staged_pages = 2;
  PagedKvCache cache(c);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> k(H * D), v(H * D);
  auto fill = [&] {
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
  };
  for (int32_t p = 0; p < 6; ++p) cache.ResetPage(p);
  fill();
  cache.WriteToken(0, 0, 0, k.data(), v.data());
  const std::vector<float> k0 = k;
  fill();
  cache.WriteToken(0, 1, 0, k.data(), v.data());
  EXPECT_EQ(cache.staged_pages(), 2);
  fill();
  cache.WriteToken(0, 2, 0, k.data(), v.data());  // page 0 (oldest) is quantized to make room
  EXPECT_EQ(cache.staged_pages(), 2);
  EXPECT_EQ(cache.StagedK(0, 0, 0), nullptr);
  EXPECT_NE(cache.StagedK(0, 1, 0), nullptr);
  for (int i = 0; i < D; ++i)
    EXPECT_LE(std::fabs(Dequant(cache, true, 0, 0, 0, 0, i) - k0[i]),
              0.5f * cache.KScale(0, 0, 0)[i] + 1e-3f * std::fabs(k0[i]));
  // Page 0 written again: staged again (evicting page 1), keeping its first token.
  fill();
  cache.WriteToken(0, 0, 1, k.data(), v.data());
  const fp16_t* s0 = cache.StagedK(0, 0, 0);
  ASSERT_NE(s0, nullptr);
  EXPECT_EQ(cache.StagedK(0, 1, 0), nullptr);
  for (int i = 0; i < D; ++i) {
    EXPECT_NEAR(Fp16ToFloat(s0[i]), k0[i], 0.5f * cache.KScale(0, 0, 0)[i] + 2e-3f * std::fabs(k0[i]));
    EXPECT_EQ(Fp16ToFloat(s0[D + i]), Fp16ToFloat(FloatToFp16(k[i])));
  }
  // Copy of a partial (staged) page: the copy is staged with the same values (page 2, the
  // oldest stage, is quantized to make room).
  cache.CopyPage(0, 5);
  const fp16_t* s5 = cache.StagedK(0, 5, 0);
  s0 = cache.StagedK(0, 0, 0);
  ASSERT_NE(s5, nullptr);
  ASSERT_NE(s0, nullptr);
  EXPECT_EQ(cache.StagedK(0, 2, 0), nullptr);
  for (int i = 0; i < P * D; ++i) EXPECT_EQ(s5[i], s0[i]);
}

TEST(PagedKvCache, Int8HalvesKvBytes) {
  KvCacheConfig f16{30, 3, 64, 16, 1};
  KvCacheConfig i8 = f16;
  i8.dtype = KvDtype::kInt8;
  EXPECT_EQ(PagedKvCache(f16).BytesPerToken(), 23040);  // SmolLM2-135M
  EXPECT_EQ(PagedKvCache(i8).BytesPerToken(), 11520);
  // Per page: K+V, the fp16 box and (int8) fp32 scales: one per K channel, one for V.
  EXPECT_EQ(PagedKvCache::BytesForPages(f16, 1), 16 * 23040 + 2 * 30 * 3 * 64 * 2);
  EXPECT_EQ(PagedKvCache::BytesForPages(i8, 1),
            16 * 11520 + 2 * 30 * 3 * 64 * 2 + 30 * 3 * (64 + 1) * 4);
}

}  // namespace
}  // namespace tinyserve

namespace tinyserve {
namespace {

// Speculative tokens that were rejected are forgotten: the page's box (and, for int8, what the
// page quantizes to once filled) is what writing only the kept slots gives.
TEST(PagedKvCache, TruncatePageForgetsRejectedSlots) {
  for (KvDtype dtype : {KvDtype::kF16, KvDtype::kInt8}) {
    SCOPED_TRACE(KvDtypeName(dtype));
    const int L = 2, H = 2, D = 16, P = 8;
    KvCacheConfig c{L, H, D, P, /*num_pages=*/4, dtype};
    PagedKvCache cache(c);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    std::vector<std::vector<float>> k(P, std::vector<float>(H * D)), v = k;
    for (int s = 0; s < P; ++s)
      for (int i = 0; i < H * D; ++i) {
        k[s][i] = nd(rng);
        v[s][i] = nd(rng);
      }
    std::vector<float> junk(H * D, 40.0f);  // a rejected token's keys, far outside the box
    // Page 1: slots 0..2 kept, 3..5 rejected and forgotten, then 3..7 written for real.
    // Page 2: 0..7 written straight.
    cache.ResetPage(1);
    cache.ResetPage(2);
    for (int l = 0; l < L; ++l) {
      for (int s = 0; s < 3; ++s) cache.WriteToken(l, 1, s, k[s].data(), v[s].data());
      for (int s = 3; s < 6; ++s) cache.WriteToken(l, 1, s, junk.data(), junk.data());
    }
    cache.TruncatePage(1, 3);
    for (int l = 0; l < L; ++l)
      for (int s = 0; s < 3; ++s) cache.WriteToken(l, 2, s, k[s].data(), v[s].data());
    auto same_box = [&] {
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h)
          for (int d = 0; d < D; ++d) {
            EXPECT_EQ(cache.KMin(l, 1, h)[d], cache.KMin(l, 2, h)[d]);
            EXPECT_EQ(cache.KMax(l, 1, h)[d], cache.KMax(l, 2, h)[d]);
          }
    };
    same_box();
    for (int l = 0; l < L; ++l)
      for (int s = 3; s < P; ++s) {
        cache.WriteToken(l, 1, s, k[s].data(), v[s].data());
        cache.WriteToken(l, 2, s, k[s].data(), v[s].data());
      }
    same_box();
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < P * D; ++i) {
          if (dtype == KvDtype::kF16) {
            EXPECT_EQ(cache.K(l, 1, h)[i], cache.K(l, 2, h)[i]);
          } else {
            EXPECT_EQ(cache.K8(l, 1, h)[i], cache.K8(l, 2, h)[i]);
            EXPECT_EQ(cache.V8(l, 1, h)[i], cache.V8(l, 2, h)[i]);
          }
        }
    // Keeping nothing empties the box.
    cache.TruncatePage(2, 0);
    EXPECT_GT(Fp16ToFloat(cache.KMin(0, 2, 0)[0]), Fp16ToFloat(cache.KMax(0, 2, 0)[0]));
  }
}

}  // namespace
}  // namespace tinyserve
