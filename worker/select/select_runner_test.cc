// Selection inside the real runner (stories260K): when the context fits the budget a policy's
// decode step is bit-identical to dense; with a small budget it attends fewer tokens and differs.
#include <cstring>

#include "common/paths.h"
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

}  // namespace
}  // namespace tinyserve
