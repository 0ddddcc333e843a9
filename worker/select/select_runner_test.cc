// Selection inside the real runner (stories260K): when the context fits the budget a policy's
// decode step is bit-identical to dense; with a small budget it attends fewer tokens and differs.
#include <cstring>

#include "common/paths.h"
#include "common/thread_pool.h"
#include "gtest/gtest.h"
#include "worker/model/weight_source.h"
#include "worker/runner/transformer.h"
#include "worker/select/selector.h"
#include "worker/tokenizer/tokenizer.h"

namespace tinyserve {
namespace {

TEST(SelectionInRunner, DenseWhenTheContextFitsAndSparseOtherwise) {
  auto src = OpenWeightSource(Stories260kPath());
  ASSERT_TRUE(src.ok());
  auto tok = Tokenizer::Create((*src)->tokenizer_data());
  RunnerOptions ro;
  auto runner = TransformerRunner::Create(**src, ro);
  ASSERT_TRUE(runner.ok());
  TransformerRunner& r = **runner;
  std::vector<int32_t> ids = (*tok)->Encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high. "
      "Lily's mom said, \"Let's go home.\" Lily was sad. She did not want to go home.",
      false, true);
  ASSERT_GT(ids.size(), 60u);
  const int ps = 8;
  const int n = static_cast<int>(ids.size());
  auto decode_last = [&](const SelectionSpec* spec, StepStats* step) {
    PagedKvCache kv(r.MakeKvConfig(ps, (n + ps - 1) / ps));
    std::vector<int32_t> pages;
    for (int p = 0; p < (n + ps - 1) / ps; ++p) {
      pages.push_back(p);
      kv.ResetPage(p);
    }
    std::vector<float> logits;
    SeqInput pre;
    pre.tokens = ids.data();
    pre.n = n - 1;
    pre.pages = &pages;
    EXPECT_TRUE(r.Forward({pre}, &kv, &logits).ok());
    std::unique_ptr<Policy> pol;
    SeqInput dec;
    dec.tokens = &ids[n - 1];
    dec.n = 1;
    dec.start_pos = n - 1;
    dec.pages = &pages;
    if (spec) {
      PolicyContext c;
      c.n_layers = r.config().n_layers;
      c.n_kv_heads = r.local_kv_heads();
      c.head_dim = r.config().head_dim;
      c.page_size = ps;
      c.kv_bytes_per_token_head_layer = 4 * c.head_dim;
      auto p = CreatePolicy(*spec, c);
      EXPECT_TRUE(p.ok());
      pol = std::move(*p);
      pol->BeginStep(n);
      dec.selector = pol.get();
    }
    EXPECT_TRUE(r.Forward({dec}, &kv, &logits).ok());
    if (pol) {
      pol->EndStep();
      *step = pol->last_step();
    }
    return logits;
  };
  StepStats st;
  const std::vector<float> dense = decode_last(nullptr, &st);
  for (const std::string& name : PolicyNames()) {
    SelectionSpec big;
    big.policy = name;
    big.budget = 1024;  // 128 pages > the context's pages
    big.dense_layers = 0;
    const std::vector<float> same = decode_last(&big, &st);
    ASSERT_EQ(same.size(), dense.size());
    EXPECT_EQ(std::memcmp(same.data(), dense.data(), dense.size() * sizeof(float)), 0) << name;
    if (name == "dense") continue;
    SelectionSpec small = big;
    small.budget = 16;  // 2 pages of 8
    const std::vector<float> sparse = decode_last(&small, &st);
    EXPECT_NE(std::memcmp(sparse.data(), dense.data(), dense.size() * sizeof(float)), 0) << name;
    EXPECT_LT(st.kv_bytes_read, st.kv_bytes_dense) << name;
    EXPECT_EQ(st.pages_selected, 2LL * r.config().n_layers * r.local_kv_heads()) << name;
  }
}

// A verification (SeqInput::decode_rows) with a selector: each row selects and attends as its
// own decode step would, bit for bit, with attention split into parts and without; the rows'
// statistics are the steps'.
TEST(SelectionInRunner, VerifiedRowsSelectAsTheirOwnDecodeSteps) {
  auto src = OpenWeightSource(Stories260kPath());
  ASSERT_TRUE(src.ok());
  std::vector<int32_t> ids;
  for (int i = 0; i < 90; ++i) ids.push_back((i * 37 + 11) % 250 + 3);
  const int ps = 8, prefix = 70, n = static_cast<int>(ids.size());
  ThreadPool pool(2);
  for (const char* name : {"quest", "streaming", "oracle"})
    for (int part_pages : {64, 2}) {
      SCOPED_TRACE(std::string(name) + " parts of " + std::to_string(part_pages));
      RunnerOptions ro;
      ro.attention_part_pages = part_pages;
      ro.pool = &pool;
      auto runner = TransformerRunner::Create(**src, ro);
      ASSERT_TRUE(runner.ok());
      TransformerRunner& r = **runner;
      SelectionSpec spec;
      spec.policy = name;
      spec.budget = 40;  // 5 pages of 8: more than a part of 2
      spec.dense_layers = 1;
      PolicyContext c = MakePolicyContext(r.config(), r.local_kv_heads(), ps, KvDtype::kF16, 1);
      ASSERT_TRUE(CreatePolicy(spec, c).ok());
      ASSERT_TRUE((*CreatePolicy(spec, c))->SelectsPerRow());
      // Decodes ids[prefix, n) one step at a time, or as one verification of all its rows.
      auto decode = [&](bool as_rows, std::vector<StepStats>* steps) {
        PagedKvCache kv(r.MakeKvConfig(ps, (n + ps - 1) / ps));
        std::vector<int32_t> pages;
        for (int p = 0; p < (n + ps - 1) / ps; ++p) {
          pages.push_back(p);
          kv.ResetPage(p);
        }
        std::unique_ptr<Policy> pol = *CreatePolicy(spec, c);
        std::vector<float> logits, all;
        auto run = [&](int start, int rows, bool decode_rows, bool select) {
          SeqInput in;
          in.tokens = &ids[start];
          in.n = rows;
          in.start_pos = start;
          in.pages = &pages;
          in.all_logits = in.decode_rows = decode_rows;
          if (select) {
            pol->BeginStep(start + 1, rows);
            in.selector = pol.get();
          }
          EXPECT_TRUE(r.Forward({in}, &kv, &logits).ok());
        };
        run(0, prefix, false, false);
        if (as_rows) {
          run(prefix, n - prefix, true, true);
          for (int row = 0; row < n - prefix; ++row) {
            pol->EndRow(row);
            steps->push_back(pol->last_step());
          }
          return logits;
        }
        for (int t = prefix; t < n; ++t) {
          run(t, 1, false, true);
          pol->EndStep();
          steps->push_back(pol->last_step());
          all.insert(all.end(), logits.begin(), logits.end());
        }
        return all;
      };
      std::vector<StepStats> step_stats, row_stats;
      const std::vector<float> steps = decode(false, &step_stats);
      const std::vector<float> rows = decode(true, &row_stats);
      ASSERT_EQ(rows.size(), steps.size());
      EXPECT_TRUE(rows == steps);
      ASSERT_EQ(row_stats.size(), step_stats.size());
      for (size_t i = 0; i < row_stats.size(); ++i) {
        EXPECT_EQ(row_stats[i].pages_selected, step_stats[i].pages_selected) << i;
        EXPECT_EQ(row_stats[i].pages_scored, step_stats[i].pages_scored) << i;
        EXPECT_EQ(row_stats[i].kv_bytes_read, step_stats[i].kv_bytes_read) << i;
        EXPECT_LT(row_stats[i].pages_selected, row_stats[i].pages_total) << i;
      }
    }
  // Policies whose choice carries state from step to step cannot select per row.
  for (const char* name : {"random", "h2o", "snapkv"}) {
    SelectionSpec spec;
    spec.policy = name;
    PolicyContext c;
    c.n_layers = 2;
    c.n_kv_heads = 1;
    c.head_dim = 8;
    c.kv_bytes_per_token_head_layer = 32;
    EXPECT_FALSE((*CreatePolicy(spec, c))->SelectsPerRow()) << name;
  }
  SelectionSpec sampled;
  sampled.policy = "quest";
  sampled.oracle_every = 8;
  PolicyContext c;
  c.n_layers = 2;
  c.n_kv_heads = 1;
  c.head_dim = 8;
  c.kv_bytes_per_token_head_layer = 32;
  EXPECT_FALSE((*CreatePolicy(sampled, c))->SelectsPerRow());
}

}  // namespace
}  // namespace tinyserve
