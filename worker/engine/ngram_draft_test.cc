#include "worker/engine/ngram_draft.h"

#include <vector>

#include "gtest/gtest.h"

namespace tinyserve {
namespace {

std::vector<int32_t> Draft(const std::vector<int32_t>& t, int min_n, int max_n, int k) {
  std::vector<int32_t> out = {99};  // cleared by the call
  NgramDraft(t.data(), static_cast<int64_t>(t.size()), min_n, max_n, k, &out);
  return out;
}

TEST(NgramDraft, ProposesWhatFollowedTheMostRecentMatch) {
  // Tail (2, 3) occurs at 1 (followed by 4 5 6) and at 6 (followed by 7 8): the later one wins.
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 2, 3, 7, 8, 2, 3};
  EXPECT_EQ(Draft(t, 2, 2, 4), (std::vector<int32_t>{7, 8, 2, 3}));
  EXPECT_EQ(Draft(t, 2, 2, 1), (std::vector<int32_t>{7}));
}

TEST(NgramDraft, LongerNgramsComeFirstAndTheDraftStopsAtTheEnd) {
  // n = 3 (1 2 3) matches at 0, followed by 9; n = 2 (2 3) would match later at 5 (followed by 4).
  const std::vector<int32_t> t = {1, 2, 3, 9, 0, 2, 3, 4, 1, 2, 3};
  EXPECT_EQ(Draft(t, 1, 3, 2), (std::vector<int32_t>{9, 0}));
  EXPECT_EQ(Draft(t, 1, 2, 2), (std::vector<int32_t>{4, 1}));
  // A match right before the tail proposes only what exists: 5 5 5 -> tail (5 5) at 0, then 5.
  EXPECT_EQ(Draft({5, 5, 5}, 2, 2, 8), (std::vector<int32_t>{5}));
}

TEST(NgramDraft, NoMatchOrNoRoomGivesNothing) {
  EXPECT_TRUE(Draft({1, 2, 3, 4}, 1, 3, 4).empty());
  EXPECT_TRUE(Draft({7}, 1, 3, 4).empty());
  EXPECT_TRUE(Draft({}, 1, 3, 4).empty());
  EXPECT_TRUE(Draft({1, 2, 1, 2}, 1, 3, 0).empty());
  // min_n above every match: 1 occurs twice, but only as a 1-gram.
  EXPECT_TRUE(Draft({1, 5, 6, 1}, 2, 3, 4).empty());
  EXPECT_EQ(Draft({1, 5, 6, 1}, 1, 3, 4), (std::vector<int32_t>{5, 6, 1}));
}

}  // namespace
}  // namespace tinyserve
