#include "worker/kv/paged_kv_cache.h"

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

}  // namespace
}  // namespace tinyserve
