// The host half of DeviceModel::Forward (step_plan.h), on the CPU: row order and decode groups,
// what the kernels read, logits rows back in batch order, written pages, refusals.
#include "kernels/cuda/step_plan.h"

#include <gtest/gtest.h>

namespace tinyserve::cuda {
namespace {

StepLimits Limits() {
  StepLimits l;
  l.max_batch = 4;
  l.max_tokens = 64;
  l.max_pages_per_seq = 4;
  l.page_size = 4;
  l.num_pages = 32;
  l.vocab = 100;
  return l;
}

struct Seq {
  std::vector<int32_t> tokens, pages;
};

DeviceSeq In(const Seq& s, int start, int n, bool all = false, DeviceAttention att = {}) {
  DeviceSeq d;
  d.tokens = s.tokens.data() + start;
  d.n = n;
  d.start_pos = start;
  d.pages = s.pages.data();
  d.n_pages = static_cast<int>(s.pages.size());
  d.all_logits = all;
  d.attention = att;
  return d;
}

TEST(StepPlanTest, DecodeGroupsFirstThenPrefillAndLogitsInBatchOrder) {
  DeviceAttention quest;
  quest.quest = true;
  quest.budget_pages = 2;
  const Seq a{{1, 2, 3, 4, 5, 6, 7}, {10, 11}};     // prefill 3 at 0 (all logits)
  const Seq b{{9, 8, 7, 6, 5}, {20, 21}};           // decode at 4, dense
  const Seq c{{4, 4, 4, 4, 4, 4}, {30, 31}};        // decode at 5, quest
  const Seq d{{3, 3, 3, 3, 3, 3, 3, 3}, {5, 6, 7}}; // decode at 7, dense
  const std::vector<DeviceSeq> batch = {In(a, 0, 3, true), In(b, 4, 1), In(c, 5, 1, false, quest),
                                        In(d, 7, 1)};
  StepPlan p;
  std::string err;
  ASSERT_TRUE(PlanStep(batch, Limits(), &p, &err)) << err;
  EXPECT_EQ(p.n_seq, 4);
  EXPECT_EQ(p.nd, 3);
  EXPECT_EQ(p.rows, 6);
  EXPECT_EQ(p.order, (std::vector<int>{1, 3, 2, 0}));  // dense group (b, d), quest group (c), a
  ASSERT_EQ(p.groups.size(), 2u);
  EXPECT_EQ(p.groups[0].begin, 0);
  EXPECT_EQ(p.groups[0].size, 2);
  EXPECT_FALSE(p.groups[0].att.quest);
  EXPECT_EQ(p.groups[1].begin, 2);
  EXPECT_EQ(p.groups[1].size, 1);
  EXPECT_TRUE(p.groups[1].att.quest);
  EXPECT_EQ(p.ids, (std::vector<int32_t>{5, 3, 4, 1, 2, 3}));
  EXPECT_EQ(p.positions, (std::vector<int32_t>{4, 7, 5, 0, 1, 2}));
  EXPECT_EQ(p.new_indptr, (std::vector<int32_t>{0, 1, 2, 3, 6}));
  EXPECT_EQ(p.seq_lens, (std::vector<int32_t>{5, 8, 6, 3}));
  EXPECT_EQ(p.page_indptr, (std::vector<int32_t>{0, 4, 8, 12, 16}));
  EXPECT_EQ(p.page_indices, (std::vector<int32_t>{20, 21, 0, 0, 5, 6, 0, 0, 30, 31, 0, 0,
                                                  10, 0, 0, 0}));
  EXPECT_EQ(p.q_indptr, (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(p.max_new, 3);
  EXPECT_EQ(p.max_q_prefill, 3);
  // a's three rows (3, 4, 5), then b (row 0), c (row 2), d (row 1): batch order.
  EXPECT_EQ(p.logit_rows, (std::vector<int32_t>{3, 4, 5, 0, 2, 1}));
  EXPECT_TRUE(p.hidden_spans.empty());
  // Embeddings: the rows of the sequences that ask, in batch order (a, then d), as (first, n).
  std::vector<DeviceSeq> embed = batch;
  embed[0].hidden = embed[3].hidden = true;
  ASSERT_TRUE(PlanStep(embed, Limits(), &p, &err)) << err;
  EXPECT_EQ(p.hidden_spans, (std::vector<int32_t>{3, 3, 1, 1}));
  embed[0].hidden_last = true;  // a's last row only
  ASSERT_TRUE(PlanStep(embed, Limits(), &p, &err)) << err;
  EXPECT_EQ(p.hidden_spans, (std::vector<int32_t>{5, 1, 1, 1}));
  ASSERT_TRUE(PlanStep(batch, Limits(), &p, &err)) << err;
  // Pages appended to: a's 10; b's 21 (position 4); c's 31 (5); d's 6 (7).
  EXPECT_EQ(p.written, (std::vector<int32_t>{21, 6, 31, 10}));
  EXPECT_EQ(p.tables[1], (std::vector<int32_t>{5, 6}));  // d uses 2 of its 3 pages
}

TEST(StepPlanTest, PrefillChunkSpanningPages) {
  const Seq a{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {3, 1, 4}};
  StepPlan p;
  std::string err;
  ASSERT_TRUE(PlanStep({In(a, 2, 7)}, Limits(), &p, &err)) << err;  // positions 2..8
  EXPECT_EQ(p.nd, 0);
  EXPECT_TRUE(p.groups.empty());
  EXPECT_EQ(p.seq_lens, (std::vector<int32_t>{9}));
  EXPECT_EQ(p.written, (std::vector<int32_t>{3, 1, 4}));
  EXPECT_EQ(p.logit_rows, (std::vector<int32_t>{6}));
  EXPECT_EQ(p.q_indptr, (std::vector<int32_t>{0, 7}));
}

// LoRA: a decode group's sequences of one adapter sit together (first-seen order of adapters,
// batch order within one), and rows sharing an adapter form one run; base rows (0) break runs.
TEST(StepPlanTest, LoraRunsGroupDecodeRowsByAdapter) {
  const Seq s{{1, 2, 3, 4, 5, 6, 7, 8}, {0, 1}};
  std::vector<DeviceSeq> batch;
  for (int lora : {2, 0, 1, 2}) {  // four decode sequences, one group
    batch.push_back(In(s, 4, 1));
    batch.back().lora = lora;
  }
  StepLimits lim = Limits();
  lim.max_batch = 8;
  batch.push_back(In(s, 0, 3));  // a prefill of adapter 2 after the decode rows
  batch.back().lora = 2;
  batch.push_back(In(s, 0, 2));  // and one of adapter 1
  batch.back().lora = 1;
  StepPlan p;
  std::string err;
  ASSERT_TRUE(PlanStep(batch, lim, &p, &err)) << err;
  EXPECT_EQ(p.order, (std::vector<int>{0, 3, 1, 2, 4, 5}));
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_EQ(p.groups[0].size, 4);
  // Rows: 0-1 adapter 2 (decodes), 2 base, 3 adapter 1, 4-6 adapter 2 (prefill), 7-8 adapter 1.
  EXPECT_EQ(p.lora_runs, (std::vector<LoraRun>{{2, 0, 2}, {1, 3, 1}, {2, 4, 3}, {1, 7, 2}}));
  // Logits still come back in batch order.
  EXPECT_EQ(p.logit_rows, (std::vector<int32_t>{0, 2, 3, 1, 6, 8}));
  // Two decode groups: each keeps its own rows, and adjacent rows of one adapter still merge.
  std::vector<DeviceSeq> split = {In(s, 4, 1), In(s, 4, 1), In(s, 4, 1)};
  split[0].lora = split[2].lora = 3;
  DeviceAttention quest;
  quest.quest = true;
  quest.budget_pages = 1;
  split[1].attention = quest;  // its own group, between the two
  ASSERT_TRUE(PlanStep(split, lim, &p, &err)) << err;
  EXPECT_EQ(p.order, (std::vector<int>{0, 2, 1}));
  EXPECT_EQ(p.lora_runs, (std::vector<LoraRun>{{3, 0, 2}}));
  split[1].attention = DeviceAttention();
  split[1].lora = 0;
  ASSERT_TRUE(PlanStep(split, lim, &p, &err)) << err;
  EXPECT_EQ(p.order, (std::vector<int>{0, 2, 1}));  // adapter 3 first-seen, then the base
  EXPECT_EQ(p.lora_runs, (std::vector<LoraRun>{{3, 0, 2}}));
}

TEST(StepPlanTest, BadBatchesAreRefusedNamingTheProblem) {
  StepPlan p;
  std::string err;
  const Seq a{{1, 2, 3, 4, 5}, {0, 1}};
  Seq bad_tok = a;
  bad_tok.tokens[1] = 100;
  EXPECT_FALSE(PlanStep({In(bad_tok, 0, 3)}, Limits(), &p, &err));
  EXPECT_NE(err.find("token id 100"), std::string::npos) << err;
  const Seq short_table{{1, 2, 3, 4, 5}, {0}};
  EXPECT_FALSE(PlanStep({In(short_table, 0, 5)}, Limits(), &p, &err));
  EXPECT_NE(err.find("page table"), std::string::npos) << err;
  const Seq bad_page{{1, 2}, {32}};
  EXPECT_FALSE(PlanStep({In(bad_page, 0, 2)}, Limits(), &p, &err));
  EXPECT_NE(err.find("page id 32"), std::string::npos) << err;
  const Seq long_seq{std::vector<int32_t>(17, 1), {0, 1, 2, 3, 4}};
  EXPECT_FALSE(PlanStep({In(long_seq, 0, 17)}, Limits(), &p, &err));  // 5 pages > 4
  EXPECT_NE(err.find("max_pages_per_seq"), std::string::npos) << err;
  EXPECT_FALSE(PlanStep({In(a, 0, 0)}, Limits(), &p, &err));
  EXPECT_NE(err.find("no new tokens"), std::string::npos) << err;
  DeviceAttention zero;
  zero.quest = true;
  zero.budget_pages = 0;
  EXPECT_FALSE(PlanStep({In(a, 4, 1, false, zero)}, Limits(), &p, &err));
  EXPECT_NE(err.find("budget_pages"), std::string::npos) << err;
  DeviceSeq negative = In(a, 0, 2);
  negative.lora = -1;
  EXPECT_FALSE(PlanStep({negative}, Limits(), &p, &err));
  EXPECT_NE(err.find("LoRA adapter id -1"), std::string::npos) << err;
  EXPECT_FALSE(PlanStep({In(a, 0, 1), In(a, 0, 1), In(a, 0, 1), In(a, 0, 1), In(a, 0, 1)},
                        Limits(), &p, &err));
  EXPECT_NE(err.find("max_batch"), std::string::npos) << err;
  StepLimits few = Limits();
  few.max_tokens = 4;
  EXPECT_FALSE(PlanStep({In(a, 0, 5)}, few, &p, &err));
  EXPECT_NE(err.find("max_tokens"), std::string::npos) << err;
}

}  // namespace
}  // namespace tinyserve::cuda
