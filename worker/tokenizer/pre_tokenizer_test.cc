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

TEST(PreTokenizer, Llama3GroupsDigitsByThreeQwen2ByOne) {
  EXPECT_THAT(Split("Hello world! 1234567", PreTokenizerKind::kLlama3),
              ElementsAre("Hello", " world", "!", " ", "123", "456", "7"));
  EXPECT_THAT(Split("Hello world! 1234567", PreTokenizerKind::kQwen2),
              ElementsAre("Hello", " world", "!", " ", "1", "2", "3", "4", "5", "6", "7"));
}

TEST(PreTokenizer, Llama3Rules) {
  // Contractions case-insensitively; any one non-letter, non-digit, non-newline character
  // (not only a space) joins the letters after it; punctuation takes the newlines after it;
  // a whitespace run ends at its last newline.
  EXPECT_THAT(Split("I'M we'RE", PreTokenizerKind::kLlama3), ElementsAre("I", "'M", " we", "'RE"));
  EXPECT_THAT(Split("(hello) \tworld", PreTokenizerKind::kLlama3),
              ElementsAre("(hello", ")", " ", "\tworld"));
  EXPECT_THAT(Split("end.\n\nNext", PreTokenizerKind::kLlama3),
              ElementsAre("end", ".\n\n", "Next"));
  EXPECT_THAT(Split("a  \n \n  b", PreTokenizerKind::kLlama3),
              ElementsAre("a", "  \n \n", " ", " b"));
  EXPECT_THAT(Split("x\n", PreTokenizerKind::kQwen2), ElementsAre("x", "\n"));
}

TEST(PreTokenizer, NamesFromGguf) {
  EXPECT_EQ(*PreTokenizerFromName(""), PreTokenizerKind::kGpt2);
  EXPECT_EQ(*PreTokenizerFromName("gpt-2"), PreTokenizerKind::kGpt2);
  EXPECT_EQ(*PreTokenizerFromName("smollm"), PreTokenizerKind::kSmollm);
  EXPECT_EQ(*PreTokenizerFromName("llama-bpe"), PreTokenizerKind::kLlama3);
  EXPECT_EQ(*PreTokenizerFromName("qwen2"), PreTokenizerKind::kQwen2);
  absl::StatusOr<PreTokenizerKind> bad = PreTokenizerFromName("deepseek-coder");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("'deepseek-coder'"));
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("tokenizer.ggml.pre"));
}

TEST(PreTokenizer, PiecesCoverTheInput) {
  const std::string text = "Ünïcödé 日本語 😀👍🏽 \t\n x\u00a0y 12ab3 ''";
  for (auto kind : {PreTokenizerKind::kGpt2, PreTokenizerKind::kSmollm, PreTokenizerKind::kLlama3,
                    PreTokenizerKind::kQwen2}) {
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
