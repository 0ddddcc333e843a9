// The tiered KV cache's residency policy (page_residency.h), on the CPU.
#include "kernels/cuda/page_residency.h"

#include <gtest/gtest.h>

namespace tinyserve::cuda {
namespace {

TEST(PageResidencyTest, MissesThenHitsAndEachPageCopiedOnce) {
  PageResidency r(4);
  std::vector<PageResidency::Copy> copies;
  ASSERT_TRUE(r.Ensure({7, 3, 7, 3}, &copies));  // duplicates count once
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(r.totals().misses, 2);
  EXPECT_EQ(r.totals().hits, 0);
  EXPECT_NE(r.SlotOf(7), r.SlotOf(3));
  ASSERT_TRUE(r.Ensure({3, 7}, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(r.totals().hits, 2);
  EXPECT_EQ(r.resident(), 2);
}

TEST(PageResidencyTest, EvictsTheLeastRecentlyNeededPageNotNeededNow) {
  PageResidency r(3);
  std::vector<PageResidency::Copy> copies;
  ASSERT_TRUE(r.Ensure({1}, &copies));
  ASSERT_TRUE(r.Ensure({2}, &copies));
  ASSERT_TRUE(r.Ensure({3}, &copies));
  ASSERT_TRUE(r.Ensure({1}, &copies));  // 1 is now the most recent; 2 the least
  const int32_t slot2 = r.SlotOf(2);
  ASSERT_TRUE(r.Ensure({4, 3}, &copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].page, 4);
  EXPECT_EQ(copies[0].slot, slot2);
  EXPECT_EQ(r.SlotOf(2), -1);
  EXPECT_NE(r.SlotOf(1), -1);
  EXPECT_NE(r.SlotOf(3), -1);
}

TEST(PageResidencyTest, NeverEvictsAPageTheStepNeeds) {
  PageResidency r(2);
  std::vector<PageResidency::Copy> copies;
  ASSERT_TRUE(r.Ensure({1, 2}, &copies));
  ASSERT_TRUE(r.Ensure({2, 3}, &copies));  // must evict 1, not 2
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].page, 3);
  EXPECT_NE(r.SlotOf(2), -1);
  EXPECT_EQ(r.SlotOf(1), -1);
}

TEST(PageResidencyTest, OverCapacityChangesNothing) {
  PageResidency r(2);
  std::vector<PageResidency::Copy> copies;
  ASSERT_TRUE(r.Ensure({5}, &copies));
  EXPECT_FALSE(r.Ensure({1, 2, 3}, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(r.totals().over_capacity, 1);
  EXPECT_EQ(r.resident(), 1);
  EXPECT_NE(r.SlotOf(5), -1);
}

TEST(PageResidencyTest, InvalidatedPagesAreCopiedAgain) {
  PageResidency r(4);
  std::vector<PageResidency::Copy> copies;
  ASSERT_TRUE(r.Ensure({1, 2}, &copies));
  r.Invalidate({2, 9});  // 9 was never resident
  EXPECT_EQ(r.SlotOf(2), -1);
  ASSERT_TRUE(r.Ensure({1, 2}, &copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].page, 2);
  EXPECT_EQ(r.totals().misses, 3);
  EXPECT_EQ(r.totals().hits, 1);
}

TEST(PageResidencyTest, ZeroCapacityRefusesEverything) {
  PageResidency r(0);
  std::vector<PageResidency::Copy> copies;
  EXPECT_TRUE(r.Ensure({}, &copies));
  EXPECT_FALSE(r.Ensure({1}, &copies));
}

}  // namespace
}  // namespace tinyserve::cuda
