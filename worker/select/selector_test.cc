#include "worker/select/selector.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "worker/kv/paged_kv_cache.h"

namespace tinyserve {
namespace {

// A synthetic cache: one layer group of random keys and values, pages in order.
struct Synthetic {
  Synthetic(int layers, int heads, int d, int ps, int64_t n_tokens, uint32_t seed)
      : cfg{layers, heads, d, ps, (n_tokens + ps - 1) / ps}, kv(cfg), n_tokens(n_tokens) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0, 1);
    std::vector<float> k(heads * d), v(heads * d);
    for (int64_t p = 0; p < cfg.num_pages; ++p) {
      pages.push_back(static_cast<int32_t>(p));
      kv.ResetPage(static_cast<int32_t>(p));
    }
    for (int l = 0; l < layers; ++l)
      for (int64_t t = 0; t < n_tokens; ++t) {
        // Some pages get a strong direction so that rankings are not flat.
        const float bias = (t / ps) % 7 == 3 ? 2.0f : 0.0f;
        for (auto& x : k) x = nd(rng) + bias;
        for (auto& x : v) x = nd(rng);
        kv.WriteToken(l, pages[t / ps], static_cast<int>(t % ps), k.data(), v.data());
      }
  }
  SelectArgs Args(int layer, int head, const float* q, int group) const {
    SelectArgs a;
    a.layer = layer;
    a.kv_head = head;
    a.q = q;
    a.group = group;
    a.head_dim = cfg.head_dim;
    a.pages = &pages;
    a.n_tokens = n_tokens;
    a.page_size = cfg.page_size;
    a.kv = &kv;
    return a;
  }
  KvCacheConfig cfg;
  PagedKvCache kv;
  std::vector<int32_t> pages;
  int64_t n_tokens;
};

PolicyContext Ctx(const Synthetic& s) {
  PolicyContext c;
  c.n_layers = s.cfg.n_layers;
  c.n_kv_heads = s.cfg.n_kv_heads;
  c.head_dim = s.cfg.head_dim;
  c.page_size = s.cfg.page_size;
  c.kv_bytes_per_token_head_layer = 2 * s.cfg.head_dim * 2;
  c.seed = 11;
  return c;
}

TEST(QuestScore, BoundsEveryKeyInItsPage) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 2);
  for (int trial = 0; trial < 50; ++trial) {
    const int d = trial % 2 ? 64 : 8, ps = 1 + trial % 32;
    Synthetic s(1, 2, d, ps, ps * 3 - trial % ps, 100 + trial);
    std::vector<float> q(d);
    for (auto& x : q) x = nd(rng);
    for (int h = 0; h < 2; ++h)
      for (int64_t t = 0; t < s.n_tokens; ++t) {
        const int32_t page = s.pages[t / ps];
        const fp16_t* k = s.kv.K(0, page, h) + (t % ps) * d;
        double dot = 0;
        for (int i = 0; i < d; ++i) dot += q[i] * Fp16ToFloat(k[i]);
        const float bound = QuestScore(q.data(), s.kv.KMin(0, page, h), s.kv.KMax(0, page, h), d);
        EXPECT_GE(bound + 1e-4f * (1 + std::fabs(bound)), dot) << "trial " << trial << " t " << t;
      }
  }
}

