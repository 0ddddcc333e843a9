// File: worker/tokenizer/pre_tokenizer_test.cc
#include "worker/tokenizer/pre_tokenizer.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tinyserve {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Split(std::string_view text, PreTokenizerKind kind) {
  std::vector<std::string> out;
  for (std::string_view p : PreTokenize(text, kind)) out.emplace_back(p);
  return out;
}

TEST(PreTokenizer, Gpt2SpecExample) {
  EXPECT_THAT(Split("Hello world! 123", PreTokenizerKind::kGpt2),
              ElementsAre("Hello", " world", "!", " 123"));
}

TEST(PreTokenizer, SmollmSplitsDigits) {
  // model-formats.md §6.1.
  EXPECT_THAT(Split("Hello world! 123", PreTokenizerKind::kSmollm),
              ElementsAre("Hello", " world", "!", " ", "1", "2", "3"));
}

TEST(PreTokenizer, SpaceRuns) {
  EXPECT_THAT(Split("  multiple   spaces", PreTokenizerKind::kGpt2),
              ElementsAre(" ", " multiple", "  ", " spaces"));
  // Trailing whitespace at the end of the text is one piece.
  EXPECT_THAT(Split("end   ", PreTokenizerKind::kGpt2), ElementsAre("end", "   "));
  EXPECT_THAT(Split("a\n\nb", PreTokenizerKind::kGpt2), ElementsAre("a", "\n", "\n", "b"));
}

TEST(PreTokenizer, ContractionsAreCaseSensitive) {
  EXPECT_THAT(Split("don't I'M we're", PreTokenizerKind::kGpt2),
              ElementsAre("don", "'t", " I", "'", "M", " we", "'re"));
}

TEST(PreTokenizer, PiecesCoverTheInput) {
  const std::string text = "Ünïcödé 日本語 😀👍🏽 \t\n x\u00a0y 12ab3 ''";
  for (auto kind : {PreTokenizerKind::kGpt2, PreTokenizerKind::kSmollm}) {
    std::string joined;
    for (std::string_view p : PreTokenize(text, kind)) {
      EXPECT_FALSE(p.empty());
      joined.append(p);
    }
    EXPECT_EQ(joined, text);
  }
  EXPECT_TRUE(PreTokenize("", PreTokenizerKind::kGpt2).empty());
}

}  // namespace
}  // namespace tinyserve
