// The thinking budget (thinking_budget.h): counting inside the <think> block, the forced close,
// a block the model closes itself, an answer without thinking, UTF-8 characters left whole.
#include "worker/sampling/thinking_budget.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tinyserve {
namespace {

using State = ThinkingBudgetConstraint::State;

// Tokens: 0 "<think>", 1 "a", 2 " b", 3 "\n", 4 "</think>", 5 "\n\n", 6 "é"'s first byte,
// 7 its second byte, 8 "</", 9 "think>", 10 end of text, 11 "  ".
std::shared_ptr<const TokenTable> Table() {
  auto t = std::make_shared<TokenTable>();
  t->bytes = {"<think>", "a",    " b", "\n",     "</think>", "\n\n",
              "\xC3",    "\xA9", "</", "think>", "",         "  "};
  t->kind.assign(t->bytes.size(), TokenTable::kNormal);
  t->kind[10] = TokenTable::kEnd;
  t->Index();
  return t;
}
const std::vector<int32_t> kForced = {3, 4, 5};  // "\n</think>\n\n"

std::vector<uint8_t> Allowed(const ThinkingBudgetConstraint& c) {
  std::vector<uint8_t> a;
  c.AllowedTokens(12, &a);
  return a;
}

TEST(ThinkingBudget, ClosesTheBlockAfterTheBudget) {
  ThinkingBudgetConstraint c(Table(), /*open=*/false, /*budget=*/3, kForced);
  EXPECT_EQ(c.state(), State::kIdle);
  c.Accept(11);  // leading whitespace: still undecided
  c.Accept(0);   // <think>
  EXPECT_EQ(c.state(), State::kCounting);
  for (int32_t id : {1, 2}) {
    EXPECT_TRUE(c.Allows(10));  // the model may still stop
    c.Accept(id);
    EXPECT_EQ(c.state(), State::kCounting);
  }
  c.Accept(1);  // the third token inside: the budget is spent
  ASSERT_EQ(c.state(), State::kForcing);
  for (int32_t want : kForced) {
    EXPECT_FALSE(c.Allows(1));
    EXPECT_FALSE(c.Allows(10));  // no end of text before the block is closed
    EXPECT_TRUE(c.Allows(want));
    std::vector<uint8_t> a = Allowed(c);
    std::vector<uint8_t> only(12, 0);
    only[want] = 1;
    EXPECT_EQ(a, only);
    c.Accept(want);
  }
  EXPECT_EQ(c.state(), State::kDone);
  EXPECT_EQ(Allowed(c), std::vector<uint8_t>(12, 1));
}

TEST(ThinkingBudget, TheModelClosingTheBlockEndsIt) {
  // Also when "</think>" comes in pieces.
  ThinkingBudgetConstraint c(Table(), /*open=*/true, /*budget=*/4, kForced);
  EXPECT_EQ(c.state(), State::kCounting);
  c.Accept(1);
  c.Accept(8);  // "</"
  c.Accept(9);  // "think>"
  EXPECT_EQ(c.state(), State::kDone);
  for (int i = 0; i < 10; ++i) c.Accept(1);
  EXPECT_EQ(c.state(), State::kDone);
}

TEST(ThinkingBudget, AnAnswerWithoutThinkingIsLeftAlone) {
  ThinkingBudgetConstraint c(Table(), /*open=*/false, /*budget=*/1, kForced);
  c.Accept(8);  // "</" is not how "<think>" begins
  EXPECT_EQ(c.state(), State::kDone);
  ThinkingBudgetConstraint d(Table(), /*open=*/false, /*budget=*/1, kForced);
  d.Accept(1);
  EXPECT_EQ(d.state(), State::kDone);
}

TEST(ThinkingBudget, ZeroClosesAtOnceAndCharactersStayWhole) {
  ThinkingBudgetConstraint open(Table(), /*open=*/true, /*budget=*/0, kForced);
  EXPECT_EQ(open.state(), State::kForcing);
  EXPECT_TRUE(open.Allows(3));
  EXPECT_FALSE(open.Allows(1));
  ThinkingBudgetConstraint later(Table(), /*open=*/false, /*budget=*/0, kForced);
  later.Accept(0);
  EXPECT_EQ(later.state(), State::kForcing);
  // The budget ends on the first byte of a two-byte character: its second byte may follow.
  ThinkingBudgetConstraint utf8(Table(), /*open=*/true, /*budget=*/2, kForced);
  utf8.Accept(1);
  utf8.Accept(6);
  EXPECT_EQ(utf8.state(), State::kCounting);
  utf8.Accept(7);
  EXPECT_EQ(utf8.state(), State::kForcing);
}

}  // namespace
}  // namespace tinyserve