TEST(Policies, BudgetObeyedCurrentPageChosenSortedUnique) {
  const int d = 16, ps = 8, group = 3;
  Synthetic s(3, 2, d, ps, 8 * 37 + 5, 9);
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  std::vector<float> q(group * d);
  for (auto& x : q) x = nd(rng);
  for (const std::string& name : PolicyNames()) {
    for (int budget : {ps, 4 * ps, 10 * ps, 1000 * ps}) {
      for (int sinks : {0, 1}) {
        SelectionSpec spec;
        spec.policy = name;
        spec.budget = budget;
        spec.dense_layers = 1;
        spec.sink_pages = budget / ps > 2 ? sinks : 0;
        spec.recent_pages = budget / ps > 3 ? 1 : 0;
        spec.oracle_every = 1;
        auto p = CreatePolicy(spec, Ctx(s));
        ASSERT_TRUE(p.ok()) << p.status();
        Policy& pol = **p;
        EXPECT_FALSE(pol.Active(0));  // the first dense_layers are dense
        const int64_t n_pages = s.pages.size();
        for (int step = 0; step < 3; ++step) {
          pol.BeginStep(s.n_tokens);
          for (int layer = 1; layer < 3; ++layer) {
            if (!pol.Active(layer)) continue;
            for (int h = 0; h < 2; ++h) {
              std::vector<int32_t> chosen;
              pol.Select(s.Args(layer, h, q.data(), group), &chosen);
              ASSERT_FALSE(chosen.empty());
              EXPECT_TRUE(std::is_sorted(chosen.begin(), chosen.end()));
              EXPECT_EQ(std::adjacent_find(chosen.begin(), chosen.end()), chosen.end());
              EXPECT_EQ(chosen.back(), n_pages - 1) << name;  // the current page
              EXPECT_LE(static_cast<int64_t>(chosen.size()), std::max<int64_t>(budget / ps, 1)) << name;
              if (n_pages <= budget / ps) {
                EXPECT_EQ(static_cast<int64_t>(chosen.size()), n_pages) << name;  // dense when it fits
              } else if (name != "dense") {
                EXPECT_EQ(static_cast<int>(chosen.size()), budget / ps) << name;  // budget used
              }
              if (spec.sink_pages > 0) {
                EXPECT_EQ(chosen.front(), 0) << name;
              }
            }
          }
          pol.EndStep();
        }
        if (name != "dense" && n_pages > budget / ps) {
          EXPECT_GT(pol.stats().total.oracle_samples, 0) << name;
          EXPECT_LT(pol.stats().total.kv_bytes_read, pol.stats().total.kv_bytes_dense) << name;
        }
      }
    }
  }
}

TEST(Policies, OracleIsTheUpperBoundOfMassRecall) {
  const int d = 16, ps = 8, group = 2;
  Synthetic s(1, 1, d, ps, 8 * 40, 21);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> q(group * d);
  for (auto& x : q) x = nd(rng) * 2;
  auto recall = [&](const std::string& name) {
    SelectionSpec spec;
    spec.policy = name;
    spec.budget = 6 * ps;
    spec.dense_layers = 0;
    spec.oracle_every = 1;
    auto p = CreatePolicy(spec, Ctx(s));
    std::vector<int32_t> chosen;
    (*p)->BeginStep(s.n_tokens);
    (*p)->Select(s.Args(0, 0, q.data(), group), &chosen);
    (*p)->EndStep();
    return (*p)->stats();
  };
  const SelectionStats oracle = recall("oracle");
  EXPECT_NEAR(oracle.PageHitRate(), 1.0, 1e-9);
  for (const char* name : {"quest", "streaming", "random", "h2o", "snapkv"})
    EXPECT_LE(recall(name).MassRecall(), oracle.MassRecall() + 1e-6) << name;
  // Quest should beat the random floor on structured data.
  EXPECT_GT(recall("quest").MassRecall(), recall("random").MassRecall());
}

TEST(Policies, StreamingKeepsSinksAndWindow) {
  Synthetic s(1, 1, 8, 4, 4 * 20, 5);
  std::vector<float> q(8, 1.0f);
  SelectionSpec spec;
  spec.policy = "streaming";
  spec.budget = 4 * 5;
  spec.dense_layers = 0;
  spec.sink_pages = 1;
  auto p = CreatePolicy(spec, Ctx(s));
  std::vector<int32_t> chosen;
  (*p)->BeginStep(s.n_tokens);
  (*p)->Select(s.Args(0, 0, q.data(), 1), &chosen);
  EXPECT_EQ(chosen, (std::vector<int32_t>{0, 16, 17, 18, 19}));
}

