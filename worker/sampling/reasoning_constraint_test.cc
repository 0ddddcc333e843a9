// The reasoning constraint (reasoning_constraint.h): a free <think> block and a structured answer
// after it; the budget's forced close; a block the model closes itself, in pieces too; an
// answer without thinking; UTF-8 characters left whole.
#include "worker/sampling/reasoning_constraint.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tinyserve {
namespace {

using State = ReasoningConstraint::State;

// Tokens: 0 "<think>", 1 "a", 2 " b", 3 "\n", 4 "</think>", 5 "\n\n", 6 "é"'s first byte,
// 7 its second byte, 8 "</", 9 "think>", 10 end of text, 11 "  ", 12 "{", 13 "}", 14 "<",
// 15 "<|im_start|>" (a special token).
constexpr int kVocab = 16;
std::shared_ptr<const TokenTable> Table() {
  auto t = std::make_shared<TokenTable>();
  t->bytes = {"<think>", "a",      " b", "\n", "</think>", "\n\n", "\xC3", "\xA9",
              "</",      "think>", "",   "  ", "{",        "}",    "<",    "<|im_start|>"};
  t->kind.assign(t->bytes.size(), TokenTable::kNormal);
  t->kind[10] = TokenTable::kEnd;
  t->kind[15] = TokenTable::kSpecial;
  t->Index();
  return t;
}
const std::vector<int32_t> kForced = {3, 4};  // "\n</think>"

ReasoningConstraint Make(bool open, std::optional<int> budget, bool json = false) {
  auto table = Table();
  std::unique_ptr<TokenConstraint> inner;
  if (json) inner = std::make_unique<JsonObjectConstraint>(table, JsonRecognizer(true, false));
  return ReasoningConstraint(table, open ? State::kCounting : State::kIdle, budget, kForced,
                             std::move(inner));
}

std::vector<uint8_t> Allowed(const ReasoningConstraint& c) {
  std::vector<uint8_t> a;
  c.AllowedTokens(kVocab, &a);
  return a;
}

std::vector<uint8_t> Only(std::vector<int> ids) {
  std::vector<uint8_t> a(kVocab, 0);
  for (int id : ids) a[id] = 1;
  return a;
}

TEST(ReasoningConstraint, ClosesTheBlockAfterTheBudget) {
  ReasoningConstraint c = Make(/*open=*/false, 3);
  EXPECT_EQ(c.state(), State::kIdle);
  c.Accept(11);  // leading whitespace: still undecided
  EXPECT_EQ(c.state(), State::kIdle);
  c.Accept(0);  // <think>
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
    EXPECT_EQ(Allowed(c), Only({want}));
    c.Accept(want);
  }
  EXPECT_EQ(c.state(), State::kDone);
  EXPECT_EQ(Allowed(c), std::vector<uint8_t>(kVocab, 1));
}

TEST(ReasoningConstraint, TheModelClosingTheBlockEndsIt) {
  // Also when "</think>" comes in pieces; without a budget the block is never forced shut.
  for (std::optional<int> budget : {std::optional<int>(4), std::optional<int>()}) {
    ReasoningConstraint c = Make(/*open=*/true, budget);
    EXPECT_EQ(c.state(), State::kCounting);
    c.Accept(1);
    c.Accept(8);  // "</"
    c.Accept(9);  // "think>"
    EXPECT_EQ(c.state(), State::kDone);
  }
  ReasoningConstraint unbounded = Make(/*open=*/true, std::nullopt);
  for (int i = 0; i < 100; ++i) unbounded.Accept(1);
  EXPECT_EQ(unbounded.state(), State::kCounting);
}

TEST(ReasoningConstraint, AnAnswerWithoutThinkingIsLeftAlone) {
  ReasoningConstraint c = Make(/*open=*/false, 1);
  c.Accept(14);  // "<": the opening must be one token's text
  EXPECT_EQ(c.state(), State::kDone);
  ReasoningConstraint d = Make(/*open=*/false, 1);
  d.Accept(1);
  EXPECT_EQ(d.state(), State::kDone);
  for (int i = 0; i < 5; ++i) d.Accept(1);
  EXPECT_EQ(d.state(), State::kDone);
}

TEST(ReasoningConstraint, ZeroClosesAtOnceAndCharactersStayWhole) {
  ReasoningConstraint open = Make(/*open=*/true, 0);
  EXPECT_EQ(open.state(), State::kForcing);
  EXPECT_TRUE(open.Allows(3));
  EXPECT_FALSE(open.Allows(1));
  ReasoningConstraint later = Make(/*open=*/false, 0);
  later.Accept(0);
  EXPECT_EQ(later.state(), State::kForcing);
  // The budget ends on the first byte of a two-byte character: its second byte may follow.
  ReasoningConstraint utf8 = Make(/*open=*/true, 2);
  utf8.Accept(1);
  utf8.Accept(6);
  EXPECT_EQ(utf8.state(), State::kCounting);
  utf8.Accept(7);
  EXPECT_EQ(utf8.state(), State::kForcing);
}