TEST(Policies, DeterministicForTheSameSeed) {
  Synthetic s(1, 1, 8, 4, 4 * 30, 5);
  std::vector<float> q(8, 0.5f);
  auto pick = [&](const std::string& name) {
    SelectionSpec spec;
    spec.policy = name;
    spec.budget = 16;
    spec.dense_layers = 0;
    auto p = CreatePolicy(spec, Ctx(s));
    std::vector<int32_t> chosen;
    (*p)->BeginStep(s.n_tokens);
    (*p)->Select(s.Args(0, 0, q.data(), 1), &chosen);
    return chosen;
  };
  for (const std::string& name : PolicyNames()) EXPECT_EQ(pick(name), pick(name)) << name;
}

TEST(Policies, QuestStaysDenseWhenTheBoxesWouldCostMoreThanTheySave) {
  // 16 tokens per page, fp16 K/V and fp16 boxes: a box costs 1 of 16 token-equivalents per
  // page, so with a budget of 15 pages selection pays only past 15 * 16 / 15 = 16 pages.
  for (int64_t pages : {16, 17}) {
    Synthetic s(1, 1, 8, 16, 16 * pages, 3);
    std::vector<float> q(8, 0.5f);
    SelectionSpec spec;
    spec.policy = "quest";
    spec.budget = 15 * 16;
    spec.dense_layers = 0;
    auto p = CreatePolicy(spec, Ctx(s));
    std::vector<int32_t> chosen;
    (*p)->BeginStep(s.n_tokens);
    (*p)->Select(s.Args(0, 0, q.data(), 1), &chosen);
    (*p)->EndStep();
    EXPECT_EQ(static_cast<int64_t>(chosen.size()), pages == 16 ? 16 : 15) << pages;
    EXPECT_LE((*p)->stats().total.kv_bytes_read, (*p)->stats().total.kv_bytes_dense);
  }
}

// Sliding-window layers (Gemma 3) never select and count their window, not the context, on
// both sides of the bytes ratio.
TEST(Policies, SlidingLayersAreDenseOverTheirWindow) {
  PolicyContext c;
  c.n_layers = 3;
  c.n_kv_heads = 1;
  c.head_dim = 8;
  c.page_size = 16;
  c.kv_bytes_per_token_head_layer = 32;
  c.sliding_window = 8;
  c.sliding = {true, false, true};
  SelectionSpec spec;
  spec.policy = "quest";
  spec.budget = 10 * 16;
  spec.dense_layers = 0;
  auto p = CreatePolicy(spec, c);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE((*p)->Active(0));
  EXPECT_TRUE((*p)->Active(1));
  EXPECT_FALSE((*p)->Active(2));
  (*p)->BeginStep(100);  // no Select on layer 1: only the sliding layers' 8 + 8 tokens
  (*p)->EndStep();
  EXPECT_EQ((*p)->last_step().kv_bytes_dense, 16 * 32);
  EXPECT_EQ((*p)->last_step().kv_bytes_read, 16 * 32);
  (*p)->RecordDenseStep(100);
  EXPECT_EQ((*p)->last_step().kv_bytes_read, (8 + 100 + 8) * 32);
  EXPECT_DOUBLE_EQ((*p)->AttendedTokens(100), (8 + 100 + 8) / 3.0);
}

TEST(SelectionSpec, ErrorsNameTheField) {
  SelectionSpec spec;
  spec.policy = "nope";
  auto s = ValidateSelectionSpec(spec, 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("selection.policy"), std::string::npos);
  spec.policy = "quest";
  spec.budget = 4;
  EXPECT_NE(ValidateSelectionSpec(spec, 16).message().find("selection.budget"), std::string::npos);
  spec.budget = 256;
  spec.params["gqa"] = "mean";
  EXPECT_NE(ValidateSelectionSpec(spec, 16).message().find("gqa"), std::string::npos);
  spec.params = {{"bogus", "1"}};
  EXPECT_NE(ValidateSelectionSpec(spec, 16).message().find("bogus"), std::string::npos);
  spec.params = {{"gqa", "sum"}};
  EXPECT_TRUE(ValidateSelectionSpec(spec, 16).ok());
}

}  // namespace
}  // namespace tinyserve