TEST(ReasoningConstraint, AStructuredAnswerFollowsTheFreeBlock) {
  // qwen3's format: before the block, the opening or the answer's first token; inside, any
  // text; after it, only what the JSON object allows.
  ReasoningConstraint c = Make(/*open=*/false, std::nullopt, /*json=*/true);
  EXPECT_EQ(Allowed(c), Only({0, 3, 5, 11, 12}));  // <think>, whitespace, "{"
  EXPECT_FALSE(c.Allows(1));
  c.Accept(0);
  std::vector<uint8_t> all_but_end(kVocab, 1);
  all_but_end[10] = 0;  // the answer must come
  EXPECT_EQ(Allowed(c), all_but_end);
  c.Accept(1);
  c.Accept(4);  // </think>
  ASSERT_EQ(c.state(), State::kDone);
  EXPECT_FALSE(c.Allows(1));
  EXPECT_FALSE(c.Allows(10));  // not before the object
  c.Accept(12);
  c.Accept(13);
  EXPECT_TRUE(c.Allows(10));
  // An answer without the block is held from its first token.
  ReasoningConstraint direct = Make(/*open=*/false, std::nullopt, /*json=*/true);
  direct.Accept(12);
  EXPECT_EQ(direct.state(), State::kDone);
  EXPECT_FALSE(direct.Allows(0));
  EXPECT_TRUE(direct.Allows(13));
  // With a budget, the forced close leads to the structured answer too.
  ReasoningConstraint forced = Make(/*open=*/true, 1, /*json=*/true);
  forced.Accept(1);
  for (int32_t id : kForced) forced.Accept(id);
  ASSERT_EQ(forced.state(), State::kDone);
  EXPECT_EQ(Allowed(forced), Only({3, 5, 11, 12}));
  // Inside the block the model may not stop when an answer is to follow; without one it may.
  ReasoningConstraint inside = Make(/*open=*/true, std::nullopt, /*json=*/true);
  EXPECT_FALSE(inside.Allows(10));
  EXPECT_EQ(Allowed(inside)[10], 0);
  EXPECT_EQ(Allowed(inside)[1], 1);
  EXPECT_TRUE(Make(/*open=*/true, std::nullopt).Allows(10));
}

TEST(ReasoningConstraint, ThePromptSaysWhereTheBlockStands) {
  EXPECT_EQ(ReasoningConstraint::StartOf("<|im_start|>assistant\n", "qwen3"), State::kIdle);
  EXPECT_EQ(ReasoningConstraint::StartOf("<|im_start|>assistant\n", "deepseek_r1"),
            State::kCounting);
  // A template that opened the block, and one that wrote an empty one (thinking off).
  EXPECT_EQ(ReasoningConstraint::StartOf("assistant\n<think>\n", "qwen3"), State::kCounting);
  EXPECT_EQ(ReasoningConstraint::StartOf("<think>\n\n</think>\n\n", "deepseek_r1"), State::kDone);
  // A reply continued past its closed block is in the answer.
  EXPECT_EQ(ReasoningConstraint::StartOf("<think>x</think>The", "qwen3"), State::kDone);
  // The prompt is read from its last special token (the assistant header) on: a user's
  // "<think>" or an earlier turn's block before it does not count; the think tags do not stop it.
  const auto table = Table();
  auto of = [&](std::vector<int32_t> prompt, const char* format) {
    return ReasoningConstraint::StartOfPrompt(*table, prompt, format);
  };
  EXPECT_EQ(of({1, 0, 15, 1}, "qwen3"), State::kIdle);
  EXPECT_EQ(of({0, 4, 15, 1}, "deepseek_r1"), State::kCounting);
  EXPECT_EQ(of({15, 1, 0, 3}, "qwen3"), State::kCounting);
  EXPECT_EQ(of({15, 0, 3, 4, 5}, "deepseek_r1"), State::kDone);
  EXPECT_EQ(of({}, "qwen3"), State::kIdle);
  ReasoningConstraint off(Table(), State::kDone, 2, kForced, nullptr);
  for (int i = 0; i < 5; ++i) off.Accept(1);
  EXPECT_EQ(off.state(), State::kDone);
}

TEST(ReasoningConstraint, AnotherTokenWhileForcingStartsTheCloseOver) {
  ReasoningConstraint c = Make(/*open=*/true, 0);
  c.Accept(3);
  c.Accept(1);  // replayed output that was not forced
  EXPECT_EQ(c.state(), State::kForcing);
  EXPECT_TRUE(c.Allows(3));
  for (int32_t id : kForced) c.Accept(id);
  EXPECT_EQ(c.state(), State::kDone);
}

}  // namespace
}  // namespace tinyserve
